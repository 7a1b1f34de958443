"""Answer texts scored on BFCL by BFCL's own decoder and checker, run in BFCL's virtual environment
through eval/bfcl_worker.py (bfcl_eval is never imported here). Categories, the model key and what
counts as correct: docs/function_calling.md#scoring-on-bfcl.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ratune.errors import RatuneError
from ratune.eval.stats import wilson_interval
from ratune.io import write_json, write_text
from ratune.sources.bfcl import BFCL_PREFIX, bfcl_data_dir, bfcl_venv, bfcl_version, load_bfcl, possible_answer_text

#: BFCL's model key whose handler and model name the checker is given: a registered prompting-mode
#: key (its handler's decode_ast is default_decode_ast_prompting) whose ``underscore_to_dot`` is
#: False, so a dotted function name (``math.factorial``) must be called as written, and without
#: ``_`` (``bfcl evaluate`` turns the ``_`` of its result folder name back into ``/``).
BFCL_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Categories scored by ast_checker against BFCL's possible answers (Python, single turn).
AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
                  "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
#: Categories where no call is correct (a text that does not decode, or decodes to no call).
IRRELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance")
#: Categories where any decoded call is correct.
RELEVANCE_CATEGORIES = ("live_relevance",)
CATEGORIES = AST_CATEGORIES + IRRELEVANCE_CATEGORIES + RELEVANCE_CATEGORIES

_WORKER = Path(__file__).resolve().with_name("bfcl_worker.py")


@dataclass(frozen=True)
class BfclVerdict:
    """BFCL's verdict on one text: ``correct``; ``decoded``, whether it decodes to BFCL's call format
    (``[]`` included); ``calls``, how many calls it decodes to (0 when it does not decode); BFCL's
    ``error`` messages and ``error_type`` (None when correct)."""

    id: str
    category: str
    correct: bool
    decoded: bool
    calls: int
    error: list | None
    error_type: str | None


@dataclass(frozen=True)
class BfclScores:
    """The verdicts of one batch, in input order, with the bfcl-eval version and model key used."""

    bfcl_version: str
    model: str
    verdicts: list[BfclVerdict]


def check_category(category: str) -> str:
    """``category`` when it is one of :data:`CATEGORIES`.

    Raises:
        RatuneError: another name, listing the known ones.
    """
    if category not in CATEGORIES:
        raise RatuneError(f"BFCL category {category!r} is not scored here: expected one of {', '.join(CATEGORIES)}")
    return category


def _run_worker(mode: str, request, *, venv: str | os.PathLike | None, model: str) -> dict:
    """eval/bfcl_worker.py's answer to ``request`` in ``mode`` (``score`` or ``prompts``), run once by
    BFCL's Python.

    Raises:
        RatuneError: BFCL's venv is missing ("run make bfcl-setup"), or the worker failed (its one line).
    """
    python = bfcl_venv(venv) / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="ratune-bfcl-") as tmp:
        source, target = Path(tmp) / "in.json", Path(tmp) / "out.json"
        source.write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
        # bfcl_eval makes result/, score/ and lock folders under BFCL_PROJECT_ROOT when imported
        env = dict(os.environ, BFCL_PROJECT_ROOT=tmp)
        done = subprocess.run([str(python), "-I", str(_WORKER), mode, model, str(source), str(target)], cwd=tmp,
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise RatuneError(f"BFCL's checker failed ({python}): {last}")
        return json.loads(target.read_text(encoding="utf-8"))


def score_texts(items: Iterable[tuple[str, str, str]], *, venv: str | os.PathLike | None = None,
                model: str = BFCL_MODEL) -> BfclScores:
    """Score ``(category, entry id, answer text)`` items by BFCL's checker in one worker process.

    Raises:
        RatuneError: BFCL's venv is missing ("run make bfcl-setup"), a category not in
            :data:`CATEGORIES`, or the worker failed (its one-line error: e.g. an id not in BFCL's data).
    """
    items = [{"category": check_category(c), "id": i, "text": t} for c, i, t in items]
    out = _run_worker("score", items, venv=venv, model=model)
    return BfclScores(bfcl_version=out["bfcl_version"], model=out["model"],
                      verdicts=[BfclVerdict(**r) for r in out["results"]])


def bfcl_prompt_messages(categories: Iterable[str], *, venv: str | os.PathLike | None = None,
                         model: str = BFCL_MODEL) -> dict[str, list[tuple[str, list[dict]]]]:
    """``{category: [(entry id, messages), ...]}``: the messages BFCL's own code prepares for every
    entry in prompting mode (one worker process); what
    :func:`ratune.sources.bfcl.bfcl_messages` reproduces.

    Raises:
        RatuneError: see :func:`score_texts`.
    """
    out = _run_worker("prompts", [check_category(c) for c in categories], venv=venv, model=model)
    return {c: [(i, m) for i, m in rows] for c, rows in out["messages"].items()}


def category_metrics(scores: BfclScores) -> dict[str, dict]:
    """Per category, the metrics of docs/function_calling.md#the-metrics-per-category-in-metricsjson,
    with the ``bfcl_version`` and ``bfcl_model`` used."""
    by_category: dict[str, list[BfclVerdict]] = defaultdict(list)
    for v in scores.verdicts:
        by_category[v.category].append(v)
    out = {}
    for category, verdicts in by_category.items():
        n, k = len(verdicts), sum(v.correct for v in verdicts)
        out[category] = {"n": n, "correct": k, "accuracy": k / n, "accuracy_ci": list(wilson_interval(k, n)),
                         "call_rate": sum(v.calls > 0 for v in verdicts) / n,
                         "format_adherence": sum(v.decoded for v in verdicts) / n,
                         "bfcl_version": scores.bfcl_version, "bfcl_model": scores.model}
    return out


def check_converted_answers(categories: Iterable[str] = AST_CATEGORIES, *, venv: str | os.PathLike | None = None
                            ) -> dict[str, dict]:
    """Every possible answer of ``categories``, converted (:func:`possible_answer_text`) and scored
    against its own key: per category ``n``, ``kept`` and ``dropped`` (``[[id, error_type], ...]``)."""
    data = bfcl_data_dir(venv)
    items = [(c, e.id, possible_answer_text(e.possible_answer, e.functions))
             for c in categories for e in load_bfcl(data, check_category(c))]
    out = {c: {"n": 0, "kept": 0, "dropped": []} for c in categories}
    for v in score_texts(items, venv=venv).verdicts:
        out[v.category]["n"] += 1
        if v.correct:
            out[v.category]["kept"] += 1
        else:
            out[v.category]["dropped"].append([v.id, v.error_type])
    return out


def write_result_files(root: str | os.PathLike, items: Iterable[tuple[str, str, str]], *,
                       model: str = BFCL_MODEL, venv: str | os.PathLike | None = None) -> list[Path]:
    """Write ``(category, entry id, answer text)`` items as ``bfcl generate`` does (under
    ``ROOT/result/``, with ``ratune_bfcl.json`` beside them), for ``bfcl evaluate`` by hand
    (docs/function_calling.md#output). Returns the result files written.

    Raises:
        RatuneError: a category not in :data:`CATEGORIES`, or an entry given twice.
    """
    folder = Path(root) / "result" / model.replace("/", "_")
    lines: dict[str, dict[str, str]] = defaultdict(dict)
    for category, entry_id, text in items:
        if entry_id in lines[check_category(category)]:
            raise RatuneError(f"BFCL result files: {category} entry {entry_id!r} given twice")
        lines[category][entry_id] = json.dumps({"id": entry_id, "result": text}, ensure_ascii=False)
    written = []
    for category, rows in lines.items():
        path = folder / ("live" if "live" in category else "non_live") / f"{BFCL_PREFIX}_{category}_result.json"
        write_text(path, "".join(row + "\n" for row in rows.values()))
        written.append(path)
    write_json(folder / "ratune_bfcl.json", {"bfcl_version": bfcl_version(venv), "model": model})
    return written
