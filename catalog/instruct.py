"""``ratune catalog instruct``: instruction pairs for a catalog, written by a model from seed
examples (Gorilla, section 3.1, self-instruct); the prompt, the filters and the files written are
in docs/catalogs.md, "Generate instructions".
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ratune.args import bounded, checked, input_dir, input_file, model_ref
from ratune.catalog.folder import read_catalog_manifest
from ratune.catalog.pairs import INSTRUCT_STAGE, SIDECAR_SUFFIX, Pair, instruct_sidecar, load_pairs, sidecar_path
from ratune.catalog.schema import APIS_FILE, API_CALL, API_NAME, load_catalog, parse_api_call
from ratune.config import Count, Seed
from ratune.sources.prompt import encode_prompt, serialize_document
from ratune.sources.validate import normalise
from ratune.errors import RatuneError
from ratune.io import sha256_file, write_json, write_text
from ratune.output import StageOutput
from ratune.manifest import base_manifest
from ratune.models import left_padded

#: Instructions asked for per API (the paper's 10).
DEFAULT_PER_API = 10
#: Seed examples shown in each API's prompt (the paper samples 3 of 6 per API).
SEEDS_PER_PROMPT = 3
#: An instruction with fewer whitespace-separated words is dropped (``too_short``).
MIN_WORDS = 4
#: Why a candidate was dropped, in the order the filters run (docs/catalogs.md).
DROP_REASONS = ("empty", "names_api", "too_short", "copies_prompt", "copies_seed", "duplicate", "beyond_per_api")

#: The label of an instruction in :data:`EXAMPLE_TEMPLATE`; stripped when a model's line repeats it.
REQUEST_LABEL = "Request:"
#: One seed example in the prompt: its instruction and its API's document.
EXAMPLE_TEMPLATE = REQUEST_LABEL + " {instruction}\nAPI document: {document}"
#: The generation prompt (Gorilla, section 3.1, "self-instruct"). Fields: ``{examples}`` (the seeds,
#: each :data:`EXAMPLE_TEMPLATE`, a blank line between), ``{document}`` (serialized), ``{n}``.
PROMPT_TEMPLATE = (
    "You write requests that a user gives to a programming assistant. Each request describes a task that "
    "one API solves.\n\n"
    "Examples of requests and the API document each one needs:\n\n"
    "{examples}\n\n"
    "The API document to write requests for: {document}\n\n"
    "Write {n} different requests a user could give that this API solves. Write one request per line. "
    "Do not name the API or its function in a request."
)

#: Consecutive words of the prompt's own text that make a candidate ``copies_prompt`` (five: no
#: ordinary request shares them by chance).
PROMPT_ECHO_WORDS = 5


def _word_runs(text: str, k: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.casefold())
    return {tuple(words[i:i + k]) for i in range(len(words) - k + 1)}


#: The runs of :data:`PROMPT_ECHO_WORDS` words of the prompt's text between placeholders.
_PROMPT_RUNS = frozenset(run for part in re.split(r"\{\w+\}", PROMPT_TEMPLATE)
                         for run in _word_runs(part, PROMPT_ECHO_WORDS))


def echoes_prompt(text: str) -> bool:
    """Whether a candidate repeats :data:`PROMPT_ECHO_WORDS` words of the prompt's own text (case
    and punctuation ignored) or a serialized document's ``"api_name"`` key."""
    return f'"{API_NAME}"' in text or not _PROMPT_RUNS.isdisjoint(_word_runs(text, PROMPT_ECHO_WORDS))


#: A candidate's leading list marker: a bullet, a heading, or a number (not the ``1`` of ``1.5``).
_MARKER = re.compile(r"^(?:[-*+\u2022]\s+|#+\s*|\(\d{1,3}\)\s*|\d{1,3}[.):](?!\d)\s*)")
_QUOTES = ("\"\"", "''", "\u201c\u201d")

#: Generation: one output text per prompt text (the user turns of :func:`render_prompt`), in order.
Generate = Callable[[Sequence[str]], list[str]]


def render_example(instruction: str, document: dict) -> str:
    """One seed example: :data:`EXAMPLE_TEMPLATE` with the instruction and the serialized document."""
    return EXAMPLE_TEMPLATE.format(instruction=instruction, document=serialize_document(document))


def render_prompt(document: dict, examples: Sequence[tuple[str, dict]], n: int) -> str:
    """The user turn for one API's ``document``: :data:`PROMPT_TEMPLATE` with the seeds'
    ``(instruction, document)`` ``examples`` and ``n`` instructions asked for."""
    return PROMPT_TEMPLATE.format(examples="\n\n".join(render_example(i, d) for i, d in examples),
                                  document=serialize_document(document), n=n)


def choose_seeds(seeds: Sequence[Pair], api_name: str, seed: int, k: int = SEEDS_PER_PROMPT) -> list[Pair]:
    """The seeds shown in ``api_name``'s prompt: ``min(k, len(seeds))`` of them, drawn with
    ``random.Random(f"{seed}:{api_name}")`` (independent of the other APIs), in file order."""
    chosen = random.Random(f"{seed}:{api_name}").sample(range(len(seeds)), min(k, len(seeds)))
    return [seeds[i] for i in sorted(chosen)]


def parse_lines(text: str) -> list[str]:
    """One candidate per non-blank output line, stripped of a leading list marker,
    :data:`REQUEST_LABEL` and surrounding quotes (``""`` for a line that was only a marker)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        line = _MARKER.sub("", line, count=1).strip()
        if line.casefold().startswith(REQUEST_LABEL.casefold()):
            line = line[len(REQUEST_LABEL):].strip()
        while len(line) >= 2 and any(line[0] == a and line[-1] == b for a, b in _QUOTES):
            line = line[1:-1].strip()
        out.append(line)
    return out


def api_names_of(document: dict) -> tuple[str, ...]:
    """The names an instruction must not contain: the api_name and the last dotted part of the
    api_call's callee (one name when they are the same)."""
    callee, _ = parse_api_call(document[API_CALL])
    last = callee.rsplit(".", 1)[-1]
    return (document[API_NAME],) if last == document[API_NAME] else (document[API_NAME], last)


def names_api(text: str, document: dict) -> bool:
    """Whether ``text`` contains one of :func:`api_names_of` as a whole word (not inside a longer
    identifier), case-insensitive."""
    return any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, flags=re.IGNORECASE)
               for name in api_names_of(document))


@dataclass(frozen=True)
class Dropped:
    """A candidate instruction that was not kept, with its API and one of :data:`DROP_REASONS`."""

    api_name: str
    text: str
    reason: str

    def to_json(self) -> dict:
        return {"api_name": self.api_name, "text": self.text, "reason": self.reason}


@dataclass
class Filtered:
    """What :func:`filter_candidates` kept (``(api_name, instruction)``) and dropped, in input
    order, and ``{api_name: {"generated", "kept"}}``."""

    kept: list[tuple[str, str]]
    dropped: list[Dropped]
    per_api: dict[str, dict[str, int]]

    @property
    def generated(self) -> int:
        """Candidates seen: ``len(kept) + len(dropped)``."""
        return len(self.kept) + len(self.dropped)

    def counts(self) -> dict:
        """``{"generated", "kept", "dropped": {reason: n for every reason in DROP_REASONS}}``."""
        by_reason = {reason: 0 for reason in DROP_REASONS}
        for d in self.dropped:
            by_reason[d.reason] += 1
        return {"generated": self.generated, "kept": len(self.kept), "dropped": by_reason}


def filter_candidates(candidates: Sequence[tuple[dict, Sequence[str]]], seeds: Sequence[Pair], *,
                      per_api: int, min_words: int = MIN_WORDS) -> Filtered:
    """Run the filters in :data:`DROP_REASONS` order over ``(document, parse_lines output)`` per
    API, keeping at most ``per_api`` per API; fewer than ``min_words`` words is ``too_short``."""
    seed_keys = {normalise(s.instruction) for s in seeds}
    kept_keys: set[str] = set()
    result = Filtered([], [], {})
    for document, lines in candidates:
        api_name = document[API_NAME]
        counts = result.per_api.setdefault(api_name, {"generated": 0, "kept": 0})
        for text in lines:
            counts["generated"] += 1
            key = normalise(text)
            if not key:
                reason = "empty"
            elif names_api(text, document):
                reason = "names_api"
            elif len(text.split()) < min_words:
                reason = "too_short"
            elif echoes_prompt(text):
                reason = "copies_prompt"
            elif key in seed_keys:
                reason = "copies_seed"
            elif key in kept_keys:
                reason = "duplicate"
            elif counts["kept"] >= per_api:
                reason = "beyond_per_api"
            else:
                kept_keys.add(key)
                counts["kept"] += 1
                result.kept.append((api_name, text))
                continue
            result.dropped.append(Dropped(api_name, text, reason))
    return result


def check_output(out: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Refuse an ``--out`` that must not be written: an existing file passes only with
    ``overwrite`` and a sidecar showing that ``catalog instruct`` wrote it, unedited.

    Raises:
        RatuneError: naming the path: a folder, a file without ``overwrite``, a file or sidecar
            ratune did not write, a file edited since.
        InputError: a sidecar that is not a JSON object.
    """
    out = Path(out)
    sidecar = sidecar_path(out)
    if out.is_dir():
        raise RatuneError(f"{out}: is a folder; --out is the pairs file to write")
    owned = instruct_sidecar(out)
    if out.exists():
        if not overwrite:
            raise RatuneError(f"{out}: exists; give --overwrite to replace it (only a file `ratune {INSTRUCT_STAGE}` "
                              f"wrote, as {sidecar.name} beside it records)")
        if owned is None:
            raise RatuneError(f"{out}: not written by `ratune {INSTRUCT_STAGE}` (no {sidecar.name} of it beside it); "
                              "ratune does not overwrite files it did not create: choose another --out")
        recorded = owned.get("output") or {}
        if sha256_file(out) not in (recorded.get("sha256"), recorded.get("replaces_sha256")):
            raise RatuneError(f"{out}: changed since `ratune {INSTRUCT_STAGE}` wrote it (its sha256 is not the one "
                              f"in {sidecar.name}); ratune does not overwrite your edits: choose another --out, or "
                              "move the file away yourself")
    elif sidecar.exists() and owned is None:
        raise RatuneError(f"{sidecar}: exists and is not a `ratune {INSTRUCT_STAGE}` manifest; ratune does not "
                          "overwrite files it did not create: choose another --out")


def _generate_texts(prompts: list[str], generate: Generate, batch_size: int, desc: str, progress: bool) -> list[str]:
    """One output text per prompt, ``batch_size`` prompts per ``generate`` call, under a tqdm bar."""
    from tqdm.auto import tqdm

    texts: list[str] = []
    with tqdm(total=len(prompts), desc=desc, unit="API", disable=not progress) as bar:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            outputs = list(generate(batch))
            if len(outputs) != len(batch):
                raise RatuneError(f"the generator returned {len(outputs)} texts for {len(batch)} prompts")
            texts.extend(outputs)
            bar.update(len(batch))
    return texts


def _pairs_text(kept: list[tuple[str, str]], by_name: dict[str, dict]) -> str:
    """The pairs file: one ``{"instruction", "api_name", "api_call"}`` line per kept instruction."""
    return "".join(json.dumps({"instruction": instruction, "api_name": api_name,
                               "api_call": by_name[api_name][API_CALL]}, ensure_ascii=False) + "\n"
                   for api_name, instruction in kept)


def _write_with_sidecar(out: Path, lines: str, pairs: int, manifest: dict) -> None:
    """Write the sidecar, naming the file it replaces, then the file: a rerun after a fault between
    the two may replace it (:func:`check_output`)."""
    manifest["output"] = {"path": str(out), "sha256": hashlib.sha256(lines.encode("utf-8")).hexdigest(),
                          "pairs": pairs}
    if out.exists():
        manifest["output"]["replaces_sha256"] = sha256_file(out)
    write_json(sidecar_path(out), manifest)
    write_text(out, lines)


def instruct_catalog(catalog_dir: str | os.PathLike, seeds_path: str | os.PathLike, out: str | os.PathLike, *,
                     generate: Generate, generator: dict, sampling: dict | None = None,
                     per_api: int = DEFAULT_PER_API, seed: int = 0, batch_size: int = 8, overwrite: bool = False,
                     progress: bool = True) -> dict:
    """Generate, filter and write a catalog's instruction pairs to ``out``, and return the sidecar
    manifest written beside it (docs/catalogs.md, "Generate instructions").

    ``generate`` maps prompt texts to output texts (:func:`load_generator`, or a fake);
    ``generator`` and ``sampling`` are recorded; ``seed`` draws each prompt's seeds;
    ``batch_size`` prompts go to each ``generate`` call.

    Raises:
        RatuneError: a bad catalog, an ``out`` that must not be written (checked again before
            writing), ``generate`` returning the wrong number of texts.
        InputError: a bad seeds line or catalog document.
        LockHeld: another process writes ``out``.
    """
    out = Path(out)
    check_output(out, overwrite=overwrite)
    catalog = read_catalog_manifest(catalog_dir)
    documents = load_catalog(catalog_dir)
    seeds = load_pairs(seeds_path, documents)
    by_name = {doc[API_NAME]: doc for doc in documents}
    # a file with its sidecar: check_output is its ownership check; the output gives the lock
    with StageOutput(out, INSTRUCT_STAGE, known=True, claim=False, command=INSTRUCT_STAGE).writing():
        prompts = [render_prompt(doc, [(s.instruction, by_name[s.api_name])
                                       for s in choose_seeds(seeds, doc[API_NAME], seed)], per_api)
                   for doc in documents]
        texts = _generate_texts(prompts, generate, batch_size, f"instruct {catalog['name']}", progress)
        filtered = filter_candidates([(doc, parse_lines(text)) for doc, text in zip(documents, texts)], seeds,
                                     per_api=per_api)
        lines = _pairs_text(filtered.kept, by_name)
        manifest = {
            **base_manifest(INSTRUCT_STAGE), "kind": INSTRUCT_STAGE,
            "catalog": {"name": catalog["name"], "path": str(Path(catalog_dir).resolve()),
                        "apis_sha256": sha256_file(Path(catalog_dir) / APIS_FILE)},
            "generator": generator,
            "prompt": {"template": PROMPT_TEMPLATE, "example_template": EXAMPLE_TEMPLATE,
                       "seeds_per_prompt": SEEDS_PER_PROMPT, "per_api": per_api},
            "seeds": {"path": str(seeds_path), "sha256": sha256_file(seeds_path), "count": len(seeds)},
            "sampling": {**(sampling or {}), "seed": seed, "batch_size": batch_size},
            "filters": {"min_words": MIN_WORDS, "reasons": list(DROP_REASONS)},
            "counts": {"apis": len(documents), **filtered.counts(), "per_api": filtered.per_api},
            "dropped": [d.to_json() for d in filtered.dropped],
        }
        check_output(out, overwrite=overwrite)  # again: the file may have appeared while generating
        _write_with_sidecar(out, lines, len(filtered.kept), manifest)
    return manifest


def load_generator(model_path: str | os.PathLike, *, model: str | None = None, trust_remote_code: bool = False,
                   temperature: float = 0.7, max_new_tokens: int = 512, seed: int = 0,
                   dtype: str = "float32") -> tuple[Generate, dict, dict]:
    """``(generate, generator_record, sampling_record)`` of the causal LM in ``model_path``
    (safetensors, on the GPU when torch sees one), seeded once here. Each prompt is one user turn
    of the chat template (plain text without one); ``temperature`` 0 is greedy, above it pure
    temperature sampling (``top_k=0``, ``top_p=1.0``). ``model`` is what the user typed.

    Raises:
        RatuneError: naming the folder: it does not load, or its tokenizer has no EOS token.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, set_seed

    path = Path(model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype),
                                                  trust_remote_code=trust_remote_code, use_safetensors=True)
    except (OSError, ValueError) as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RatuneError(f"{path}: cannot load the generator model ({type(exc).__name__}: {first})") from None
    if tokenizer.eos_token_id is None:
        raise RatuneError(f"{path}: the tokenizer has no EOS token: generation would never stop")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lm.to(device).eval()
    chat = bool(getattr(tokenizer, "chat_template", None))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sample = temperature > 0
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, pad_token_id=pad_id,
                              eos_token_id=tokenizer.eos_token_id,
                              **({"temperature": temperature, "top_k": 0, "top_p": 1.0} if sample else {}))
    set_seed(seed)

    def generate(prompts: Sequence[str]) -> list[str]:
        encoded = [encode_prompt(tokenizer, p) if chat else tokenizer(p)["input_ids"] for p in prompts]
        input_ids, attention = left_padded(encoded, pad_id)
        width = input_ids.shape[1]
        with torch.inference_mode():
            out = lm.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                              generation_config=config)
        return [tokenizer.decode(row[width:].tolist(), skip_special_tokens=True) for row in out]

    local = path.is_dir()
    config_file = path / "config.json"
    record = {"model": model if model is not None else str(path), "path": str(path.resolve()) if local else str(path),
              "local": local, "config_sha256": sha256_file(config_file) if local and config_file.is_file() else None,
              "trust_remote_code": trust_remote_code, "dtype": dtype, "device": device,
              "chat_template": "tokenizer" if chat else None}
    sampling = {"do_sample": sample, "temperature": temperature, "top_k": 0 if sample else None,
                "top_p": 1.0 if sample else None, "max_new_tokens": max_new_tokens}
    return generate, record, sampling


def _check_output_text(text: str) -> str:
    if not text:
        raise RatuneError("an empty path")
    if Path(text).is_dir():
        raise RatuneError(f"{text}: is a folder; expected the pairs file to write")
    return text


def add_instruct_arguments(parser) -> None:
    """The arguments of ``ratune catalog instruct`` (docs/catalogs.md, "Generate instructions")."""
    from typing import Annotated

    from pydantic import Field

    parser.add_argument("--catalog", required=True, type=input_dir, help="a catalog folder (`ratune catalog import`)")
    parser.add_argument("--model", required=True, type=model_ref,
                        help="the instruction-following model that writes the instructions: a local model folder "
                             "or smollm2-135m-instruct")
    parser.add_argument("--seeds", required=True, type=input_file,
                        help="hand-written examples, JSON lines in the pairs format (instruction, api_name of a "
                             f"catalog API); {SEEDS_PER_PROMPT} of them are shown in each API's prompt")
    parser.add_argument("--out", required=True, type=checked(_check_output_text, "output file", good="new",
                                                             bad=("folder",)),
                        help=f"the generated pairs (JSON lines for `ratune catalog pairs --pairs`); the record "
                             f"of how they were made goes to OUT{SIDECAR_SUFFIX}")
    parser.add_argument("--per-api", type=bounded(Count, "per-api count"), default=DEFAULT_PER_API,
                        help=f"instructions asked for and kept at most per API (default {DEFAULT_PER_API}, as the "
                             "paper)")
    parser.add_argument("--seed", type=bounded(Seed, "seed"), default=0,
                        help="seed of the sampling and of each prompt's seed examples (default 0)")
    parser.add_argument("--max-new-tokens", type=bounded(Count, "max new tokens"), default=512,
                        help="generation limit per API (default 512)")
    parser.add_argument("--batch-size", type=bounded(Count, "batch size"), default=8,
                        help="prompts per generate call (default 8; part of what makes a rerun identical)")
    parser.add_argument("--temperature", type=bounded(Annotated[float, Field(ge=0, allow_inf_nan=False)],
                                                      "temperature"), default=0.7,
                        help="sampling temperature (default 0.7; 0 = greedy)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="let transformers run the model folder's own code (off by default)")
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace --out when this command wrote it (its {SIDECAR_SUFFIX} says so) and it "
                             "was not edited since")


def cli_instruct(args, *, resolve_model: Callable[[str], Path] | None = None) -> int:
    """``ratune catalog instruct``: check, load the model, generate, filter, write; print the counts.
    ``resolve_model`` maps ``--model`` to a folder (the CLI passes the alias resolver)."""
    check_output(args.out, overwrite=args.overwrite)  # cheap refusals before a model is converted or loaded
    load_pairs(args.seeds, load_catalog(args.catalog))
    model_path = resolve_model(args.model) if resolve_model is not None else Path(args.model)
    generate, generator, sampling = load_generator(model_path, model=args.model,
                                                   trust_remote_code=args.trust_remote_code,
                                                   temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                                   seed=args.seed)
    manifest = instruct_catalog(args.catalog, args.seeds, args.out, generate=generate, generator=generator,
                                sampling=sampling, per_api=args.per_api, seed=args.seed, batch_size=args.batch_size,
                                overwrite=args.overwrite)
    counts = manifest["counts"]
    drops = ", ".join(f"{reason} {n}" for reason, n in counts["dropped"].items() if n) or "none"
    print(f"instructions for catalog {manifest['catalog']['name']}: {counts['generated']} generated, "
          f"{counts['kept']} kept ({counts['apis']} APIs); dropped: {drops}")
    print(f"wrote {args.out} and {sidecar_path(args.out)}")
    if counts["kept"]:
        print(f"next: ratune catalog pairs --catalog {args.catalog} --pairs {args.out}")
    else:
        print("no instruction was kept: see the dropped candidates in the manifest")
    return 0
