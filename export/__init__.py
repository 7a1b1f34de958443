"""Export, the last stage (after eval and report): a training run's checkpoint as a merged
safetensors model folder with its model card (the Table 2 row from a report), pushed to the
Hugging Face hub when asked (``ratune export``): export/checkpoint.py reads the checkpoint and
writes the folder, merge.py loads the model, checks.py checks the vocabulary and the folder,
card.py writes the model card, push.py uploads."""
