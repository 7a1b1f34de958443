"""``ratune export``: a training run as a safetensors model folder with its model card, pushed to the
Hugging Face hub when asked (docs/pipeline.md#export)."""
