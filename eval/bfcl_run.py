"""``ratune eval bfcl``: a checkpoint's answers to BFCL's questions, generated here and scored by BFCL's own
checker in its own venv (eval/bfcl.py). Output folder, prompts and metrics: docs/function_calling.md,
"Scoring any checkpoint on BFCL".
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ratune.errors import InputError, RatuneError
from ratune.eval.bfcl import BFCL_MODEL, CATEGORIES, BfclScores, category_metrics, check_category, score_texts, \
    write_result_files
from ratune.eval.bfcl_summary import summary_chart, summary_csv, summary_markdown, summary_rows
from ratune.eval.resume import append_responses, check_cell_identity, read_done
from ratune.eval.run import backend_batches, checkpoint_max_positions, load_for_generation, resolve_generation
from ratune.eval.settings import BFCL_OPTIONS, BfclSettings
from ratune.io import atomic_write, iter_jsonl, read_json_object, sha256_file, write_json, write_text
from ratune.manifest import base_manifest, host_facts, is_complete, package_versions
from ratune.models import DEMO_MODEL_ALIAS, load_tokenizer, resolve_model_path, set_torch_threads
from ratune.options import values_from_args
from ratune.output import StageOutput
from ratune.sources.bfcl import (BfclEntry, answer_path, bfcl_data_dir, bfcl_venv, bfcl_version, encode_bfcl_prompt,
                                 load_bfcl, question_path)
from ratune.sources.formats import AnswerFormat, PythonCallsFormat, ToolCallsFormat, answer_format_of, get_answer_format
from ratune.sources.prompt import require_chat_template, use_chat_template
from ratune.sources.toolset import draw_shots, is_tool_set
from ratune.sources.unseen import seen_entries
from ratune.train.layout import Checkpoint, trained_answer_format, trained_chat_template

#: The stage name in OUT's owner marker (:class:`ratune.output.StageOutput`).
BFCL_STAGE = "eval bfcl"


@dataclass(frozen=True)
class BfclRequest:
    """A resolved ``ratune eval bfcl`` request (:func:`resolve_bfcl_request`): the entries per category,
    and either the checkpoint to generate with (``checkpoint``, ``device``, ``dtype``) or the folder
    of earlier responses to score (``responses``) with its lines per category (``given``, in entry
    order, for exactly the entries of ``entries``)."""

    entries: dict[str, list[BfclEntry]]
    venv: Path
    bfcl_version: str
    name: str
    checkpoint: Checkpoint | None = None
    described_by: Path | None = None
    device: str | None = None
    dtype: str | None = None
    responses: Path | None = None
    given: dict[str, list[dict]] | None = None
    unseen: dict | None = None


def resolve_bfcl_request(*, checkpoint: str | None, responses: str | os.PathLike | None,
                         categories: list[str] | None, limit: int | None, settings: BfclSettings,
                         model_name: str | None = None, unseen_by: str | os.PathLike | None = None) -> BfclRequest:
    """The one preflight of ``ratune eval bfcl``, before any model loads or file is written.

    Raises:
        RatuneError: neither or both of ``checkpoint`` and ``responses``; an unknown category (listing
            the known ones); BFCL's venv missing ("run make bfcl-setup"); a checkpoint that is not a
            model (:func:`ratune.eval.run.resolve_generation`); a responses folder without a category's
            responses.jsonl.
        InputError: a responses line that :func:`_given_responses` refuses.
    """
    if (checkpoint is None) == (responses is None):
        raise RatuneError("give --checkpoint (generate and score) or --responses (score an earlier run's "
                          "responses), not both or neither")
    categories = [check_category(c) for c in categories] if categories else None
    venv = bfcl_venv()
    data = bfcl_data_dir(venv)
    common = dict(venv=venv, bfcl_version=bfcl_version(venv))
    removed: dict[str, dict[str, str]] = {}

    def unseen(category: str, entries: list) -> list:
        """``entries`` less those the ``unseen_by`` tool set has seen (recorded in ``removed``)."""
        if unseen_by is None:
            return entries
        removed[category] = seen_entries(entries, unseen_by)
        return [e for e in entries if e.id not in removed[category]]

    if unseen_by is not None:
        if not is_tool_set(unseen_by):
            raise RatuneError(f"--unseen-by {unseen_by}: not a tool-set folder (ratune tools import)")
        common["unseen"] = {"tool_set": str(Path(unseen_by).resolve()), "removed": removed}
    if responses is not None:
        responses = Path(responses)
        if not responses.is_dir():
            raise RatuneError(f"--responses {responses}: no such folder")
        categories = categories or [c for c in CATEGORIES if (responses / c / "responses.jsonl").is_file()]
        if not categories:
            raise RatuneError(f"--responses {responses}: no CATEGORY/responses.jsonl of a BFCL category "
                              f"({', '.join(CATEGORIES)})")
        missing = [c for c in categories if not (responses / c / "responses.jsonl").is_file()]
        if missing:
            raise RatuneError(f"--responses {responses}: no {missing[0]}/responses.jsonl")
        given = {}
        for c in categories:
            entries = load_bfcl(data, c)
            kept = {e.id for e in unseen(c, entries)}
            pairs = _given_responses(responses / c / "responses.jsonl", entries, None)
            given[c] = [(e, row) for e, row in pairs if e.id in kept][:limit]
        rows = {c: [row for _, row in pairs] for c, pairs in given.items()}
        name = model_name or next((r["model"] for rs in rows.values() for r in rs if isinstance(r.get("model"), str)),
                                  responses.resolve().name)
        return BfclRequest(**common, entries={c: [e for e, _ in pairs] for c, pairs in given.items()}, name=name,
                           responses=responses, given=rows)
    common["entries"] = {c: unseen(c, load_bfcl(data, c))[:limit] for c in categories or CATEGORIES}
    folder = resolve_model_path(checkpoint)  # the demo alias names its converted folder
    source, device, dtype = resolve_generation(folder, backend=settings.backend, device=settings.device,
                                               dtype=settings.dtype)
    if model_name is None:
        model_name = (DEMO_MODEL_ALIAS if checkpoint == DEMO_MODEL_ALIAS else
                      f"{source.run.name}-step{source.step}" if source.step is not None else folder.resolve().name)
    return BfclRequest(**common, name=model_name, checkpoint=source, described_by=source.run or folder,
                       device=device, dtype=dtype)


def evaluate_bfcl(out: str | os.PathLike, *, checkpoint: str | None = None,
                  responses: str | os.PathLike | None = None, categories: list[str] | None = None,
                  limit: int | None = None, settings: BfclSettings | None = None, model_name: str | None = None,
                  progress: bool = True, unseen_by: str | os.PathLike | None = None) -> dict[str, dict]:
    """Generate (``checkpoint``) or read (``responses``: an earlier output's folder) the answers of
    each category's first ``limit`` entries, score them by BFCL's checker and write ``out``
    (docs/function_calling.md#output). Resumable: complete categories are kept, a partly written
    responses.jsonl is continued.

    Returns:
        ``{category: metrics}`` as written to each ``metrics.json``.
    Raises:
        RatuneError: see :func:`resolve_bfcl_request`; ``out`` not a ``ratune eval bfcl`` output, or
            the responses folder itself; a category made with other settings; a prompt longer than
            the model's positions.
        InputError: a responses line without a string ``id`` and ``text``, or with an id not in the
            category's entries.
    """
    settings = settings or BfclSettings()
    output = StageOutput(out, BFCL_STAGE)
    output.check()
    request = resolve_bfcl_request(checkpoint=checkpoint, responses=responses, categories=categories, limit=limit,
                                   settings=settings, model_name=model_name, unseen_by=unseen_by)
    if request.responses is not None and request.responses.resolve() == Path(out).resolve():
        raise RatuneError(f"--out {out}: the --responses folder itself; give a new folder")
    plan = _Generation(request, settings) if request.checkpoint is not None else None
    with output.writing() as folder:
        results, scoring = {}, {}
        for category in request.entries:
            cell = folder / category
            check_cell_identity(cell, _identity(request, category, plan))
            if is_complete(cell):
                results[category] = read_json_object(cell / "metrics.json")
            elif plan is None:
                with atomic_write(cell / "responses.jsonl") as fh:
                    fh.writelines(_jsonl(row) for row in request.given[category])
                scoring[category] = (request.given[category], {})
            else:
                scoring[category] = plan.generate(cell / "responses.jsonl", category, progress=progress)
        results.update(_score_into(folder, output, request, scoring, plan))
        readers = {c: _reader(request, c, plan) for c in request.entries}
        write_result_files(folder / "bfcl", [(c, row["id"], readers[c].bfcl_text(row["text"])) for c in request.entries
                                             for row in read_done(folder / c / "responses.jsonl", key="id", kind=str
                                                                  ).values()], venv=request.venv)
        finished = finished_categories(folder)
        _write_summary(folder, finished)
        _write_manifest(folder, request, finished, plan)
    return {c: results[c] for c in request.entries}


class _Generation:
    """The checkpoint's side of a request: tokenizer, prompts (encoded and length-checked before the
    model loads), the model (loaded when the first category has entries left to answer) and the
    generation settings every category records."""

    def __init__(self, request: BfclRequest, settings: BfclSettings):
        source = request.checkpoint
        self.request, self.settings, self.model = request, settings, None
        set_torch_threads(settings.torch_threads)
        template = settings.chat_template or trained_chat_template(request.described_by)
        self.tokenizer = use_chat_template(load_tokenizer(source.folder, trust_remote_code=settings.trust_remote_code),
                                           template)
        require_chat_template(self.tokenizer, source=str(source.folder), hint="give --chat-template")
        self.answer_format = bfcl_answer_format(settings.answer_format, trained_answer_format(request.described_by))
        self.answer_format.check_tokenizer(self.tokenizer)
        self.answer_format = self.answer_format.reading(self.tokenizer)
        self.shots = _shots(settings, self.answer_format)
        self.positions = checkpoint_max_positions(source, trust_remote_code=settings.trust_remote_code)
        self.prompts = {c: [encode_bfcl_prompt(self.tokenizer, e, self.answer_format, self.shots) for e in entries]
                        for c, entries in request.entries.items()}
        for category, prompts in self.prompts.items():
            too_long = [(e.id, len(p)) for e, p in zip(request.entries[category], prompts)
                        if self.positions is not None and len(p) >= self.positions]
            if too_long:
                raise RatuneError(f"BFCL {category}: {len(too_long)} prompts leave no room for an answer in the "
                                  f"model's {self.positions} positions (the first: {too_long[0][0]}, "
                                  f"{too_long[0][1]} tokens); leave the category out (--categories)")
        self.generation = {"batch_size": settings.batch_size, "max_new_tokens": settings.max_new_tokens,
                           **self.answer_format.record(), "stop_at_answer_end": not settings.full_answers,
                           "greedy": True,
                           "backend": settings.backend, "device": request.device, "dtype": request.dtype,
                           "chat_template": template}
        if self.shots:
            self.generation["shots"] = {"tool_set": str(Path(settings.shots_from).resolve()),
                                        "seed": settings.shots_seed, "lines": [shot.line for shot in self.shots]}

    def generate(self, path: Path, category: str, *, progress: bool) -> tuple[list[dict], dict]:
        """Answer what ``path`` lacks; returns the lines in entry order and the timing of this run's part."""
        entries, prompts, settings = self.request.entries[category], self.prompts[category], self.settings
        done = read_done(path, key="id", kind=str)
        todo = sum(e.id not in done for e in entries)
        if todo and self.model is None:
            self.model = load_for_generation(self.request.checkpoint, backend=settings.backend,
                                             dtype=self.request.dtype, device=self.request.device,
                                             positions=self.positions, trust_remote_code=settings.trust_remote_code)

        def batches(todo_prompts):
            return backend_batches(settings.backend, self.model, self.tokenizer, todo_prompts,
                                   batch_size=settings.batch_size, max_new_tokens=settings.max_new_tokens,
                                   stop_after_api_call=not settings.full_answers, max_positions=self.positions,
                                   answer_format=self.answer_format.name)

        order = {e.id: i for i, e in enumerate(entries)}
        start = time.perf_counter()
        rows = append_responses(path, done, list(order), prompts, batches=batches, meta={"model": self.request.name},
                                key="id", order=lambda row: order.get(row["id"], len(order)),
                                desc=f"{self.request.name} {category}", progress=progress)
        seconds = time.perf_counter() - start
        return rows, {"generated": todo, "seconds": round(seconds, 3),
                      "prompts_per_second": round(todo / seconds, 4) if todo else None}

    def limits(self, category: str) -> dict:
        """``generation_limit`` of a category's metrics: the entries whose prompt left fewer than
        max_new_tokens positions."""
        capped = [e.id for e, p in zip(self.request.entries[category], self.prompts[category])
                  if self.positions is not None and self.positions - len(p) < self.settings.max_new_tokens]
        return {"max_positions": self.positions, "capped": capped}


def _shots(settings: BfclSettings, answer_format: AnswerFormat) -> tuple:
    """The worked examples ``settings`` ask for (:func:`ratune.sources.toolset.draw_shots`), or ().

    Raises:
        RatuneError: shots in another format than ``python_calls``; as ``draw_shots``.
    """
    if settings.shots is None:
        return ()
    if answer_format.name != PythonCallsFormat.name:
        raise RatuneError(f"--shots: worked examples are written in python_calls (BFCL's prompting format), "
                          f"not {answer_format.name}")
    return draw_shots(settings.shots_from, settings.shots, settings.shots_seed)


#: The answer formats BFCL's entries (a question and a function list) can be written in.
BFCL_ANSWER_FORMATS = (PythonCallsFormat.name, ToolCallsFormat.name)


def bfcl_answer_format(asked: str | None, trained: str | None) -> AnswerFormat:
    """The format BFCL prompts are written in: ``asked`` (``--answer-format``), else ``trained``
    (the checkpoint's training rows') when it is one of :data:`BFCL_ANSWER_FORMATS`, else
    ``python_calls`` (BFCL's own prompting).

    Raises:
        RatuneError: ``asked`` is not one of :data:`BFCL_ANSWER_FORMATS`.
    """
    if asked is not None and asked not in BFCL_ANSWER_FORMATS:
        raise RatuneError(f"--answer-format {asked}: BFCL's entries are function lists, written as "
                          f"{' or '.join(BFCL_ANSWER_FORMATS)}")
    return get_answer_format(asked or (trained if trained in BFCL_ANSWER_FORMATS else PythonCallsFormat.name))


def _reader(request: BfclRequest, category: str, plan: _Generation | None) -> AnswerFormat:
    """What turns a category's answers into the call list BFCL's checker reads: the generating run's
    format, or for ``--responses`` the one the earlier run's identity records."""
    if plan is not None:
        return plan.answer_format
    source = request.responses / category / "identity.json"
    earlier = read_json_object(source) if source.is_file() else {}
    generation = earlier.get("generation") if isinstance(earlier.get("generation"), dict) else {}
    return answer_format_of(generation, PythonCallsFormat.name)


def _identity(request: BfclRequest, category: str, plan: _Generation | None) -> dict:
    """What a category is computed from (``identity.json``, :func:`ratune.eval.resume.check_cell_identity`)."""
    head = {"category": category, "entries": len(request.entries[category]), "bfcl_version": request.bfcl_version,
            "bfcl_model": BFCL_MODEL}
    if request.unseen is not None:  # entries a tool set has seen, left out
        head["unseen_by"] = {"tool_set": request.unseen["tool_set"],
                             "removed": sorted(request.unseen["removed"][category])}
    if plan is None:
        return {**head, "responses_from": str(request.responses.resolve())}
    identity = {**head, "checkpoint": str(request.checkpoint.folder.resolve()), "generation": plan.generation}
    if request.checkpoint.base is not None:
        identity["adapter_base"] = request.checkpoint.base
    return identity


def _given_responses(path: Path, entries: list[BfclEntry], limit: int | None) -> list[tuple[BfclEntry, dict]]:
    """The lines of an earlier responses file with their entries, in entry order, the first ``limit``.

    Raises:
        InputError: a line without a string ``id`` and ``text``, an id given twice or not one of the
            category's entries; a file without any line.
    """
    by_id = {e.id: e for e in entries}
    rows = {}
    for line, row in iter_jsonl(path):
        for field in ("id", "text"):
            if not isinstance(row.get(field), str):
                raise InputError(str(path), line, field, "expected a string")
        if row["id"] in rows:
            raise InputError(str(path), line, "id", f"{row['id']!r} given twice")
        if row["id"] not in by_id:
            raise InputError(str(path), line, "id", f"{row['id']!r} is not an entry of BFCL's {entries[0].category}")
        rows[row["id"]] = row
    if not rows:
        raise InputError(str(path), None, "id", "no responses to score")
    return [(e, rows[e.id]) for e in entries if e.id in rows][:limit]


def _jsonl(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def _score_into(folder: Path, output: StageOutput, request: BfclRequest, scoring: dict[str, tuple[list[dict], dict]],
                plan: _Generation | None) -> dict[str, dict]:
    """Score every category of ``scoring`` (``{category: (responses, timing)}``) in one worker process,
    then write each one's verdicts.jsonl and metrics.json and mark it complete."""
    if not scoring:
        return {}
    readers = {c: _reader(request, c, plan) for c in scoring}
    scores = score_texts([(c, row["id"], readers[c].bfcl_text(row["text"])) for c, (rows, _) in scoring.items()
                          for row in rows], venv=request.venv)
    results = {}
    for category, (rows, timing) in scoring.items():
        verdicts = [v for v in scores.verdicts if v.category == category]
        cell = folder / category
        with atomic_write(cell / "verdicts.jsonl") as fh:
            fh.writelines(_jsonl({"id": v.id, "correct": v.correct, "decoded": v.decoded, "calls": v.calls,
                                  "error_type": v.error_type, "error": v.error}) for v in verdicts)
        metrics = {"category": category, "model": request.name,
                   **category_metrics(BfclScores(scores.bfcl_version, scores.model, verdicts))[category],
                   "versions": package_versions()}
        if request.unseen is not None:
            removed = request.unseen["removed"][category]
            metrics["unseen_by"] = {"tool_set": request.unseen["tool_set"], "removed_n": len(removed),
                                    "removed": removed}
        if plan is None:
            source = request.responses / category / "identity.json"
            earlier = read_json_object(source) if source.is_file() else {}
            metrics.update(responses_from=str(request.responses.resolve()), checkpoint=earlier.get("checkpoint"),
                           generation=earlier.get("generation"))
        else:
            metrics.update(checkpoint=str(request.checkpoint.folder.resolve()), generation=plan.generation,
                           generation_limit=plan.limits(category), timing=timing, host=host_facts())
        write_json(cell / "metrics.json", metrics)
        output.complete(cell)
        results[category] = metrics
    return results


def finished_categories(folder: str | os.PathLike) -> dict[str, dict]:
    """``{category: metrics}`` of the complete categories of a ``ratune eval bfcl`` output, in
    :data:`ratune.eval.bfcl.CATEGORIES` order."""
    folder = Path(folder)
    return {c: read_json_object(folder / c / "metrics.json") for c in CATEGORIES if is_complete(folder / c)}


def is_bfcl_cell(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete category folder of a ``ratune eval bfcl`` output."""
    path = Path(path)
    return path.name in CATEGORIES and is_complete(path) and (path / "verdicts.jsonl").is_file()


def bfcl_cell_outcomes(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """``(metrics, per-entry outcomes)`` of a complete category folder: outcomes are
    ``{"question_id": entry id, "bfcl": "correct" | "wrong"}`` from BFCL's verdicts.

    Raises:
        RatuneError: not a complete category folder of ``ratune eval bfcl``.
        InputError: a verdict line without ``id`` or ``correct`` (file, line).
    """
    path = Path(path)
    if not is_bfcl_cell(path):
        raise RatuneError(f"{path}: not a complete category folder of `ratune eval bfcl` (e.g. OUT/simple_python)")
    outcomes = []
    for line, row in iter_jsonl(path / "verdicts.jsonl"):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("correct"), bool):
            raise InputError(str(path / "verdicts.jsonl"), line, "id" if "id" not in row else "correct",
                             "expected an entry id and a boolean verdict")
        outcomes.append({"question_id": row["id"], "bfcl": "correct" if row["correct"] else "wrong"})
    return {**read_json_object(path / "metrics.json"), "category": path.name}, outcomes


def _write_summary(folder: Path, finished: dict[str, dict]) -> None:
    """summary.md, summary.csv and summary.png (one bar per category, with its interval)."""
    rows = summary_rows(finished)
    write_text(folder / "summary.md", summary_markdown(rows))
    write_text(folder / "summary.csv", summary_csv(rows))
    summary_chart(rows, folder / "summary.png")


def _write_manifest(folder: Path, request: BfclRequest, finished: dict[str, dict], plan: _Generation | None) -> None:
    """manifest.json: versions, git commit, the checkpoint (or responses folder), BFCL's version, model
    key and data files' sha256, the generation settings and each finished category's metrics.json sha256."""
    data = bfcl_data_dir(request.venv)
    inputs = {}
    for category in request.entries:
        for path in (question_path(data, category), answer_path(data, category)):
            if path.is_file():
                inputs[f"{path.parent.name}/{path.name}"] = sha256_file(path)
    previous = read_json_object(folder / "manifest.json") if (folder / "manifest.json").exists() else {}
    write_json(folder / "manifest.json", {
        **base_manifest(BFCL_STAGE), "bfcl_version": request.bfcl_version, "bfcl_model": BFCL_MODEL,
        "checkpoint": str(request.checkpoint.folder.resolve()) if plan is not None else None,
        "responses_from": str(request.responses.resolve()) if plan is None else None,
        "generation": plan.generation if plan is not None else None,
        "inputs": {**previous.get("inputs", {}), **inputs},
        "categories": {c: sha256_file(folder / c / "metrics.json") for c in finished}})


def cli_bfcl(args) -> int:
    """``ratune eval bfcl`` (``args`` from its parser, ratune/cli.py): prints summary.md. Returns 0."""
    settings = BfclSettings(**values_from_args(args, BFCL_OPTIONS))
    evaluate_bfcl(args.out, checkpoint=args.checkpoint, responses=args.responses, categories=args.categories,
                  limit=args.limit, settings=settings, unseen_by=args.unseen_by)
    print(summary_markdown(summary_rows(finished_categories(args.out))), end="")
    return 0
