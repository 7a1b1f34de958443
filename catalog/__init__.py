"""API catalogs of your own as hubs: import, instruction pairs and scoring (docs/catalogs.md)."""
