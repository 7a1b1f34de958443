"""API catalogs of your own as hubs (docs/catalogs.md).

``schema`` (the catalog folder format, :func:`~ratune.catalog.schema.load_catalog`), the three
sources ``jsonl``, ``openapi`` and ``pyapi``, and ``folder`` (``ratune catalog import``).
"""
