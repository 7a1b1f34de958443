"""AST scoring of APIBench responses: the official Gorilla metric and ratune's strict metric.

Two metrics are computed for every response, both from the same extracted ``api_call`` string
and the same tree-sitter parse (nothing is ever executed or eval'd):

``gorilla``
    The official APIBench AST evaluation (gorilla/eval/eval-scripts/ast_eval_{th,hf,tf}.py at
    commit 6ea5797), reproduced quirk for quirk from ../shared/scoring/official_semantics.md
    (cited below as "semantics §N"): the api_call cut (§2), the right-to-left depth-first
    candidate list keyed by each node's first child (§3), the per-hub selection of reference
    arguments with single-quote stripping and skipped entries (§4), the candidate loop that falls
    through to the last candidate, substring matching and first-match-wins (§5), and the domain
    comparison with the eval line's ``api_data.domain`` (§6). The denominator is the number of
    responses (§1).

``strict``
    Ours: the call is correct only when it names the question's own gold API (the eval line's
    ``api_data.api_call``). Hallucination: it names nothing the hub's API database knows.
    Error: it names something the database knows, but not the gold API (or no call was given).
    The per-hub identity rules are in docs/scoring.md and in :func:`call_identity`.

Parser: py-tree-sitter 0.20.1 with the Python grammar of tree-sitter-languages 1.9.1 reproduces
the official outcome of all 14,200 released responses (semantics, preamble and §8); other
runtimes silently change up to 78 outcomes, so :func:`parser_versions` is reported with every
result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ratune.data.apibench import (HUBS, api_database_path, check_hub, examples_path,
                                  load_api_database, resolve_apibench_dir)
from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl

#: The three outcomes of a response, in report order. "error" is the paper's name for the
#: official scripts' "neither" (semantics §1).
OUTCOMES = ("correct", "hallucination", "error")

#: Metrics computed by :class:`Scorer` (``--metric`` chooses which the CLI prints).
METRICS = ("gorilla", "strict")

#: Distributions whose versions decide the parse (semantics, preamble and §8).
PARSER_DISTRIBUTIONS = ("tree-sitter", "tree-sitter-languages")

#: The versions that reproduce the official outcomes exactly (semantics preamble).
PINNED_PARSER = {"tree-sitter": "0.20.1", "tree-sitter-languages": "1.9.1"}

_PARSER = None
_NO_MATCH = 1 << 62


def parser_versions() -> dict:
    """``{distribution: version}`` of the parser stack (py-tree-sitter, tree-sitter-languages).

    Read with importlib.metadata; a missing distribution is reported as ``"not installed"``.
    Only tree-sitter 0.20.1 + tree-sitter-languages 1.9.1 (:data:`PINNED_PARSER`) is known to
    give the official outcomes (semantics §8).
    """
    out = {}
    for dist in PARSER_DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _parser():
    """The shared tree-sitter Python parser (created once; the official scripts create one per
    call, which gives the same trees because every parse starts from scratch)."""
    global _PARSER
    if _PARSER is None:
        try:
            from tree_sitter_languages import get_parser
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise RatuneError(
                "the scorer needs tree-sitter==0.20.1 and tree-sitter-languages==1.9.1 "
                f"(pip install tree-sitter==0.20.1 tree-sitter-languages==1.9.1): {exc}") from None
        _PARSER = get_parser("python")
    return _PARSER


def _encode(text: str) -> bytes:
    # The official scripts use bytes(s, 'utf8'), which raises on lone surrogates (possible from
    # JSON "\\ud800" escapes); we replace them with '?' instead (a defined outcome, no crash).
    return text.encode("utf-8", errors="replace")


def _parse(text: str):
    """Parse ``text`` as Python; returns ``(root_node, source_bytes)``. Never fails."""
    src = _encode(text)
    return _parser().parse(src).root_node, src


# --------------------------------------------------------------------------------------------
# Gorilla metric, step 1: the api_call string (semantics §2).

def extract_api_call(text, hub: str) -> str | None:
    """Cut the api_call string out of a response text exactly as the official scripts do.

    Semantics §2: split on the literal ``api_call``; without it, TorchHub gives None (the
    response is "error" and is never parsed) while HuggingFace / TensorFlow Hub use the whole
    text. Otherwise take the piece up to the next ``api_call``, cut it at ``api_provider``, and
    slice from the first ``:`` + 2 (0 + 2 without a colon) to the last ``)`` inclusive (or to the
    last character exclusive without a ``)``).

    Args:
        text: the response's ``text``; a non-string (missing text) gives None.
        hub: one of HUBS.

    Returns:
        The api_call string, or None when there is nothing to parse.
    """
    if not isinstance(text, str):
        return None
    parts = text.split("api_call")
    if len(parts) == 1:
        return None if hub == "torchhub" else text
    seg = parts[1].split("api_provider")[0]
    start = seg.index(":") if ":" in seg else 0
    end = seg.rindex(")") if ")" in seg else -2
    return seg[start + 2:end + 1]


# --------------------------------------------------------------------------------------------
# Gorilla metric, step 2: the candidate list (semantics §3).

def _candidates(root, src: bytes):
    """The official candidate list, reduced to what matching reads (semantics §3 and §5).

    The official walk pops a stack (root first; a child is pushed only if it has children), so
    nodes are visited parent first, siblings right to left; each node's key is the text of its
    first child. Matching only ever uses the *first* candidate with a given key and the *last*
    candidate (fall-through), so this returns ``(first_node_by_key, last_node)``. Iterative: no
    recursion limit applies to deep trees.
    """
    first: dict[bytes, object] = {}
    last = root
    stack = [root]
    while stack:
        node = stack.pop()
        last = node
        children = node.children
        if children:
            c0 = children[0]
            key = src[c0.start_byte:c0.end_byte]
            if key not in first:
                first[key] = node
            for child in children:
                if child.child_count:
                    stack.append(child)
    return first, last


# --------------------------------------------------------------------------------------------
# Gorilla metric, step 3: the reference database (semantics §4).

def _reference(api_call: str, hub: str):
    """``(api_name, args)`` of one database api_call as the official ``get_args`` reads it, or
    None when the entry is skipped (no children, or no kept arguments; semantics §4).

    ``args`` are bytes with single quotes stripped from both ends (double quotes are kept).
    The official scripts crash on an empty api_call, a call node without a second child or a
    positional argument that their keyword branch cannot index; none occurs in APIBench, and
    here they are skipped (first two) or kept as full text (the last) instead.
    """
    root, src = _parse(api_call)
    if not root.children:
        return None
    node = root.children[0].children[0] if root.children[0].children else None
    if node is None or node.child_count == 0:
        return None
    kids = node.children
    api_name = src[kids[0].start_byte:kids[0].end_byte]
    args: list[bytes] = []
    if len(kids) > 1:
        for child in kids[1].children:
            ctext = src[child.start_byte:child.end_byte]
            gc = child.children
            if hub == "torchhub":
                if b"repo_or_dir" in ctext or b"model" in ctext:
                    value = gc[2] if len(gc) > 2 else child
                    args.append(src[value.start_byte:value.end_byte])
            elif hub == "huggingface":
                if b"=" in ctext:
                    value = gc[2] if len(gc) > 2 else child
                    args.append(src[value.start_byte:value.end_byte])
                elif ctext not in (b"(", b")", b","):
                    args.append(ctext)
            else:  # tensorflowhub
                if b"model=" in ctext or b"model =" in ctext:
                    value = gc[2] if len(gc) > 2 else child
                    args.append(src[value.start_byte:value.end_byte])
                elif ctext not in (b"(", b")", b","):
                    args.append(ctext)
    if not args:
        return None
    return api_name, tuple(a.strip(b"'") for a in args)


# --------------------------------------------------------------------------------------------
# Strict metric: what names an API.

#: Characters parsed from each loader name on (strict metric); longer calls do not occur in
#: APIBench, and the bound keeps 1 MB responses cheap.
STRICT_WINDOW = 1000

#: Loader-name occurrences tried per response before giving up (strict metric).
STRICT_MAX_TRIES = 50

_STRING_PREFIX = re.compile(rb"^[rRbBuU]*")
_WS = re.compile(rb"\s+")

#: HuggingFace keyword arguments that carry the model id of a non-pipeline loader, in priority
#: order (from the forms in api/huggingface_api.jsonl: from_pretrained, from_hparams(source=),
#: load_from_hub(repo_id=), Parrot(model_tag=), ...).
HF_MODEL_KEYWORDS = (b"pretrained_model_name_or_path", b"model_name_or_path", b"model", b"model_id",
                     b"model_name", b"model_tag", b"repo_id", b"source", b"checkpoint")


def _string_value(node, src: bytes) -> bytes | None:
    """Content of a plain string literal node (no f-string interpolation), else None."""
    if node.type != "string":
        return None
    for child in node.children:
        if child.type == "interpolation":
            return None
    text = src[node.start_byte:node.end_byte]
    text = text[_STRING_PREFIX.match(text).end():]
    for quote in (b'"""', b"'''", b'"', b"'"):
        if text.startswith(quote) and text.endswith(quote) and len(text) >= 2 * len(quote):
            return text[len(quote):-len(quote)]
    return None


def _value(node, src: bytes) -> bytes:
    """A string literal's content, else the expression's source text without whitespace (so the
    database's unquoted ``from_pretrained(runwayml/stable-diffusion-v1-5)`` still names a model)."""
    value = _string_value(node, src)
    if value is None:
        value = _WS.sub(b"", src[node.start_byte:node.end_byte])
    return value.strip()


def _call_parts(call, src: bytes):
    """``(function_text, positional_nodes, {keyword: value_node})`` of a ``call`` node."""
    fn = call.child_by_field_name("function")
    args = call.child_by_field_name("arguments")
    fn_text = _WS.sub(b"", src[fn.start_byte:fn.end_byte]) if fn is not None else b""
    positional, keywords = [], {}
    if args is not None and args.type == "argument_list":
        for child in args.named_children:
            if child.type == "keyword_argument":
                name = child.child_by_field_name("name")
                value = child.child_by_field_name("value")
                if name is not None and value is not None:
                    keywords.setdefault(src[name.start_byte:name.end_byte], value)
            elif child.type not in ("comment", "list_splat", "dictionary_splat"):
                positional.append(child)
    return fn_text, positional, keywords


def _th_repo(value: bytes) -> bytes:
    # 'owner/repo[:ref]': the ref (tag or branch) selects a version of the same repository;
    # APIBench itself writes pytorch/vision in api_call and pytorch/vision:v0.10.0 in
    # example_code for the same 33 APIs (docs/scoring.md).
    return value.split(b":", 1)[0].strip().rstrip(b"/")


#: TorchHub entry points whose *own first argument* is the model variant (strict metric):
#: ``(repository without :ref, entry point) -> keyword name of that argument``. For these, the
#: API is named by the variant, given as the next positional argument after the entry point
#: (or by that keyword), not by the entry point. The only one APIBench needs is MEAL-V2, whose
#: hubconf.py defines a single entry point ``meal_v2(model_name, pretrained=True, ...)``:
#: ``torch.hub.load('szq0214/MEAL-V2', 'meal_v2', 'mealv2_resnest50')`` loads
#: mealv2_resnest50, which the database writes ``torch.hub.load(repo_or_dir='szq0214/MEAL-V2',
#: 'meal_v2', model='mealv2_resnest50', pretrained=True)`` (api/torchhub_api.jsonl lines 88-94).
TORCHHUB_VARIANT_ENTRY_POINTS = {
    (b"szq0214/MEAL-V2", b"meal_v2"): b"model_name",
}


def _th_repo_model(positional, keywords, src: bytes):
    """``(repo, model)`` of a ``torch.hub.load`` call by torch.hub's argument order, or None
    without a repository (strict metric).

    ``torch.hub.load(repo_or_dir, model, *args, **kwargs)``: the keywords ``repo_or_dir=`` and
    ``model=`` fill their parameter; positional arguments fill the parameters left, in order
    (repo, then model); what remains goes to the entry point. So
    ``('pytorch/vision', 'resnet18', 'wide_resnet50_2')`` names resnet18. The one exception is
    :data:`TORCHHUB_VARIANT_ENTRY_POINTS`: there the variant (the entry point's first argument:
    its keyword, else the next positional argument) is the model. The database's MEAL-V2
    spelling ``(repo_or_dir=R, 'meal_v2', model=V)`` gives model V by the keyword rule already.
    The repository's ``:ref`` tag is dropped (:func:`_th_repo`).
    """
    rest = list(positional)
    repo = keywords.get(b"repo_or_dir")
    if repo is None:
        if not rest:
            return None
        repo = rest.pop(0)
    model = keywords.get(b"model")
    if model is None and rest:
        model = rest.pop(0)
    repo_v = _th_repo(_value(repo, src))
    model_v = _value(model, src) if model is not None else None
    variant_keyword = TORCHHUB_VARIANT_ENTRY_POINTS.get((repo_v, model_v))
    if variant_keyword is not None:
        variant = keywords.get(variant_keyword)
        if variant is None and rest:
            variant = rest[0]
        if variant is not None:
            model_v = _value(variant, src)
    return repo_v, model_v


def call_identity(hub: str, call, src: bytes) -> tuple | None:
    """``(primary_key, extra_keys)`` naming the API of one tree-sitter ``call`` node, or None
    when the call is not one of the hub's loaders (strict metric; rules in docs/scoring.md).

    * TorchHub: ``torch.hub.load`` with repo_or_dir and model in torch.hub's argument order
      (keyword, else the first and second positional arguments; :func:`_th_repo_model`), the
      variant for the entry points of :data:`TORCHHUB_VARIANT_ENTRY_POINTS`; the repo's
      ``:ref`` tag is ignored. Key ``("th", repo, model)``; a call also names the repo-only APIs
      (``("th", repo, None)``, database entries 81 and 82).
    * HuggingFace: ``pipeline(task, model=...)`` keys ``("pipeline", task, model)`` and also names
      ``("model", model)``; any other loader (``*.from_pretrained``, the database's own
      constructors) keys ``("model", model_id)``, the id being the first of
      :data:`HF_MODEL_KEYWORDS` or the first positional argument.
    * TensorFlow Hub: ``hub.KerasLayer`` / ``hub.load`` key ``("tf", loader, handle_url)``; the
      URL alone (``("url", handle)``) is also named, so a known handle with the wrong loader is an
      error, not a hallucination.
    """
    fn, positional, keywords = _call_parts(call, src)
    if hub == "torchhub":
        if fn != b"torch.hub.load":
            return None
        named = _th_repo_model(positional, keywords, src)
        if named is None:
            return None
        repo_v, model_v = named
        return ("th", repo_v, model_v), (("th", repo_v, None),)
    if hub == "tensorflowhub":
        name = fn.rsplit(b".", 1)
        if len(name) != 2 or name[0] not in (b"hub", b"tensorflow_hub") or name[1] not in (
                b"KerasLayer", b"load"):
            return None
        handle = keywords.get(b"handle", positional[0] if positional else None)
        if handle is None:
            return None
        url = _value(handle, src).rstrip(b"/")
        return ("tf", name[1], url), (("url", url),)
    # huggingface
    if fn == b"pipeline":
        task = keywords.get(b"task", positional[0] if positional else None)
        model = keywords.get(b"model")
        if model is None:
            rest = positional[1:] if b"task" not in keywords else positional
            model = rest[0] if rest else None
        if model is not None and model.type == "call":
            # pipeline(task, model=X.from_pretrained('id')): the inner call names the model
            # (one level only: no recursion on nested input).
            _, inner_pos, inner_kw = _call_parts(model, src)
            inner = next((inner_kw[kw] for kw in HF_MODEL_KEYWORDS if kw in inner_kw),
                         inner_pos[0] if inner_pos else None)
            model = inner if inner is not None else model
        task_v = _value(task, src) if task is not None else None
        model_v = _value(model, src) if model is not None else None
        if task_v is None and model_v is not None:
            return ("model", model_v), ()  # no task: the model id alone names the API
        return ("pipeline", task_v, model_v), ((("model", model_v),) if model_v else ())
    for kw in HF_MODEL_KEYWORDS:
        if kw in keywords:
            return ("model", _value(keywords[kw], src)), ()
    if positional:
        return ("model", _value(positional[0], src)), ()
    return ("call", fn + _WS.sub(b"", src[call.start_byte:call.end_byte])[len(fn):]), ()


def _iter_calls(root):
    """``call`` nodes of a tree in textual pre-order (outer before inner). Iterative."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "call":
            yield node
        if node.child_count:
            stack.extend(reversed(node.children))


_ESCAPED_QUOTE = re.compile(r"\\+(['\"])")
_ESCAPED_NEWLINE = re.compile(r"\\+n")


def normalize_call(api_call: str) -> str:
    """The extracted api_call as the strict metric parses it.

    Released responses often carry a layer or two of escaping inside the text (``\\'`` and
    ``\\"`` for quotes, ``\\n`` for newlines, e.g. TorchHub's ``'api_call': \\"model =
    torch.hub.load(\\'pytorch/vision\\', ...)``), which would turn every string literal into
    garbage. Backslash runs before a quote or ``n`` are undone, then trailing ``<`` and ``,``
    (remains of ``<<<api_provider>>>``) and surrounding whitespace and quotes are stripped.
    The gorilla metric never sees this (it parses the raw cut).
    """
    text = _ESCAPED_QUOTE.sub(r"\1", api_call)
    text = _ESCAPED_NEWLINE.sub("\n", text)
    text = text.strip().rstrip("<,").strip()  # remains of "\n<<<api_provider>>>" and separators
    return text.strip("'\"").strip()


def _text_key(text: str) -> tuple:
    return ("text", _WS.sub(b"", _encode(text)))


# --------------------------------------------------------------------------------------------
# The scorer.

@dataclass(frozen=True)
class ResponseScore:
    """The outcome of one response under both metrics.

    Attributes:
        api_call: the extracted api_call string (semantics §2), None when nothing was extracted
            (no text, or a TorchHub text without ``api_call``).
        gorilla: the official outcome, one of OUTCOMES.
        strict: ratune's strict outcome, one of OUTCOMES.
        matched_index: 0-based line of the API database that the gorilla metric matched, or None.
    """

    api_call: str | None
    gorilla: str
    strict: str
    matched_index: int | None


class Scorer:
    """Scores responses for one hub with the ``gorilla`` and ``strict`` metrics.

    Build it with :meth:`from_apibench` (reads ``api/{hub}_api.jsonl`` and the hub's eval file)
    or directly from already-loaded data. Every database api_call is parsed once here.

    Args:
        hub: one of HUBS.
        api_database: the API database documents in file order (``api_call``, ``domain``).
        eval_api_data: the eval file's ``api_data`` objects in file order; question_id k is
            element k-1 (semantics §6).

    Raises:
        RatuneError: unknown hub.
    """

    def __init__(self, hub: str, api_database: list[dict], eval_api_data: list[dict]):
        self.hub = check_hub(hub)
        self.api_database = api_database
        self.eval_api_data = eval_api_data
        # Gorilla references, deduplicated: a later entry with the same (api_name, args) can
        # never match when the earlier one did not, so only the first one is kept (same result,
        # fewer checks; TF lists universal-sentence-encoder/4 220 times).
        refs, seen = [], set()
        self.skipped_entries = []
        for index, doc in enumerate(api_database):
            ref = _reference(doc["api_call"], hub)
            if ref is None:
                self.skipped_entries.append(index)
                continue
            if ref in seen:
                continue
            seen.add(ref)
            refs.append((index, ref[0], ref[1][0], ref[1][1:]))
        self._refs = refs
        groups: dict = {}
        for index, api_name, head, rest in refs:
            groups.setdefault(api_name, []).append((index, head, rest))
        self._groups = sorted(((g[0][0], name, tuple(g)) for name, g in groups.items()),
                              key=lambda item: item[0])
        self._domains = [doc.get("domain") for doc in api_database]
        # Strict: the keys the database names, and each question's gold key.
        self._db_keys: set = set()
        self._hf_loaders: set = set()
        for doc in api_database:
            primary, extras, fn = self._identity_of_reference(doc["api_call"])
            self._db_keys.add(primary)
            if hub != "torchhub":  # TorchHub's repo-only key is only for repo-only entries
                self._db_keys.update(extras)
            if fn:
                self._hf_loaders.add(fn)
        self._loader_re = self._loader_pattern()
        self._gold = [self._identity_of_reference(api.get("api_call") or "")[0]
                      if isinstance(api, dict) else None for api in eval_api_data]

    @classmethod
    def from_apibench(cls, hub: str, apibench_dir=None) -> "Scorer":
        """Build a scorer from an APIBench folder (``api/{hub}_api.jsonl`` and the eval file).

        Args:
            hub: one of HUBS.
            apibench_dir: the folder; None resolves it with ``resolve_apibench_dir``.

        Raises:
            RatuneError: unknown hub, or missing folder/files.
            InputError: malformed database or eval lines (file and line named).
        """
        check_hub(hub)
        apibench_dir = resolve_apibench_dir(apibench_dir)
        db_path = api_database_path(apibench_dir, hub)
        eval_path = examples_path(apibench_dir, hub, "eval")
        for path in (db_path, eval_path):
            if not path.exists():
                raise RatuneError(f"{path}: not found (APIBench folder {apibench_dir})")
        database = load_api_database(db_path)
        eval_api_data = []
        for number, row in iter_jsonl(eval_path):
            api = row.get("api_data")
            if not isinstance(api, dict) or not isinstance(api.get("domain"), str):
                raise InputError(str(eval_path), number, "api_data.domain",
                                 "missing or not a string")
            eval_api_data.append(api)
        return cls(hub, database, eval_api_data)

    @property
    def n_questions(self) -> int:
        """Number of eval questions (valid question_ids are 1..n_questions)."""
        return len(self.eval_api_data)

    # -- strict identity ---------------------------------------------------------------------

    def _identity_of_reference(self, api_call: str):
        """``(primary_key, extra_keys, hf_function)`` of a database or gold api_call: its first
        call (outermost, textually first) that names an API, else its whitespace-free text."""
        root, src = _parse(api_call)
        for call in _iter_calls(root):
            ident = call_identity(self.hub, call, src)
            if ident is not None:
                fn = _call_parts(call, src)[0] if self.hub == "huggingface" else None
                return ident[0], ident[1], fn
        return _text_key(normalize_call(api_call)), (), None

    def _loader_pattern(self):
        """Regex finding where the first loader call of a response starts (strict metric)."""
        if self.hub == "torchhub":
            return re.compile(r"torch\s*\.\s*hub\s*\.\s*load\s*\(")
        if self.hub == "tensorflowhub":
            return re.compile(r"(?<![\w.])(?:tensorflow_)?hub\s*\.\s*(?:KerasLayer|load)\s*\(")
        names = sorted({fn.decode("utf-8", "replace") for fn in self._hf_loaders if fn},
                       key=len, reverse=True)
        alternatives = "".join("|" + re.escape(name) for name in names)
        return re.compile(r"(?<![\w.])(?:[\w.]*from_pretrained|pipeline" + alternatives + r")\s*\(")

    def _is_loader(self, call, src: bytes) -> bool:
        if self.hub != "huggingface":
            return True
        fn = _call_parts(call, src)[0]
        return fn == b"pipeline" or fn.endswith(b"from_pretrained") or fn in self._hf_loaders

    def strict_keys(self, api_call: str, parsed=None) -> set:
        """The API keys a response's extracted api_call names (strict metric, docs/scoring.md).

        The call is normalised (:func:`normalize_call`); at each occurrence of a loader name
        (``torch.hub.load``; ``hub.KerasLayer`` / ``hub.load``; ``*.from_pretrained``,
        ``pipeline`` or a constructor of the HuggingFace database), in text order, a window of
        :data:`STRICT_WINDOW` characters is parsed and its first loader call identified
        (:func:`call_identity`). The first such call with arguments gives the keys (prose often
        mentions ``AutoModel.from_pretrained()`` before the real call); failing that, the first
        loader call without arguments; failing that, the whitespace-free text itself (which is
        what names the database's shell-line entries such as ``./run.sh ...``).

        Args:
            api_call: the extracted string (:func:`extract_api_call`).
            parsed: ``(root, source)`` of ``api_call`` when already parsed (reused if the window
                is the whole string).
        """
        norm = normalize_call(api_call)
        fallback = None
        for tries, match in enumerate(self._loader_re.finditer(norm)):
            if tries == STRICT_MAX_TRIES:
                break
            window = norm[match.start():match.start() + STRICT_WINDOW]
            if parsed is not None and window == api_call:
                root, src = parsed
            else:
                root, src = _parse(window)
            keys, has_args = self._response_keys(root, src)
            if has_args:
                return keys
            if fallback is None and keys is not None:
                fallback = keys
        return fallback if fallback is not None else {_text_key(norm)}

    def _response_keys(self, root, src: bytes):
        """``(keys, has_arguments)`` of the first loader call of a window, ``(None, False)``
        when it holds none."""
        for call in _iter_calls(root):
            if not self._is_loader(call, src):
                continue
            ident = call_identity(self.hub, call, src)
            if ident is None:
                continue
            args = call.child_by_field_name("arguments")
            return {ident[0], *ident[1]}, bool(args is not None and args.named_child_count)
        return None, False

    # -- scoring -----------------------------------------------------------------------------

    def gorilla_match(self, api_call: str) -> tuple[int | None, bool]:
        """``(matched_index, fell_through)`` of an extracted api_call under the gorilla metric.

        ``matched_index`` is the 0-based database line that matched (semantics §5), None when none
        did (a hallucination). ``fell_through`` is True when the match was made on the last
        candidate because no candidate carried the entry's api_name (semantics §5.3).
        """
        root, src = _parse(api_call)
        return self._gorilla_match(root, src, details=True)

    def _gorilla_match(self, root, src: bytes, details: bool = False):
        """Index of the first database entry matching the parse (semantics §5), else None."""
        first, last = _candidates(root, src)
        # Entries are grouped by api_name (groups ordered by their first entry), so the searched
        # node's text is sliced once per group; the smallest matching index wins, exactly as the
        # official file-order loop (§5.5).
        best, best_fell, last_text = _NO_MATCH, False, None
        for min_index, api_name, group in self._groups:
            if min_index >= best:
                break
            node = first.get(api_name)
            if node is None:  # fall-through: the last candidate (§5.3)
                if last_text is None:
                    last_text = src[last.start_byte:last.end_byte]
                text = last_text
            else:
                text = src[node.start_byte:node.end_byte]
            for index, head, rest in group:
                if index >= best:
                    break
                if head in text:
                    for arg in rest:
                        if arg not in text:
                            break
                    else:
                        best, best_fell = index, node is None
                        break
        index = None if best == _NO_MATCH else best
        return (index, best_fell) if details else index

    def check_question_id(self, question_id) -> None:
        """Raise RatuneError unless question_id is an int in 1..n_questions.

        The official scripts read eval line ``question_id - 1``, so 0 silently means the last
        line and larger ids crash (semantics §6); ratune refuses both.
        """
        if isinstance(question_id, bool) or not isinstance(question_id, int) or not (
                1 <= question_id <= self.n_questions):
            raise RatuneError(f"question_id {question_id!r} out of range 1..{self.n_questions} "
                              f"for hub {self.hub}")

    def gold_api_call(self, question_id: int) -> str:
        """The gold api_call of a question (its eval line's ``api_data``; "" when it has none).

        Raises:
            RatuneError: question_id is not an int in 1..n_questions.
        """
        self.check_question_id(question_id)
        return self.eval_api_data[question_id - 1].get("api_call") or ""

    def score_text(self, text, question_id: int) -> ResponseScore:
        """Score one response text for question ``question_id`` (1-based eval line).

        A missing or non-string text is "error" under both metrics (semantics §2.1); so is a
        TorchHub text without ``api_call`` (semantics §2.2).

        Raises:
            RatuneError: question_id is not an int in 1..n_questions.
        """
        self.check_question_id(question_id)
        api_call = extract_api_call(text, self.hub)
        if api_call is None:
            return ResponseScore(None, "error", "error", None)
        root, src = _parse(api_call)
        index = self._gorilla_match(root, src)
        if index is None:
            gorilla = "hallucination"
        elif self._domains[index] == self.eval_api_data[question_id - 1].get("domain"):
            gorilla = "correct"
        else:
            gorilla = "error"
        keys = self.strict_keys(api_call, (root, src))
        if self._gold[question_id - 1] in keys:
            strict = "correct"
        elif keys & self._db_keys:
            strict = "error"
        else:
            strict = "hallucination"
        return ResponseScore(api_call, gorilla, strict, index)

    def names_api(self, text, api_call: str) -> bool:
        """Whether a response names the API of ``api_call`` (a database or gold api_call), by the
        strict metric's keys: the response's extracted call must carry the API's primary key.

        Used by the document-swap experiment (:mod:`ratune.eval.swap`) to tell whether an answer
        follows the given document or the memorised API. No call extracted: False.
        """
        extracted = extract_api_call(text, self.hub)
        if extracted is None:
            return False
        return self._identity_of_reference(api_call)[0] in self.strict_keys(extracted)

    def named_documents(self, text) -> list[int]:
        """0-based database lines whose API the response's call names (strict metric keys);
        [] when no call is extracted or it names no database API."""
        extracted = extract_api_call(text, self.hub)
        if extracted is None:
            return []
        if not hasattr(self, "_primary_keys"):
            self._primary_keys = [self._identity_of_reference(d["api_call"])[0] for d in self.api_database]
        keys = self.strict_keys(extracted)
        return [i for i, key in enumerate(self._primary_keys) if key in keys]

    def score(self, responses: list[dict]) -> dict:
        """Score a list of responses (dicts with ``question_id`` and ``text``).

        Returns:
            ``{"hub", "n", "gorilla": {...}, "strict": {...}, "parser": {...}, "per_question":
            [{"question_id", "gorilla", "strict"}]}`` where each metric block holds
            ``accuracy``, ``hallucination``, ``error`` (fractions of n, the number of responses:
            semantics §1) and ``correct_n``, ``hallucination_n``, ``error_n``.

        Raises:
            RatuneError: a question_id that is not an int in 1..n_questions.
        """
        counts = {m: dict.fromkeys(OUTCOMES, 0) for m in METRICS}
        per_question = []
        for response in responses:
            qid = response.get("question_id")
            result = self.score_text(response.get("text"), qid)
            counts["gorilla"][result.gorilla] += 1
            counts["strict"][result.strict] += 1
            per_question.append({"question_id": qid, "gorilla": result.gorilla,
                                 "strict": result.strict})
        n = len(responses)
        out = {"hub": self.hub, "n": n}
        for metric in METRICS:
            c = counts[metric]
            out[metric] = {
                "accuracy": c["correct"] / n if n else 0.0,
                "hallucination": c["hallucination"] / n if n else 0.0,
                "error": c["error"] / n if n else 0.0,
                "correct_n": c["correct"],
                "hallucination_n": c["hallucination"],
                "error_n": c["error"],
            }
        out["parser"] = parser_versions()
        out["per_question"] = per_question
        return out


# --------------------------------------------------------------------------------------------
# Response files.

def load_responses(path, n_questions: int | None = None) -> list[dict]:
    """Read a response JSONL file into ``[{"question_id", "text", "line"}]`` in file order.

    Blank lines are ignored. ``text`` is kept as read when it is a string and set to None
    otherwise (missing or non-string text is scored "error", as the official scripts count a
    response without text: semantics §2.1).

    Args:
        path: the JSONL file.
        n_questions: when given, question_ids must lie in 1..n_questions. The official scripts
            would read question_id 0 as the last eval line and crash on larger ids (semantics §6);
            ratune refuses both. The released files have no such id, so official numbers are
            unaffected.

    Raises:
        RatuneError: the file does not exist.
        InputError: naming file and line, for bytes that are not UTF-8, a line that is not a JSON
            object, and a question_id that is missing, not an int, duplicated or out of range; a
            file without any response.
    """
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: response file not found")
    out, seen = [], {}
    for number, obj in iter_jsonl(path):
        qid = obj.get("question_id")
        if "question_id" not in obj:
            raise InputError(str(path), number, "question_id", "missing")
        if isinstance(qid, bool) or not isinstance(qid, int):
            raise InputError(str(path), number, "question_id", f"expected an integer, got {qid!r}")
        if qid in seen:
            raise InputError(str(path), number, "question_id",
                             f"duplicate question_id {qid} (first on line {seen[qid]})")
        seen[qid] = number
        if n_questions is not None and not 1 <= qid <= n_questions:
            raise InputError(str(path), number, "question_id",
                             f"question_id {qid} out of range 1..{n_questions}")
        text = obj.get("text")
        out.append({"question_id": qid, "text": text if isinstance(text, str) else None,
                    "line": number})
    if not out:  # scoring nothing would report n = 0 with 0.0 rates
        raise InputError(str(path), None, None, "no responses (the file is empty)")
    return out


def check_question_ids(responses: list[dict], n_questions: int, path="<responses>") -> None:
    """Raise InputError (naming the line) for the first question_id outside 1..n_questions."""
    for response in responses:
        qid = response.get("question_id")
        if isinstance(qid, bool) or not isinstance(qid, int) or not 1 <= qid <= n_questions:
            raise InputError(str(path), response.get("line"), "question_id",
                             f"question_id {qid!r} out of range 1..{n_questions}")


# --------------------------------------------------------------------------------------------
# Which hub a response file is for.

#: Each hub's characteristic loader calls, as written in response texts (from the database
#: api_call forms: torch.hub.load; from_pretrained / pipeline; hub.KerasLayer / hub.load).
HUB_LOADERS = {
    "torchhub": re.compile(r"torch\.hub\.load\s*\("),
    "huggingface": re.compile(r"\.from_pretrained\s*\(|(?<![\w.])pipeline\s*\("),
    "tensorflowhub": re.compile(r"(?<!torch\.)(?<![\w])hub\.(?:KerasLayer|load)\s*\("),
}

#: Minimum number of responses naming another hub's loader before a file can be refused.
HUB_CHECK_MIN = 3


def hub_evidence(responses: list[dict]) -> dict:
    """``{hub: number of responses whose text calls that hub's loader}`` (see HUB_LOADERS)."""
    counts = dict.fromkeys(HUBS, 0)
    for response in responses:
        text = response.get("text")
        if isinstance(text, str):
            for hub, pattern in HUB_LOADERS.items():
                if pattern.search(text):
                    counts[hub] += 1
    return counts


def check_hub_matches(hub: str, responses: list[dict], scorer: "Scorer | None" = None,
                      path="<responses>") -> dict:
    """Refuse to score a response file that was written for another hub.

    Counts, per hub, the responses whose text calls that hub's loader (:data:`HUB_LOADERS`).
    The file is refused when another hub's loader is called in at least
    :data:`HUB_CHECK_MIN` responses and in more than half of the responses that call any
    loader while the named hub's loader is called in fewer. Question ids beyond the named hub's
    eval set (HuggingFace has 911 questions, TorchHub 186) are mentioned in the message.

    Returns:
        The evidence counts.

    Raises:
        RatuneError: with the counts, the likely hub and what to pass instead.
    """
    counts = hub_evidence(responses)
    own = counts[hub]
    other, other_n = max(((h, c) for h, c in counts.items() if h != hub), key=lambda hc: hc[1])
    any_n = sum(1 for r in responses if isinstance(r.get("text"), str)
                and any(p.search(r["text"]) for p in HUB_LOADERS.values()))
    if other_n >= HUB_CHECK_MIN and other_n > own and 2 * other_n > any_n:
        extra = ""
        if scorer is not None:
            ids = [r.get("question_id") for r in responses if isinstance(r.get("question_id"), int)]
            if ids and max(ids) > scorer.n_questions:
                extra = (f"; its question_ids go up to {max(ids)} while {hub} has "
                         f"{scorer.n_questions} questions")
        raise RatuneError(
            f"{path}: this looks like a {other} response file, not {hub}: {other_n} of "
            f"{len(responses)} responses call {other}'s loader, {own} call {hub}'s{extra}. "
            f"Pass --hub {other} (or --no-hub-check to score it as {hub} anyway)")
    return counts


# --------------------------------------------------------------------------------------------
# Command line.

def add_score_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``ratune eval score`` to ``parser`` (see :func:`cli_score`)."""
    from ratune.args import input_dir, input_file

    from ratune.data.hubs import hub_argument_type

    parser.add_argument("--hub", required=True, type=hub_argument_type(), metavar="HUB",
                        help=f"an APIBench hub ({', '.join(HUBS)}) or a catalog folder (its strict metric and "
                             "argument score; docs/catalogs.md)")
    parser.add_argument("--responses", required=True, type=input_file,
                        help="response JSONL file (question_id, text per line)")
    parser.add_argument("--apibench", default=None, type=input_dir,
                        help="APIBench folder (default: $RATUNE_APIBENCH or ../shared/apibench)")
    parser.add_argument("--metric", choices=("gorilla", "strict", "both"), default="both",
                        help="which metric to print (default both)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-hub-check", dest="no_hub_check", action="store_true",
                        help="score even if the responses look like another hub's")
    return parser


def summary(result: dict, metric: str = "both") -> dict:
    """The score result without ``per_question`` and without the metric not asked for."""
    out = {k: v for k, v in result.items() if k != "per_question"}
    if metric in METRICS:
        out.pop("strict" if metric == "gorilla" else "gorilla")
    return out


def format_table(result: dict, metric: str = "both", source: str = "") -> str:
    """A readable table of counts and percentages with the parser versions."""
    metrics = list(METRICS) if metric == "both" else [metric]
    n = result["n"]
    lines = [f"hub {result['hub']}, {n} responses" + (f" ({source})" if source else "")]
    lines.append(f"{'metric':<8} {'correct':>16} {'hallucination':>16} {'error':>16}")
    for m in metrics:
        block = result[m]
        cells = [f"{block[o + '_n']:>5} ({100 * block[k]:6.2f}%)"
                 for o, k in (("correct", "accuracy"), ("hallucination", "hallucination"),
                              ("error", "error"))]
        lines.append(f"{m:<8} " + " ".join(f"{c:>16}" for c in cells))
    parser = ", ".join(f"{k} {v}" for k, v in result["parser"].items())
    lines.append(f"parser: {parser}")
    if result["parser"] != PINNED_PARSER:
        lines.append(f"warning: gorilla numbers are only official with {PINNED_PARSER}")
    return "\n".join(lines)


def cli_score(args) -> int:
    """``ratune eval score``: score one response file and print the result.

    ``args`` has ``hub``, ``responses``, ``apibench`` (None: default folder), ``metric``
    (gorilla|strict|both, default both), ``json`` (bool) and optionally ``no_hub_check``.
    With ``json`` prints one JSON object (:func:`summary` of :meth:`Scorer.score`), else a table.

    Returns:
        0.

    Raises:
        RatuneError / InputError: unknown hub, missing files, malformed response lines, a file
            for another hub, question ids out of range.
    """
    metric = getattr(args, "metric", None) or "both"
    if metric not in ("gorilla", "strict", "both"):
        raise RatuneError(f"unknown metric {metric!r}: expected gorilla, strict or both")
    if args.hub not in HUBS:
        return _cli_score_catalog(args, metric)
    hub = check_hub(args.hub)
    scorer = Scorer.from_apibench(hub, getattr(args, "apibench", None))
    responses = load_responses(args.responses)
    if not getattr(args, "no_hub_check", False):
        check_hub_matches(hub, responses, scorer, path=args.responses)
    check_question_ids(responses, scorer.n_questions, path=args.responses)
    result = scorer.score(responses)
    if getattr(args, "json", False):
        print(json.dumps(summary(result, metric), sort_keys=True))
    else:
        print(format_table(result, metric, source=os.fspath(args.responses)))
    return 0


def _cli_score_catalog(args, metric: str) -> int:
    """:func:`cli_score` on a catalog folder: its strict metric and argument score
    (:class:`ratune.eval.catalog_scorer.CatalogEvalScorer`); question_ids are lines of the
    catalog's ``pairs/eval.jsonl``.

    Raises:
        RatuneError: ``--metric gorilla`` (APIBench only); a question_id that is not an eval
            line, naming the file and line; as :func:`load_responses`.
    """
    from ratune.data.hubs import resolve_hub
    from ratune.eval.catalog_scorer import GORILLA_APIBENCH_ONLY, CatalogEvalScorer

    if metric == "gorilla":
        raise RatuneError(f"--metric gorilla: {GORILLA_APIBENCH_ONLY}; use --metric strict")
    scorer = CatalogEvalScorer.from_source(resolve_hub(args.hub))
    responses = load_responses(args.responses)
    for r in responses:
        if not scorer.has_question(r["question_id"]):
            raise InputError(os.fspath(args.responses), r["line"], "question_id",
                             f"question_id {r['question_id']} is not a line of catalog {scorer.hub}'s eval pairs "
                             f"(1..{scorer.n_questions})")
    result = scorer.score(responses)
    if getattr(args, "json", False):
        print(json.dumps({k: v for k, v in result.items() if k != "per_question"}, sort_keys=True))
        return 0
    n, strict, arguments = result["n"], result["strict"], result["arguments"]
    lines = [f"catalog {result['hub']}, {n} responses ({os.fspath(args.responses)})",
             f"{'metric':<8} {'correct':>16} {'hallucination':>16} {'error':>16}",
             f"{'strict':<8} " + " ".join(f"{strict[o + '_n']:>5} ({100 * strict[k]:6.2f}%)".rjust(16) for o, k in
                                          (("correct", "accuracy"), ("hallucination", "hallucination"),
                                           ("error", "error"))),
             f"arguments: required present {arguments['required_present_n']} ({100 * arguments['required_present']:.2f}%), "
             f"values equal {arguments['values_equal_n']} ({100 * arguments['values_equal']:.2f}%) of {n}",
             "(no gorilla metric: it is APIBench's)"]
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:  # pragma: no cover - convenience entry point
    """``python -m ratune.eval.scoring --hub ... --responses ...`` (same as cli_score)."""
    parser = add_score_arguments(argparse.ArgumentParser(prog="ratune eval score"))
    args = parser.parse_args(argv)
    try:
        return cli_score(args)
    except RatuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
