"""The training-set builder: a hub's examples -> single-turn chats, per train-time retrieval mode
(layout and over-length policy: docs/pipeline.md#data). Beyond that policy, a row that would keep
fewer than ``MIN_DOCUMENT_TOKENS`` of its document is dropped, and so is an over-long tool-set row
(tools are never cut)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ratune.data.labels import ANSWER_TOKENIZATIONS
from ratune.data.mixture import MIXTURE_OPTIONS, Mixture, apply_utility_filter, draw_documents, realised_shares
from ratune.data.rows import (MIN_DOCUMENT_TOKENS, build_rows, force_gold_documents, percentiles, require_rows,
                              retrieve_for_mode)
from ratune.data.settings import BUILD_OPTIONS, BuildSettings
from ratune.data.utility import load_utility
from ratune.errors import RatuneError
from ratune.hubs import Hub, as_hub_source, resolve_hub
from ratune.io import atomic_write, read_json_object, sha256_file, write_json
from ratune.manifest import DATA_BUILD_STAGE, base_manifest, is_complete, package_versions
from ratune.models import TOKENIZER_FOLDER_FILES, load_tokenizer, resolve_model_path
from ratune.options import values_from_args
from ratune.output import StageOutput
from ratune.registry import DEFAULT_MODES, RETRIEVED_MODES, RETRIEVERS, SPLITS, TRAIN_MODES, unknown_name
from ratune.retrieval.dense import require_held_out
from ratune.retrieval.retrievers import require_finetuned_retriever
from ratune.sources.apibench import ParseReport, api_identity, input_hashes
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, get_answer_format
from ratune.sources.prompt import require_chat_template, template_name, use_chat_template
from ratune.sources.validate import (HOLDOUTS, ValidationReport, example_identities, near_duplicate_rate,
                                    validate_splits)

#: What other modules import from here (the settings and the row builder live beside it).
__all__ = ["BUILD_OPTIONS", "BuildSettings", "MIN_DOCUMENT_TOKENS", "build_dataset", "build_request", "build_rows",
           "cli_build", "force_gold_documents", "require_rows", "retrieve_for_mode", "settings_record"]


def build_dataset(*, apibench_dir=None, hub: str | Hub, out_dir, tokenizer, tokenizer_name: str,
                  modes: Sequence[str] = DEFAULT_MODES, settings: BuildSettings = BuildSettings(),
                  lenient: bool = False, overwrite: bool = False, progress: bool = True,
                  leakage: str = "error", mixtures: Sequence = (), utility_keep: dict | None = None,
                  utility_meta: dict | None = None, reuse_if_same: bool = False) -> dict:
    """Build the chats for every split the hub has and every mode; write datasets and manifest.

    Args:
        apibench_dir: the APIBench folder, for an APIBench hub (None: the default).
        hub: a hub name or folder, or a :class:`~ratune.hubs.Hub`.
        out_dir: output folder, built in a temporary sibling and swapped in when complete.
        tokenizer: the training model's tokenizer with the chat template training will use.
        modes: train-time retrieval modes to build.
        lenient: write unparseable rows to ``rejects.jsonl`` and count them instead of failing.
        leakage: one of :data:`ratune.sources.validate.LEAKAGE_POLICIES`.
        mixtures: each builds the mode ``mix-NAME``.
        utility_keep: ``{(line, mode): keep}`` (:func:`ratune.data.utility.load_utility`) for
            the mixtures' utility filter; ``utility_meta`` is recorded.
        reuse_if_same: keep a complete build whose manifest records the same
            :func:`build_request` and every mode asked for; otherwise build as with ``overwrite``.
    Returns:
        The manifest (also written to ``out_dir/manifest.json``).
    Raises:
        InputError: on a bad input row (file:line field), unless lenient.
        RatuneError: a tokenizer without a chat template, unknown mode, two mixtures with one
            name, an existing output folder without ``overwrite``, or one that is not a ratune
            data build.
        LockHeld: another process is writing ``out_dir``.
    """
    source = as_hub_source(hub, apibench_dir)  # an unknown hub or a folder that is no catalog: refused first
    require_chat_template(tokenizer, source=tokenizer_name, hint="give --chat-template (and the same chat_template "
                          "in the training config)")
    for mode in modes:
        if mode not in TRAIN_MODES:
            raise RatuneError(unknown_name("train-time retrieval mode", mode, TRAIN_MODES))
    mixture_modes = [m.mode for m in mixtures]
    if len(set(mixture_modes)) != len(mixture_modes):
        raise RatuneError(f"two mixtures share a name: {', '.join(mixture_modes)}")
    needs_model = _finetuned_users(modes, mixtures)
    if needs_model:
        require_finetuned_retriever(settings.dense_model, source.name, f"the {needs_model[0]} mode")
    get_answer_format(source.choose_answer_format(settings.answer_format)).check_tokenizer(tokenizer)
    final = Path(out_dir)
    output = StageOutput(final, DATA_BUILD_STAGE, replace=True, action="overwrite")
    output.check()  # a user's folder: refused, --overwrite or not
    request = build_request(source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, settings=settings,
                            lenient=lenient, leakage=leakage, mixtures=mixtures, utility_meta=utility_meta)
    if reuse_if_same:
        reused = _same_build(final, request, [*modes, *mixture_modes])
        if reused is not None:
            _check_validation_retriever(reused.get("validation_split"), source, settings, needs_model)
            print(f"ratune: note: {final}: already built with the same request (modes, settings, tokenizer, "
                  "mixtures, input files); reused (--reuse-if-same)", file=sys.stderr)
            return reused
        overwrite = True
    if final.is_dir() and any(final.iterdir()) and not overwrite:
        raise RatuneError(f"{final}: output folder exists and is not empty (pass --overwrite to rebuild it)")
    # built in a temporary sibling, swapped in at the end: a failed rebuild keeps the previous build
    with output.writing():
        return _build_into(output, source=source, tokenizer=tokenizer,
                           tokenizer_name=tokenizer_name, modes=modes, settings=settings, lenient=lenient,
                           progress=progress, leakage=leakage, mixtures=mixtures, utility_keep=utility_keep,
                           utility_meta=utility_meta, request=request)


def settings_record(settings: BuildSettings, tokenizer) -> dict:
    """A build's settings as its manifest records them (``settings``; part of :func:`build_request`)."""
    return {"max_length": settings.max_length, "max_document_tokens": settings.max_document_tokens,
            "top_k": settings.top_k, "min_document_tokens": MIN_DOCUMENT_TOKENS,
            "force_gold": settings.force_gold, "chat_template": template_name(tokenizer),
            **({"dense_model": str(Path(settings.dense_model).resolve())} if settings.dense_model else {}),
            **({"answer_tokenization": settings.answer_tokenization}
               if settings.answer_tokenization != ANSWER_TOKENIZATIONS[0] else {}),
            **({"answer_format": settings.answer_format} if settings.answer_format else {}),
            **({"validation_fraction": settings.validation_fraction, "validation_by": settings.validation_by,
                "validation_seed": settings.validation_seed} if settings.validation_fraction else {}),
            **({"same_examples": True} if settings.same_examples else {})}


def _hold_out_validation(splits: dict, settings: BuildSettings, validation: ValidationReport
                         ) -> tuple[dict | None, frozenset[str]]:
    """Carve the ``validation`` split out of ``splits["train"]`` (in place) when asked; returns the
    manifest's ``validation_split`` record (else None; with what ``validation``, the checks before
    the draw, did to leaked training rows: :meth:`~ratune.sources.validate.ValidationReport.split_leakage`)
    and, for a kind whose held-out APIs are unseen
    (``api_grouped``), the API identities only validation examples show (training rows' retrieval passes
    them over).

    Raises:
        RatuneError: a validation split asked for a hub without training examples, or one that holds out nothing.
    """
    if settings.validation_fraction is None:
        return None, frozenset()
    if "train" not in splits:
        raise RatuneError("--validation-fraction: the hub has no training examples to hold a validation split out of")
    train, held, record = settings.draw(splits["train"])
    splits["train"], splits["validation"] = train, [dataclasses.replace(e, split="validation") for e in held]
    trained = {api_identity(e.api) for e in train}
    apis = {api_identity(e.api) for e in held}
    unseen = HOLDOUTS[settings.validation_by].unseen
    hidden = frozenset(set().union(*map(example_identities, held)) - set().union(*map(example_identities, train))
                       if unseen else ())
    return {**record, **validation.split_leakage(),
            "apis": len(apis), "apis_also_trained": len(apis & trained),
            **({"hidden_from_training": len(hidden)} if unseen else {}),
            "near_duplicates": {"validation": near_duplicate_rate(train, held),
                                **({"eval": near_duplicate_rate(train, splits["eval"])} if "eval" in splits else {})}
            }, hidden


def build_request(source: Hub, *, tokenizer, tokenizer_name: str, settings: BuildSettings, lenient: bool,
                  leakage: str, mixtures: Sequence, utility_meta: dict | None) -> dict:
    """Everything that decides a build's rows besides its modes, as JSON (the manifest's
    ``request``, compared by ``reuse_if_same``): ratune's version, the settings, the tokenizer (a
    local folder's files by sha256), the chat template's sha256, the leakage policy, ``lenient``,
    the mixtures, the utility filter and its file's sha256, the finetuned retriever's weights'
    sha256 and every input file's sha256."""
    splits = [s for s in SPLITS if source.examples_file(s).exists()]

    def hashes(folder, patterns) -> dict:
        folder = Path(folder)
        return {p.name: sha256_file(p) for pattern in patterns for p in sorted(folder.glob(pattern)) if p.is_file()}

    request = {"ratune": package_versions().get("ratune"), "settings": settings_record(settings, tokenizer),
               "tokenizer": tokenizer_name, "leakage": leakage, "lenient": lenient,
               "mixtures": {m.mode: m.metadata() for m in mixtures},
               "utility": {**utility_meta, "sha256": sha256_file(utility_meta["file"])} if utility_meta else None,
               "inputs": input_hashes(source.input_files(splits)), "catalog": source.manifest_record(),
               "chat_template_sha256": _template_sha256(getattr(tokenizer, "chat_template", None))}
    if Path(tokenizer_name).is_dir():
        request["tokenizer_files"] = hashes(tokenizer_name, TOKENIZER_FOLDER_FILES)
    if settings.dense_model:
        request["dense_model_weights"] = hashes(settings.dense_model, ["*.safetensors"])
    return json.loads(json.dumps(request, sort_keys=True))  # as it reads back from the manifest


def _template_sha256(template) -> str | None:
    """sha256 of a tokenizer's ``chat_template``: its text, or for several named templates (a dict)
    their JSON with sorted keys; None without one."""
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _same_build(final: Path, request: dict, modes: Sequence[str]) -> dict | None:
    """The manifest of the complete build in ``final`` when it records ``request`` and has every
    mode of ``modes``; else None."""
    path = final / "manifest.json"
    if not (is_complete(final) and path.is_file()):
        return None
    try:
        manifest = read_json_object(path)
    except FileNotFoundError:  # another build is swapping its folder in: not reused; its lock then refuses the rebuild
        return None
    if manifest.get("request") != request or not set(modes) <= set(manifest.get("modes", [])):
        return None
    return manifest


def _finetuned_users(modes: Sequence[str], mixtures: Sequence) -> list[str]:
    """The modes and mixtures' top1 retrievers that retrieve with the finetuned retriever."""
    return [m for m in [*modes, *(x.top1_retriever for x in mixtures)] if RETRIEVERS[m].needs_model]


def _check_validation_retriever(held: dict | None, source: Hub, settings: BuildSettings,
                                needs_model: Sequence[str]) -> None:
    """Refuse a finetuned retriever that trained on the build's validation split (``held``, its
    ``validation_split`` record), where ``needs_model`` modes give the validation rows its documents.

    Raises:
        RatuneError: as :func:`ratune.retrieval.dense.require_held_out`.
    """
    if held and needs_model:
        require_held_out(settings.dense_model, held, hub=source.ref, train_path=source.examples_file("train"),
                         what=f"the {needs_model[0]} mode with a validation split")


def _build_into(output: StageOutput, *, source: Hub, tokenizer, tokenizer_name: str, modes: Sequence[str],
                settings: BuildSettings, lenient: bool, progress: bool, leakage: str, mixtures: Sequence,
                utility_keep: dict | None, utility_meta: dict | None, request: dict) -> dict:
    """The build of :func:`build_dataset` (its arguments were checked), written into ``output``'s folder."""
    from tqdm.auto import tqdm

    out = output.folder
    read = _read_splits(source, settings, lenient=lenient, leakage=leakage, progress=progress)
    _check_validation_retriever(read.held_out, source, settings, _finetuned_users(modes, mixtures))
    cache: dict = {}
    counts: dict = {}
    built: dict = {}  # mode -> {split: rows}
    for mode in tqdm(modes, desc=f"build {source.name}", disable=not progress):
        built[mode] = _build_mode(mode, read, source=source, tokenizer=tokenizer, settings=settings, cache=cache,
                                  counts=counts)
    mixture_records = {}
    for mixture in mixtures:
        mixture_records[mixture.mode], built[mixture.mode] = _build_mixture(
            mixture, read, source=source, tokenizer=tokenizer, settings=settings, cache=cache, counts=counts,
            utility_keep=utility_keep, utility_meta=utility_meta, progress=progress)
    if settings.same_examples:
        _keep_common_examples(built, counts)
    lengths = _save_modes(out, built, mixture_records)
    if read.report.rejects:
        with atomic_write(out / "rejects.jsonl") as fh:
            for path, line, fieldname, reason in read.report.rejects:
                fh.write(json.dumps({"file": path, "line": line, "field": fieldname, "reason": reason}) + "\n")
    answer_format = source.choose_answer_format(settings.answer_format)
    manifest = base_manifest(DATA_BUILD_STAGE)
    manifest.update({
        "hub": source.name, "modes": [*modes, *(m.mode for m in mixtures)], "mixtures": mixture_records,
        "splits": {s: len(e) for s, e in read.splits.items()}, "rows_read": read.read_counts,
        "validation": read.validation.to_manifest(),
        **({"validation_split": read.held_out} if read.held_out else {}),
        "counts": counts, "token_lengths": lengths, "rejects": len(read.report.rejects),
        "settings": settings_record(settings, tokenizer),
        "tokenizer": tokenizer_name, "inputs": input_hashes(source.input_files(read.hub_splits)), "request": request,
        "retrievers": {m: r.metadata() for m, r in cache.items()},
        **({"answer_format": answer_format} if answer_format != DEFAULT_ANSWER_FORMAT else {}),
    })
    record = source.manifest_record()
    if record is not None:  # a hub with nothing beyond its name and files (APIBench) adds no key
        manifest[source.kind] = record
    write_json(out / "manifest.json", manifest)
    output.complete()
    return manifest


@dataclass
class _Read:
    """A hub's examples as a build reads them, validated, with what was read and reported."""

    splits: dict
    read_counts: dict
    validation: object
    hub_splits: list
    held_out: dict | None
    report: ParseReport
    database: list
    hidden: frozenset = frozenset()  # identities only validation examples show: training retrieval passes them over


def _read_splits(source: Hub, settings: BuildSettings, *, lenient: bool, leakage: str, progress: bool) -> _Read:
    """Read and validate the hub's splits (leakage policy, duplicates) and hold out the validation split.

    Raises:
        RatuneError: the hub has no example file (the kind's own error names it); as
            :func:`ratune.sources.validate.validate_splits`.
    """
    report, splits = ParseReport(), {}
    for split in SPLITS:
        if source.examples_file(split).exists():
            splits[split] = source.load_examples(split, lenient=lenient, report=report)
    if not splits:
        source.load_examples(SPLITS[0])  # every kind's error names the missing file and how to make it
        raise RatuneError(f"{source.root}: no example files for hub {source.name}")
    read_counts = {s: len(e) for s, e in splits.items()}
    database = source.load_api_database()
    splits, validation = validate_splits(splits, database, train_path=source.examples_file("train"),
                                         eval_path=source.examples_file("eval"), leakage=leakage)
    hub_splits = list(splits)  # the hub's own files (the manifest hashes them)
    held_out, hidden = _hold_out_validation(splits, settings, validation)
    if progress:
        print(validation.summary())
        if held_out:
            near = held_out["near_duplicates"]
            print(f"validation split: {held_out['n']} of the training examples ({held_out['by']}, seed "
                  f"{held_out['seed']}); near-duplicates of training: validation {near['validation']:.1%}"
                  + (f", eval {near['eval']:.1%}" if "eval" in near else ""))
    return _Read(splits=splits, read_counts=read_counts, validation=validation, hub_splits=hub_splits,
                 held_out=held_out, report=report, database=database, hidden=hidden)


def _build_mode(mode: str, read: "_Read", *, source: Hub, tokenizer, settings: BuildSettings, cache: dict,
                counts: dict) -> dict[str, list[dict]]:
    """One train-time mode's rows for every split, ``{split: rows}``; fills ``counts``."""
    built = {}
    for split, examples in read.splits.items():
        docs = retrieve_for_mode(mode, examples, hub=source, apibench_dir=source.root, top_k=settings.top_k,
                                 retriever_cache=cache, dense_model=settings.dense_model,
                                 bm25_backend=settings.bm25_backend, exclude=read.hidden if split == "train" else
                                 frozenset())
        forced = 0
        if settings.force_gold and split == "train" and mode in RETRIEVED_MODES:
            docs, forced = force_gold_documents(examples, docs)
        rows, c = build_rows(examples, docs, mode=mode, tokenizer=tokenizer, settings=settings,
                             answer_format=source.choose_answer_format(settings.answer_format))
        require_rows(c, split=split, mode=mode, settings=settings)
        if settings.force_gold and mode in RETRIEVED_MODES:
            c["forced_gold"] = forced
        counts.setdefault(split, {})[mode] = c
        built[split] = rows
    return built


def _build_mixture(mixture, read: _Read, *, source: Hub, tokenizer, settings: BuildSettings, cache: dict,
                   counts: dict, utility_keep: dict | None, utility_meta: dict | None, progress: bool
                   ) -> tuple[dict, dict[str, list[dict]]]:
    """A mixture's rows for every split; returns its record (definition, drawn shares, utility
    filter) and ``{split: rows}``; fills ``counts``."""
    record, built = mixture.metadata(), {}
    for split, examples in read.splits.items():
        hidden = read.hidden if split == "train" else frozenset()
        top1 = retrieve_for_mode(mixture.top1_retriever, examples, hub=source, apibench_dir=source.root, top_k=1,
                                 retriever_cache=cache, dense_model=settings.dense_model,
                                 bm25_backend=settings.bm25_backend, exclude=hidden)
        docs, drawn = draw_documents(mixture, split=split, gold_docs=[e.oracle_documents for e in examples],
                                     top1_docs=top1,
                                     database=[d for d in read.database if api_identity(d) not in hidden])
        if utility_keep is not None and split == "train":
            docs, drawn, filtered = apply_utility_filter(mixture, [e.line for e in examples], docs, drawn,
                                                         utility_keep)
            record["utility_filter"] = {**(utility_meta or {}), **filtered}
        rows, c = build_rows(examples, docs, mode=mixture.mode, tokenizer=tokenizer, settings=settings,
                             components=drawn, answer_format=source.choose_answer_format(settings.answer_format))
        require_rows(c, split=split, mode=mixture.mode, settings=settings)
        counts.setdefault(split, {})[mixture.mode] = c
        record.setdefault("realised", {})[split] = {"drawn": realised_shares(drawn)}
        built[split] = rows
    if progress:
        shares = record["realised"].get("train", next(iter(record["realised"].values())))["drawn"]
        print(f"{mixture.mode}: " + ", ".join(f"{k} {100 * v['share']:.1f} %" for k, v in shares.items()))
    return record, built


def _keep_common_examples(built: dict, counts: dict) -> None:
    """``--same-examples``: in each split, keep only the examples every mode kept (in place); a row
    dropped this way is counted as ``dropped_elsewhere``."""
    for split in next(iter(built.values())):
        common = set.intersection(*({r["line"] for r in rows[split]} for rows in built.values()))
        for mode, rows in built.items():
            kept = [r for r in rows[split] if r["line"] in common]
            c = counts[split][mode]
            c["rows"], c["dropped_elsewhere"] = len(kept), len(rows[split]) - len(kept)
            c["shortened"] = sum(r["shortened"] for r in kept)
            rows[split] = kept


def _save_modes(out: Path, built: dict, mixture_records: dict) -> dict:
    """Save each mode's rows (``OUT/{mode}/``, one dataset per split), add each mixture's kept shares
    to its record; returns the token-length percentiles ``{split: {mode: ...}}``."""
    from datasets import Dataset, DatasetDict

    lengths: dict = {}
    for mode, rows in built.items():
        for split, split_rows in rows.items():
            lengths.setdefault(split, {})[mode] = percentiles([r["n_prompt_tokens"] + r["n_completion_tokens"]
                                                                for r in split_rows])
            if mode in mixture_records:
                mixture_records[mode]["realised"][split]["kept"] = realised_shares(
                    [r["doc_component"] for r in split_rows])
        DatasetDict({split: Dataset.from_list(split_rows) for split, split_rows in rows.items()}).save_to_disk(
            str(out / mode))
    return lengths


def cli_build(args) -> int:
    """``ratune data build``: build the chats of a hub (``args`` from its parser, ratune/cli.py); prints a summary (``--json``: one object). Returns 0.

    Raises:
        RatuneError: nothing to build, ``--utility-file`` without ``--min-utility`` or ``--mixture``,
            ``--min-utility`` without ``--utility-file``; as :func:`build_dataset`.
    """
    source = resolve_hub(args.hub, args.apibench)
    mixtures = [Mixture.parse(spec, **values_from_args(args, MIXTURE_OPTIONS)) for spec in args.mixture or []]
    if not args.modes and not mixtures:
        raise RatuneError("nothing to build: give --modes and/or --mixture")
    utility_keep = utility_meta = None
    if args.min_utility is not None and not args.utility_file:
        raise RatuneError("--min-utility is a threshold on --utility-file's measurements; give --utility-file too")
    if args.utility_file:
        if args.min_utility is None or not mixtures:
            raise RatuneError("--utility-file filters a --mixture's documents and needs --min-utility")
        utility_keep = load_utility(args.utility_file, min_utility=args.min_utility)
        utility_meta = {"file": args.utility_file, "min_utility": args.min_utility}
    tokenizer = use_chat_template(load_tokenizer(resolve_model_path(args.tokenizer)), args.chat_template)
    manifest = build_dataset(
        hub=source, out_dir=args.out, tokenizer=tokenizer, tokenizer_name=args.tokenizer,
        modes=args.modes, settings=BuildSettings(**values_from_args(args, BUILD_OPTIONS)),
        lenient=args.lenient, overwrite=args.overwrite, progress=not args.json, leakage=args.leakage,
        mixtures=mixtures, utility_keep=utility_keep, utility_meta=utility_meta, reuse_if_same=args.reuse_if_same)
    summary = {"hub": source.name, "out": args.out, "splits": manifest["splits"],
               "counts": {split: {mode: {k: v for k, v in c.items() if k != "dropped_lines"}
                                  for mode, c in modes.items()} for split, modes in manifest["counts"].items()},
               "rejects": manifest["rejects"]}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        for split, modes in summary["counts"].items():
            for mode, c in modes.items():
                print(f"{split:5s} {mode:7s} rows {c['rows']:5d}  shortened {c['shortened']:5d}  dropped {c['dropped']:4d}"
                      + (f"  dropped in another mode {c['dropped_elsewhere']:4d}" if "dropped_elsewhere" in c else ""))
        print(f"wrote {args.out}")
    return 0
