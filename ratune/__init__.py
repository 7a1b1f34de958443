"""ratune: retriever-aware training (RAT) of LLaMA-class models for API calling; this package
holds what every stage shares, the stages install as sub-packages (docs/pipeline.md)."""

__version__ = "0.1.0"
