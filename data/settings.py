"""The settings of ``ratune data build`` (one definition per option: its flag, a sweep file's and the
demo's ``data:`` keys and the command a sweep runs derive from :data:`BUILD_OPTIONS`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ratune.args import input_dir, registered
from ratune.config import BM25BackendName, Count, MaxLength, check_fields
from ratune.data.labels import ANSWER_TOKENIZATIONS
from ratune.options import Option
from ratune.registry import BM25_BACKENDS, DEFAULT_BM25_BACKEND, RETRIEVED_MODES, RETRIEVERS
from ratune.sources.formats import ANSWER_FORMATS
from ratune.sources.validate import HOLDOUT_OPTIONS, HoldoutSettings

# The train-time modes are ratune/registry.py TRAIN_MODES (Gorilla trains with none or oracle;
# the retrieved ones are ours).


@dataclass(frozen=True)
class BuildSettings(HoldoutSettings):
    """Settings that change the built rows (all recorded in the manifest).

    Attributes:
        max_length: maximum tokens per row, prompt (chat template included) + answer + EOS.
            The paper uses 2048 (appendix).
        max_document_tokens: budget per document before the length check; None = no budget.
        top_k: documents per prompt for the retrieved modes (the paper uses top-1).
        force_gold: in training rows of RETRIEVED_MODES, the gold document replaces the
            lowest-ranked one where the retriever missed it (RAFT-style; counted ``forced_gold``).
        dense_model: the finetuned retriever folder of ``dense_ft`` (mode or top1 component).
        bm25_backend: ``rank_bm25`` or ``bm25s`` (the same rows).
        validation_fraction, validation_by, validation_seed: the ``validation`` split held out of
            the training examples (never trained on; :class:`~ratune.sources.validate.HoldoutSettings`).
        answer_tokenization: one of :data:`ratune.data.labels.ANSWER_TOKENIZATIONS`.
        answer_format: one of :data:`ratune.sources.formats.ANSWER_FORMATS`; None: the hub's own.
        same_examples: every mode keeps only the examples that all modes kept (the arms of an
            experiment train on the same examples; counted ``dropped_elsewhere``).
    """

    max_length: MaxLength = 2048
    max_document_tokens: Count | None = None
    top_k: Count = 1
    force_gold: bool = False
    dense_model: str | None = None
    bm25_backend: BM25BackendName = DEFAULT_BM25_BACKEND
    answer_tokenization: Literal[ANSWER_TOKENIZATIONS] = ANSWER_TOKENIZATIONS[0]
    answer_format: str | None = None
    same_examples: bool = False

    def __post_init__(self):
        check_fields(self)  # the bounds of the annotations, before any work starts


#: The modes that need a finetuned retriever folder (``--dense-model``).
_FINETUNED = " ".join(r.name for r in RETRIEVERS.values() if r.needs_model)

#: Every option of :class:`BuildSettings`, in the order a sweep writes them (ratune/options.py).
BUILD_OPTIONS: tuple[Option, ...] = (
    Option("max_length", "--max-length", command="always", help="tokens per row: prompt, answer and EOS (the paper uses 2048)"),
    Option("max_document_tokens", "--max-document-tokens", help="document budget in tokens"),
    Option("top_k", "--top-k", command="always", help="documents per prompt for the retrieved modes"),
    Option("dense_model", "--dense-model", cli={"metavar": "DIR", "type": input_dir},
           help=f"finetuned retriever folder (`ratune retrieval train`) for the {_FINETUNED} mode / top1 retriever"),
    Option("bm25_backend", "--bm25-backend", cli=registered("BM25 backend", BM25_BACKENDS),
           help="BM25 implementation (same rankings; bm25s is faster)"),
    *HOLDOUT_OPTIONS,
    Option("answer_tokenization", "--answer-tokenization",
           help="in_context: the answer tokenized behind the prompt's text (default); separate: tokenized apart and "
                "its ids put behind the prompt's (TRL's way), for a tokenizer whose merges cross the boundary"),
    Option("answer_format", "--answer-format", cli=registered("answer format", ANSWER_FORMATS),
           help="how prompts and answers are written (default: the hub's; a tool set takes python_calls or "
                "tool_calls, the chat template's own tool calling: docs/function_calling.md)"),
    Option("force_gold", "--force-gold",
           help=f"retrieved modes ({', '.join(RETRIEVED_MODES)}), train split: the gold document replaces the "
                "lowest-ranked one when the retriever missed it (counted as forced_gold)"),
    Option("same_examples", "--same-examples",
           help="every mode (and mixture) keeps only the examples that all of them kept after the over-length "
                "policy, so that arms train on the same examples (counted as dropped_elsewhere)"),
)
