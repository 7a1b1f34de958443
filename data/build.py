"""The training-set builder: a hub's examples -> single-turn chats, per train-time retrieval mode.

The hub is an APIBench hub, a catalog or a tool-set folder (:func:`ratune.hubs.resolve_hub`); its
documents and examples come from the :class:`~ratune.hubs.Hub`, the rest is the same.
For every example and mode (none, oracle, or a retriever's top_k; the modes are
ratune/registry.py TRAIN_MODES) the builder retrieves the documents,
renders the prompt and the answer in the hub's answer format (:mod:`ratune.sources.formats`; the
evaluator renders prompts the same way), and checks the token length of the whole row against
``max_length``.

Over-length policy (explicit; never truncates the answer; a tool set's tools are never cut, so its
over-long rows are dropped): documents are first shortened to
``max_document_tokens``; a row still longer than ``max_length`` gets its document shortened to the
room left; a row whose instruction and answer alone do not fit (or that would keep fewer than
``MIN_DOCUMENT_TOKENS`` of its document) is dropped. Both are counted per mode and split.

Mixtures (:mod:`ratune.data.mixture`): each :class:`~ratune.data.mixture.Mixture` builds one more
mode, ``mix-NAME``, whose examples each get a document condition drawn from the mixture; rows
carry it in ``doc_component`` and the manifest records the realised shares.

Output: ``OUT/{mode}/`` is a ``datasets.DatasetDict`` (splits ``train`` and/or ``eval``) saved
with ``save_to_disk``; ``OUT/manifest.json`` holds counts per split and mode, token-length
percentiles, the over-length counts, the settings and the input files' sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from ratune.args import input_dir, registered
from ratune.config import BM25BackendName, Count, MaxLength, OpenFraction, Seed, check_fields
from ratune.sources.apibench import Example, ParseReport, api_identity, document_name, input_hashes
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, Prompt, get_answer_format
from ratune.hubs import Hub, as_hub_source, resolve_hub
from ratune.data.labels import ANSWER_TOKENIZATIONS, AnswerMerge, tokenize_row
from ratune.data.mixture import MIXTURE_OPTIONS, Mixture, apply_utility_filter, draw_documents, realised_shares
from ratune.sources.prompt import (build_user_turn, join_documents, require_chat_template, shorten_document,
                                   template_name, use_chat_template)
from ratune.data.utility import load_utility
from ratune.sources.validate import HOLDOUT_KINDS, hold_out, near_duplicate_rate, validate_splits
from ratune.errors import RatuneError
from ratune.io import atomic_write, read_json_object, sha256_file, write_json
from ratune.manifest import DATA_BUILD_STAGE, base_manifest, is_complete, package_versions
from ratune.output import StageOutput
from ratune.models import TOKENIZER_FOLDER_FILES, load_tokenizer, resolve_model_path
from ratune.options import Option, values_from_args
from ratune.retrieval.retrievers import Query, make_retriever, require_finetuned_retriever
from ratune.registry import (BM25_BACKENDS, DEFAULT_BM25_BACKEND, DEFAULT_MODES, RETRIEVED_MODES, RETRIEVERS, SPLITS,
                             TRAIN_MODES, unknown_name)

# The train-time modes (Gorilla trains with none or oracle; the retrieved ones are ours) are
# ratune/registry.py TRAIN_MODES: every retriever that covers training questions, including
# dense_ft, the finetuned bi-encoder (needs BuildSettings.dense_model). The paper's own retrieved
# documents (gpt_index, released_bm25) exist for eval questions only. force_gold applies to
# RETRIEVED_MODES, whose documents are a ranking's top_k.

#: A document cut below this many tokens is useless; the row is dropped instead.
MIN_DOCUMENT_TOKENS = 32


@dataclass(frozen=True)
class BuildSettings:
    """Settings that change the built rows (all recorded in the manifest).

    Attributes:
        max_length: maximum tokens per row, prompt (chat template included) + answer + EOS.
            The paper uses 2048 (appendix); the CPU demo uses less.
        max_document_tokens: budget per document before the length check; None = no budget.
        top_k: documents per prompt for the bm25 and dense modes (the paper uses top-1).
        force_gold: for the retrieved modes (RETRIEVED_MODES) on the *train* split, put the gold
            document in place of the lowest-ranked one when the retriever missed it (RAFT-style:
            the model always sees the right API among the retrieved ones while training; eval rows
            are never changed). Counted per split and mode as ``forced_gold``.
        dense_model: the finetuned retriever folder (``ratune retrieval train``) of the
            ``dense_ft`` mode and of a mixture's ``dense_ft`` top1 component.
        bm25_backend: ``rank_bm25`` or ``bm25s`` (same rankings, so the same rows; recorded in
            the manifest's retriever metadata).
        validation_fraction: hold out this share of the training examples as a ``validation``
            split (built like eval rows; never trained on); None: no validation split.
        validation_by: how (:data:`~ratune.sources.validate.HOLDOUT_KINDS`): ``api_stratified``
            (every validation API is also trained on) or ``api_grouped`` (none is).
        validation_seed: the held-out split's seed.
        answer_tokenization: how the answer is tokenized behind its prompt
            (:data:`ratune.data.labels.ANSWER_TOKENIZATIONS`).
    """

    max_length: MaxLength = 2048
    max_document_tokens: Count | None = None
    top_k: Count = 1
    force_gold: bool = False
    dense_model: str | None = None
    bm25_backend: BM25BackendName = DEFAULT_BM25_BACKEND
    validation_fraction: OpenFraction | None = None
    validation_by: Literal[HOLDOUT_KINDS] = "api_stratified"
    validation_seed: Seed = 0
    answer_tokenization: Literal[ANSWER_TOKENIZATIONS] = ANSWER_TOKENIZATIONS[0]

    def __post_init__(self):
        check_fields(self)  # the bounds of the annotations, before any work starts


#: The modes that need a finetuned retriever folder (``--dense-model``).
_FINETUNED = " ".join(r.name for r in RETRIEVERS.values() if r.needs_model)

#: Every option of :class:`BuildSettings`, in the order a sweep writes them (ratune/options.py):
#: ``ratune data build``'s flags, a sweep file's and the demo's ``data:`` keys and the data command
#: a sweep runs derive from them. ``max_length`` and ``top_k`` are always written.
BUILD_OPTIONS: tuple[Option, ...] = (
    Option("max_length", "--max-length", command="always", help="tokens per row: prompt, answer and EOS (the paper uses 2048)"),
    Option("max_document_tokens", "--max-document-tokens", help="document budget in tokens"),
    Option("top_k", "--top-k", command="always", help="documents per prompt for the retrieved modes"),
    Option("dense_model", "--dense-model", cli={"metavar": "DIR", "type": input_dir},
           help=f"finetuned retriever folder (`ratune retrieval train`) for the {_FINETUNED} mode / top1 retriever"),
    Option("bm25_backend", "--bm25-backend", cli=registered("BM25 backend", BM25_BACKENDS),
           help="BM25 implementation (same rankings; bm25s is faster)"),
    Option("validation_fraction", "--validation-fraction",
           help="hold out this share of the training examples as a validation split, for choices made "
                "without the test questions (default none)"),
    Option("validation_by", "--validation-by",
           help="api_stratified: every validation API is also trained on; api_grouped: none is (unseen APIs)"),
    Option("validation_seed", "--validation-seed", help="the validation split's seed"),
    Option("answer_tokenization", "--answer-tokenization",
           help="in_context: the answer tokenized behind the prompt's text (default); separate: tokenized apart and "
                "its ids put behind the prompt's (TRL's way), for a tokenizer whose merges cross the boundary"),
    Option("force_gold", "--force-gold",
           help=f"retrieved modes ({', '.join(RETRIEVED_MODES)}), train split: the gold document replaces the "
                "lowest-ranked one when the retriever missed it (counted as forced_gold)"),
)


def build_rows(examples: Sequence[Example], docs_per_example: Sequence[Sequence[dict]], *, mode: str,
               tokenizer, settings: BuildSettings, components: Sequence[str] | None = None,
               answer_format: str = DEFAULT_ANSWER_FORMAT) -> tuple[list[dict], dict]:
    """Render, measure and apply the over-length policy to one mode's rows.

    Args:
        components: for a mixture mode, each example's drawn component (stored per row as
            ``doc_component``); None otherwise. An ``irrelevant`` row's answer is the format's
            answer that calls nothing.
        answer_format: the hub's (:data:`ratune.sources.formats.ANSWER_FORMATS`); it renders the
            prompt and the answer.
    Returns:
        ``(rows, counts)``; ``counts`` has ``rows``, ``shortened`` and ``dropped``.
    """
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    fmt = get_answer_format(answer_format)
    rows, shortened_n, dropped = [], 0, []
    for i, (ex, docs) in enumerate(zip(examples, docs_per_example)):
        completion = fmt.completion(ex, abstain=components is not None and components[i] == "irrelevant")
        prompt = fmt.prompt(ex, docs, max_document_tokens=settings.max_document_tokens, count_tokens=count)
        try:
            row = tokenize_row(tokenizer, prompt.user_turn, completion, system=prompt.system,
                               answer_tokenization=settings.answer_tokenization)
        except AnswerMerge as exc:
            raise AnswerMerge(f"{ex.hub} {ex.split} example line {ex.line}: {exc}") from None
        if len(row.input_ids) > settings.max_length:
            fitted = _fit_documents(ex, docs, completion, tokenizer, settings, count) if fmt.shortens_documents else None
            if fitted is None:
                dropped.append(ex.line)
                continue
            prompt, row = fitted
        shortened_n += prompt.shortened
        rows.append({
            "hub": ex.hub, "split": ex.split, "line": ex.line, "train_retriever": mode,
            "instruction": ex.instruction, "user_turn": prompt.user_turn, "completion": completion,
            **({"system": prompt.system} if prompt.system is not None else {}),
            "gold_api_call": document_name(ex.api), "document_api_calls": [document_name(d) for d in docs],
            "shortened": bool(prompt.shortened), "n_prompt_tokens": row.n_prompt_tokens,
            "n_completion_tokens": row.n_completion_tokens,
            **({"doc_component": components[i]} if components is not None else {}),
        })
    return rows, {"rows": len(rows), "shortened": shortened_n, "dropped": len(dropped), "dropped_lines": dropped}


def _fit_documents(ex: Example, docs: Sequence[dict], completion: str, tokenizer, settings: BuildSettings, count
                   ) -> tuple[Prompt, object] | None:
    """An over-long APIBench row with its documents cut to the room left, ``(prompt, tokenized row)``;
    None when it cannot fit (no documents, or under :data:`MIN_DOCUMENT_TOKENS` each)."""
    if not docs:
        return None
    base = len(tokenize_row(tokenizer, build_user_turn(ex.instruction, ""), completion,
                           answer_tokenization=settings.answer_tokenization).input_ids)
    room = (settings.max_length - base) // len(docs)
    # shorten each document to the room left, then re-check (tokenization is not additive)
    while room >= MIN_DOCUMENT_TOKENS:
        parts = [shorten_document(d, room, count)[0] for d in docs]
        user_turn = build_user_turn(ex.instruction, join_documents(parts))
        row = tokenize_row(tokenizer, user_turn, completion, answer_tokenization=settings.answer_tokenization)
        if len(row.input_ids) <= settings.max_length:
            return Prompt(user_turn=user_turn, shortened=True), row
        room -= 8
    return None


def require_rows(counts: dict, *, split: str, mode: str, settings: BuildSettings) -> None:
    """Refuse a split and mode whose every row the over-length policy dropped (an empty dataset
    would be saved and marked complete, and training or eval would find nothing).

    Raises:
        RatuneError: naming the split, the mode, the counts and the setting to raise.
    """
    if counts["rows"] == 0:
        raise RatuneError(f"{split} split, mode {mode}: all {counts['dropped']} rows are longer than --max-length "
                          f"{settings.max_length} tokens even with their documents shortened (over-length policy); "
                          "raise --max-length (or lower --max-document-tokens)")


def retrieve_for_mode(mode: str, examples: Sequence[Example], *, hub: str | Hub, apibench_dir, top_k: int,
                      retriever_cache: dict, dense_model: str | None = None,
                      bm25_backend: str = DEFAULT_BM25_BACKEND) -> list[list[dict]]:
    """Documents per example for a train-time mode (none -> [], oracle -> [gold], else top_k);
    ``hub`` is a hub name or a :class:`~ratune.hubs.Hub` (:func:`make_retriever`)."""
    if mode not in retriever_cache:
        retriever_cache[mode] = make_retriever(mode, hub=hub, apibench_dir=apibench_dir, bm25_backend=bm25_backend,
                                               dense_model=dense_model if RETRIEVERS[mode].needs_model else None)
    return retriever_cache[mode].retrieve([Query.of(e) for e in examples], top_k=1 if mode == "oracle" else top_k)


def force_gold_documents(examples: Sequence[Example], docs_per_example: Sequence[Sequence[dict]]
                         ) -> tuple[list[list[dict]], int]:
    """Put each example's gold document in place of its lowest-ranked retrieved one when the
    retrieval missed it (compared by API identity); returns ``(docs, how many were replaced)``."""
    out, forced = [], 0
    for ex, docs in zip(examples, docs_per_example):
        docs = list(docs)
        if docs and api_identity(ex.api) not in {api_identity(d) for d in docs}:
            docs[-1] = ex.api
            forced += 1
        out.append(docs)
    return out, forced


def _percentiles(values: list[int]) -> dict:
    import numpy as np

    if not values:
        return {}
    arr = np.asarray(values)
    return {f"p{p}": int(np.percentile(arr, p, method="nearest")) for p in (50, 90, 95, 99, 100)}


def build_dataset(*, apibench_dir=None, hub: str | Hub, out_dir, tokenizer, tokenizer_name: str,
                  modes: Sequence[str] = DEFAULT_MODES, settings: BuildSettings = BuildSettings(),
                  lenient: bool = False, overwrite: bool = False, progress: bool = True,
                  leakage: str = "error", mixtures: Sequence = (), utility_keep: dict | None = None,
                  utility_meta: dict | None = None, reuse_if_same: bool = False) -> dict:
    """Build the chats for every split the hub has and every mode; write datasets and manifest.

    Args:
        apibench_dir: the APIBench folder, for an APIBench hub (None: found as
            :func:`~ratune.sources.apibench.resolve_apibench_dir` does); unused for a catalog.
        hub: torchhub, huggingface or tensorflowhub (only TorchHub has a train split here), a
            catalog folder with its pairs split (``ratune catalog pairs``), or a
            :class:`~ratune.hubs.Hub` (:func:`ratune.hubs.resolve_hub`).
        out_dir: output folder; refused when it holds a previous build unless ``overwrite``.
            Built in a temporary sibling (:class:`ratune.output.StageOutput`) and swapped in
            when complete, so a failed or interrupted rebuild leaves the previous build as it was.
        tokenizer: the tokenizer used to measure lengths (the training model's), with the chat
            template training will use (:func:`ratune.sources.prompt.use_chat_template`); its registry
            name (None: the tokenizer's own) is recorded as ``settings.chat_template``.
        tokenizer_name: recorded in the manifest.
        modes: train-time retrieval modes to build.
        settings: see :class:`BuildSettings`.
        lenient: write unparseable rows to ``rejects.jsonl`` and count them instead of failing.
        leakage: what to do with eval instructions found in the training data
            (:func:`ratune.sources.validate.validate_splits`): ``error`` (default), ``drop`` the
            leaked training rows, or ``allow``. Duplicate training examples are always removed.
        mixtures: :class:`ratune.data.mixture.Mixture` objects; each builds the mode ``mix-NAME``.
        utility_keep: ``{(line, mode): keep}`` from :func:`ratune.data.utility.load_utility`: a
            mixture's oracle / top1 document is kept only where True
            (:func:`ratune.data.mixture.apply_utility_filter`); ``utility_meta`` is recorded.
        reuse_if_same: keep a complete build in ``out_dir`` whose manifest records the same
            :func:`build_request` and every mode asked for (returning its manifest); otherwise
            build as with ``overwrite``. What a sweep passes: a build is reused only when nothing
            that decides its rows changed (a changed setting, tokenizer, mixture or input file
            rebuilds it; before, a sweep kept any complete build that had the modes).
    Returns:
        The manifest (also written to ``out_dir/manifest.json``).
    Raises:
        InputError: on a bad input row (file:line field), unless lenient.
        RatuneError: a tokenizer without a chat template, unknown mode, two mixtures with one
            name, an existing output folder without ``overwrite``, or one that is not a ratune
            data build (:class:`ratune.output.StageOutput`; never deleted, with or without
            ``overwrite``).
        LockHeld: another process is writing ``out_dir`` (:mod:`ratune.locks`).
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
    needs_model = [m for m in [*modes, *(x.top1_retriever for x in mixtures)] if RETRIEVERS[m].needs_model]
    if needs_model:
        require_finetuned_retriever(settings.dense_model, source.name, f"the {needs_model[0]} mode")
    final = Path(out_dir)
    output = StageOutput(final, DATA_BUILD_STAGE, replace=True, action="overwrite")
    output.check()  # a user's folder: refused, --overwrite or not
    request = build_request(source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, settings=settings,
                            lenient=lenient, leakage=leakage, mixtures=mixtures, utility_meta=utility_meta)
    if reuse_if_same:
        reused = _same_build(final, request, [*modes, *mixture_modes])
        if reused is not None:
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
            **({"validation_fraction": settings.validation_fraction, "validation_by": settings.validation_by,
                "validation_seed": settings.validation_seed} if settings.validation_fraction else {})}


def _hold_out_validation(splits: dict, settings: BuildSettings) -> dict | None:
    """Carve the ``validation`` split out of ``splits["train"]`` (in place) when asked
    (:func:`ratune.sources.validate.hold_out`); returns the manifest's ``validation_split`` record
    (the rule, the held-out example lines, the APIs, and the near-duplicate rate of validation and
    eval instructions against the remaining training ones), else None.

    Raises:
        RatuneError: a validation split asked for a hub without training examples, or one that holds out nothing.
    """
    if settings.validation_fraction is None:
        return None
    if "train" not in splits:
        raise RatuneError("--validation-fraction: the hub has no training examples to hold a validation split out of")
    train, held = hold_out(splits["train"], settings.validation_fraction, by=settings.validation_by,
                           seed=settings.validation_seed)
    splits["train"], splits["validation"] = train, [dataclasses.replace(e, split="validation") for e in held]
    trained = {api_identity(e.api) for e in train}
    apis = {api_identity(e.api) for e in held}
    return {"fraction": settings.validation_fraction, "by": settings.validation_by, "seed": settings.validation_seed,
            "n": len(held), "lines": [e.line for e in held], "apis": len(apis), "apis_also_trained": len(apis & trained),
            "near_duplicates": {"validation": near_duplicate_rate(train, held),
                                **({"eval": near_duplicate_rate(train, splits["eval"])} if "eval" in splits else {})}}


def build_request(source: Hub, *, tokenizer, tokenizer_name: str, settings: BuildSettings, lenient: bool,
                  leakage: str, mixtures: Sequence, utility_meta: dict | None) -> dict:
    """Everything that decides a build's rows besides its modes, as JSON: ratune's version (its
    prompt format and row building), the settings (:func:`settings_record`), the tokenizer's name
    and, for a local tokenizer folder, its files' sha256 (``TOKENIZER_FOLDER_FILES``), the sha256
    of the chat template the rows are rendered with (the tokenizer's own or a named one: a template
    edited in place under the same name changes it), the leakage policy, ``lenient``, each
    mixture's definition, the utility filter with its file's sha256, the finetuned retriever's
    weights (sha256 of its safetensors files) when ``dense_model`` is set, and the sha256 of every
    input file (the hub's API documents and example files; a catalog's record). Recorded as the
    manifest's ``request``; ``reuse_if_same`` (:func:`build_dataset`) compares it."""
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
    mode of ``modes``; else None (no build, an unfinished one, one from before ``request`` was
    recorded, or another request)."""
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


def _build_into(output: StageOutput, *, source: Hub, tokenizer, tokenizer_name: str, modes: Sequence[str],
                settings: BuildSettings, lenient: bool, progress: bool, leakage: str, mixtures: Sequence,
                utility_keep: dict | None, utility_meta: dict | None, request: dict) -> dict:
    """The build of :func:`build_dataset` (its arguments were checked), written into ``output``'s folder."""
    from datasets import Dataset, DatasetDict
    from tqdm.auto import tqdm


    out = output.folder
    mixture_modes = [m.mode for m in mixtures]
    report = ParseReport()
    splits = {}
    hub = source.name
    for split in SPLITS:
        if source.examples_file(split).exists():
            splits[split] = source.load_examples(split, lenient=lenient, report=report)
    if not splits:
        source.load_examples(SPLITS[0])  # every kind's error names the missing file and how to make it
        raise RatuneError(f"{source.root}: no example files for hub {hub}")
    read_counts = {s: len(e) for s, e in splits.items()}
    database = source.load_api_database()
    splits, validation = validate_splits(
        splits, database,
        train_path=source.examples_file("train"), eval_path=source.examples_file("eval"),
        leakage=leakage)
    hub_splits = list(splits)  # the hub's own files (the manifest hashes them)
    held_out = _hold_out_validation(splits, settings)
    if progress:
        print(validation.summary())
        if held_out:
            print(f"validation split: {held_out['n']} of the training examples ({held_out['by']}, seed "
                  f"{held_out['seed']}); near-duplicates of training: validation {held_out['near_duplicates']['validation']:.1%}"
                  + (f", eval {held_out['near_duplicates']['eval']:.1%}" if "eval" in held_out["near_duplicates"] else ""))

    cache: dict = {}
    counts: dict = {}
    lengths: dict = {}
    for mode in tqdm(modes, desc=f"build {hub}", disable=not progress):
        dd = {}
        for split, examples in splits.items():
            docs = retrieve_for_mode(mode, examples, hub=source, apibench_dir=source.root, top_k=settings.top_k,
                                     retriever_cache=cache, dense_model=settings.dense_model,
                                     bm25_backend=settings.bm25_backend)
            forced = 0
            if settings.force_gold and split == "train" and mode in RETRIEVED_MODES:
                docs, forced = force_gold_documents(examples, docs)
            rows, c = build_rows(examples, docs, mode=mode, tokenizer=tokenizer, settings=settings,
                                 answer_format=source.answer_format)
            require_rows(c, split=split, mode=mode, settings=settings)
            if settings.force_gold and mode in RETRIEVED_MODES:
                c["forced_gold"] = forced
            counts.setdefault(split, {})[mode] = c
            lengths.setdefault(split, {})[mode] = _percentiles(
                [r["n_prompt_tokens"] + r["n_completion_tokens"] for r in rows])
            dd[split] = Dataset.from_list(rows)
        DatasetDict(dd).save_to_disk(str(out / mode))

    mixture_records = {}
    for mixture in mixtures:
        record, dd = mixture.metadata(), {}
        for split, examples in splits.items():
            top1 = retrieve_for_mode(mixture.top1_retriever, examples, hub=source, apibench_dir=source.root, top_k=1,
                                     retriever_cache=cache, dense_model=settings.dense_model,
                                     bm25_backend=settings.bm25_backend)
            docs, drawn = draw_documents(mixture, split=split, gold_docs=[e.api for e in examples], top1_docs=top1,
                                         database=database)
            if utility_keep is not None and split == "train":
                docs, drawn, filtered = apply_utility_filter(mixture, [e.line for e in examples], docs, drawn,
                                                             utility_keep)
                record["utility_filter"] = {**(utility_meta or {}), **filtered}
            rows, c = build_rows(examples, docs, mode=mixture.mode, tokenizer=tokenizer, settings=settings,
                                 components=drawn, answer_format=source.answer_format)
            require_rows(c, split=split, mode=mixture.mode, settings=settings)
            counts.setdefault(split, {})[mixture.mode] = c
            lengths.setdefault(split, {})[mixture.mode] = _percentiles(
                [r["n_prompt_tokens"] + r["n_completion_tokens"] for r in rows])
            record.setdefault("realised", {})[split] = {
                "drawn": realised_shares(drawn), "kept": realised_shares([r["doc_component"] for r in rows])}
            dd[split] = Dataset.from_list(rows)
        DatasetDict(dd).save_to_disk(str(out / mixture.mode))
        mixture_records[mixture.mode] = record
        if progress:
            shares = record["realised"].get("train", next(iter(record["realised"].values())))["drawn"]
            print(f"{mixture.mode}: " + ", ".join(f"{k} {100 * v['share']:.1f} %" for k, v in shares.items()))

    if report.rejects:
        import json

        with atomic_write(out / "rejects.jsonl") as fh:
            for path, line, fieldname, reason in report.rejects:
                fh.write(json.dumps({"file": path, "line": line, "field": fieldname, "reason": reason}) + "\n")
    inputs = source.input_files(hub_splits)
    manifest = base_manifest(DATA_BUILD_STAGE)
    manifest.update({
        "hub": hub, "modes": [*modes, *mixture_modes], "mixtures": mixture_records, "splits": {s: len(e) for s, e in splits.items()},
        "rows_read": read_counts, "validation": validation.to_manifest(),
        **({"validation_split": held_out} if held_out else {}),
        "counts": counts, "token_lengths": lengths, "rejects": len(report.rejects),
        "settings": settings_record(settings, tokenizer),
        "tokenizer": tokenizer_name, "inputs": input_hashes(inputs), "request": request,
        "retrievers": {m: r.metadata() for m, r in cache.items()},
        **({"answer_format": source.answer_format} if source.answer_format != DEFAULT_ANSWER_FORMAT else {}),
    })
    record = source.manifest_record()
    if record is not None:  # a hub with nothing beyond its name and files (APIBench) adds no key
        manifest[source.kind] = record
    write_json(out / "manifest.json", manifest)
    output.complete()
    return manifest


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
                print(f"{split:5s} {mode:7s} rows {c['rows']:5d}  shortened {c['shortened']:5d}  dropped {c['dropped']:4d}")
        print(f"wrote {args.out}")
    return 0
