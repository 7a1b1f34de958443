"""The eval stage's settings, defined once: :class:`EvalSettings` and :data:`EVAL_OPTIONS`, from
which ``ratune eval run``'s flags, a sweep file's ``eval:`` section and a sweep's eval commands are
derived (ratune/options.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from ratune.args import input_dir, registered
from ratune.config import BM25BackendName, Count, Seed, TestSettingName, Threads, check_fields
from ratune.sources.prompt import CHAT_TEMPLATE_NAMES
from ratune.sources.formats import ANSWER_FORMATS
from ratune.errors import RatuneError
from ratune.options import Option
from ratune.registry import (BM25_BACKENDS, CATALOG_DEFAULT_SETTINGS, DEFAULT_BM25_BACKEND, DEFAULT_SETTINGS, EVAL_SETTINGS,
                             RETRIEVERS, setting_retriever)

#: Generation backends: batched HF generate (default) and vLLM (optional extra, CUDA only).
BACKENDS = ("hf", "vllm")
#: Where the model generates: ``auto`` is ``cuda`` when torch sees a CUDA GPU, else ``cpu``.
DEVICES = ("auto", "cpu", "cuda")
#: The weights' dtype while generating: ``auto`` is ``bfloat16`` on CUDA and ``float32`` on CPU.
DTYPES = ("auto", "float32", "bfloat16", "float16")


#: The questions an eval asks: the hub's test questions, or those held out of the training data.
EVAL_SPLITS = ("eval", "validation")


@dataclass
class EvalSettings:
    """How a checkpoint is evaluated (each field's flag and help: :data:`EVAL_OPTIONS`).

    Attributes:
        settings: test-time settings to run (names of ratune/registry.py EVAL_SETTINGS).
        n_questions: evaluate the first N eval questions (None = all).
        max_document_tokens: document budget (None = read from the checkpoint's manifest).
        backend: ``hf`` (:mod:`ratune.eval.generate`) or ``vllm`` (:mod:`ratune.eval.vllm_backend`).
        chat_template: None = the one the checkpoint was trained with, else the tokenizer's own.
        answer_format: None = the checkpoint's training rows' (its run manifest), else the hub's own.
        split: :data:`EVAL_SPLITS`: ``eval``, the hub's test questions, or ``validation``, those held
            out of the checkpoint's training data (numbered 1..n in the data manifest's order).
        device, dtype: ``auto`` resolves by :func:`resolve_placement`.

    A non-default ``backend``, named ``chat_template``, non-``apibench`` ``answer_format`` and
    non-``eval`` ``split`` are recorded in each cell's identity, as are ``dense_model`` and the
    resolved device and dtype.
    """

    settings: Sequence[TestSettingName] = DEFAULT_SETTINGS
    n_questions: Count | None = None
    batch_size: Count = 8
    max_new_tokens: Count = 256
    stop_after_api_call: bool = False
    max_document_tokens: Count | None = None
    torch_threads: Threads | None = None
    backend: Literal[BACKENDS] = "hf"
    trust_remote_code: bool = False
    dense_model: str | None = None
    bm25_backend: BM25BackendName = DEFAULT_BM25_BACKEND
    chat_template: Literal[CHAT_TEMPLATE_NAMES] | None = None
    answer_format: Literal[tuple(ANSWER_FORMATS)] | None = None
    split: Literal[EVAL_SPLITS] = "eval"
    device: Literal[DEVICES] = "auto"
    dtype: Literal[DTYPES] = "auto"
    retriever_cache: dict = field(default_factory=dict)

    def __post_init__(self):
        check_fields(self)  # the bounds of ratune.config (Count, Threads), before any work starts


def needs_finetuned_retriever(setting: str) -> bool:
    """Whether a setting's retriever needs the finetuned retriever folder (``dense_model``)."""
    try:
        return RETRIEVERS[setting_retriever(setting)].needs_model
    except KeyError:  # swap, irrelevant: their own retrievers over the API database
        return False


#: The retrievers (and test settings) that need a finetuned retriever folder (``--dense-model``).
_FINETUNED = " ".join(r.name for r in RETRIEVERS.values() if r.needs_model)

#: Every eval option, in the order flags are listed and a sweep writes them (ratune/options.py).
#: ``settings``, ``batch_size`` and ``max_new_tokens`` are always written into a sweep's eval
#: command, the others when they are not the default.
EVAL_OPTIONS: tuple[Option, ...] = (
    Option("settings", "--settings", cli=registered("test setting", EVAL_SETTINGS),
           cli_default=None, command="always",
           help=f"retrieval settings (default {' '.join(DEFAULT_SETTINGS)}; on a catalog "
                f"{' '.join(CATALOG_DEFAULT_SETTINGS)}; {_FINETUNED} needs --dense-model) "
                "and/or experiments: swap, irrelevant, constraints_SETTING (docs/experiments.md)"),
    Option("n_questions", "--n-questions", help="the first N eval questions (default all)"),
    Option("batch_size", "--batch-size", command="always", help="prompts per generate call"),
    Option("max_new_tokens", "--max-new-tokens", command="always", help="generation limit (tokens)"),
    Option("stop_after_api_call", "--stop-after-api-call",
           help="stop generating once the api_call and api_provider fields are complete"),
    Option("max_document_tokens", "--max-document-tokens",
           help="document budget in tokens (default: the trained model's, from its data manifest)"),
    Option("torch_threads", "--threads", help="torch intra-op threads"),
    Option("backend", "--backend", help="hf: batched HF generate (CPU or GPU); vllm: optional extra, CUDA only"),
    Option("dense_model", "--dense-model", cli={"metavar": "DIR", "type": input_dir},
           help=f"finetuned retriever folder (`ratune retrieval train`) of the {_FINETUNED} settings"),
    Option("bm25_backend", "--bm25-backend", cli=registered("BM25 backend", BM25_BACKENDS), help="BM25 implementation (same rankings; bm25s is faster)"),
    Option("device", "--device", help="where to generate (default auto: cuda when torch sees a GPU, else cpu)"),
    Option("dtype", "--dtype",
           help="weights' dtype while generating (default auto: bfloat16 on cuda, float32 on cpu)"),
    Option("trust_remote_code", "--trust-remote-code", config=False,
           help="run the checkpoint's own modeling code (only for models trained with trust_remote_code)"),
    Option("chat_template", "--chat-template", config=False,
           help="prompt chat template (default: the one the checkpoint was trained with, from its run "
                "manifest; give it for a model trained elsewhere whose tokenizer has none)"),
    Option("split", "--split",
           help="eval: the hub's test questions (default); validation: the questions held out of the data the "
                "checkpoint was trained on (data build --validation-fraction), for choices made without the test "
                "questions"),
    Option("answer_format", "--answer-format", config=False,
           help="how prompts and answers are written (default: the checkpoint's training rows', from its run "
                "manifest, else the hub's; tool_calls for a model from elsewhere with tool calling)"),
)


@dataclass
class BfclSettings:
    """How ``ratune eval bfcl`` generates: each field means what the :class:`EvalSettings` field of
    its name means. ``max_new_tokens`` defaults to 256 (source: the shortest correct answers' lengths,
    docs/function_calling.md#the-prompt). ``full_answers``: no cut at the end of the call list.
    ``answer_format``: ``python_calls`` or ``tool_calls``; None: the checkpoint's training rows' when
    it is one of these, else ``python_calls``. ``shots`` rows of the tool set ``shots_from`` (drawn
    with ``shots_seed``) come before each question as worked examples.

    Raises:
        RatuneError: ``shots`` without ``shots_from`` or the other way round.
    """

    batch_size: Count = 8
    max_new_tokens: Count = 256
    torch_threads: Threads | None = None
    backend: Literal[BACKENDS] = "hf"
    device: Literal[DEVICES] = "auto"
    dtype: Literal[DTYPES] = "auto"
    trust_remote_code: bool = False
    chat_template: Literal[CHAT_TEMPLATE_NAMES] | None = None
    answer_format: Literal[tuple(ANSWER_FORMATS)] | None = None
    full_answers: bool = False
    shots: Count | None = None
    shots_from: str | None = None
    shots_seed: Seed = 0

    def __post_init__(self):
        check_fields(self)
        if (self.shots is None) != (self.shots_from is None):
            raise RatuneError("--shots N and --shots-from TOOLS_DIR go together: the worked examples are rows of "
                              "that tool set's training split")


#: The options of ``ratune eval bfcl``: ``ratune eval run``'s of the same names, flag and help, and its own.
BFCL_OPTIONS: tuple[Option, ...] = (
    *(o for o in EVAL_OPTIONS if o.field in BfclSettings.__dataclass_fields__),
    Option("full_answers", "--full-answers", config=False,
           help="generate past the end of the call list (to EOS or --max-new-tokens) and score the whole text, "
                "as BFCL's own generation does; slower (default: stop where the list closes)"),
    Option("shots", "--shots", help="worked examples before each question (python_calls; default none): "
                                    "rows of --shots-from that call a tool, each behind its own functions"),
    Option("shots_from", "--shots-from", cli={"metavar": "TOOLS_DIR", "type": input_dir},
           help="the tool set (ratune tools import) whose training rows the shots are drawn from"),
    Option("shots_seed", "--shots-seed", help="seed of the draw of shots"),
)

def resolve_placement(device: str = "auto", dtype: str = "auto", *, backend: str = "hf") -> tuple[str, str]:
    """The ``(device, dtype)`` an eval generates with: ``auto`` device is ``cuda`` when torch sees
    one, else ``cpu``; ``auto`` dtype is ``bfloat16`` on CUDA, ``float32`` on CPU.

    Raises:
        RatuneError: an unknown device or dtype, ``cuda`` asked for where torch sees no CUDA
            device, or the vLLM backend (CUDA only) with ``cpu``.
    """
    import torch

    if device not in DEVICES:
        raise RatuneError(f"unknown eval device {device!r}: expected one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise RatuneError(f"unknown eval dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    elif device == "cuda" and not cuda:
        raise RatuneError(f"--device cuda, but torch {torch.__version__} sees no CUDA device (torch.version.cuda "
                          f"{torch.version.cuda}); install a CUDA build of torch that matches the driver, or use "
                          "--device cpu")
    if backend == "vllm" and device != "cuda":
        raise RatuneError("the vLLM backend generates on CUDA only: --device cpu contradicts --backend vllm")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return device, dtype
