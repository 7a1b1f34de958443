"""ratune: retriever-aware training (RAT) of LLaMA-class models for API calling.

The import name ``ratune`` holds what every stage shares (CLI, config loading, run manifests,
atomic file I/O); the stages install as sub-packages: ``ratune.data``, ``ratune.retrieval``,
``ratune.train`` and ``ratune.eval``.
"""

__version__ = "0.1.0"
