"""Export, the last stage (after eval and report): a training run's checkpoint as a merged
safetensors model folder with its model card (the Table 2 row from a report), pushed to the
Hugging Face hub when asked. The code is in export/checkpoint.py (``ratune export``)."""
