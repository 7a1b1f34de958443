"""Each APIBench hub's scoring rules, one :class:`HubRules` object per hub, so the metrics never
branch on a hub's name (docs/scoring.md#where-the-code-is). "semantics §N" cites the
specification of the official scripts (gorilla/eval/eval-scripts/ast_eval_{th,hf,tf}.py at commit
6ea5797); docs/scoring.md summarises it.
"""

from __future__ import annotations

import re

from ratune.sources.apibench import check_hub
from ratune.eval.scoring.parse import WHITESPACE, call_parts, value

_PUNCTUATION = (b"(", b")", b",")


def _keyword_value(child, src: bytes) -> bytes:
    """The official scripts' value of an argument node: its third child (``name = value``'s
    value) when it has one, else the whole node."""
    gc = child.children
    node = gc[2] if len(gc) > 2 else child
    return src[node.start_byte:node.end_byte]


class HubRules:
    """The rules of one hub; one instance per hub in :data:`HUB_RULES`.

    Attributes:
        name: the hub (one of :data:`~ratune.sources.apibench.HUBS`).
        parses_text_without_marker: semantics §2: a text without the literal ``api_call`` is parsed
            whole (True), or is "error" unparsed (False, TorchHub).
        evidence: matches a text that calls the hub's loader (refuses another hub's response file).
        database_extra_keys: strict metric: an entry's secondary keys are known APIs too (False for
            TorchHub, whose repo-only key names only the repo-only entries).
    """

    name: str
    parses_text_without_marker: bool = True
    evidence: re.Pattern
    database_extra_keys: bool = True

    def reference_argument(self, child, ctext: bytes, src: bytes) -> bytes | None:
        """Semantics §4: the reference argument that one child of a database call's argument
        list gives (before single quotes are stripped), or None when the official ``get_args``
        skips it. ``ctext`` is the child's source text."""
        raise NotImplementedError

    def call_identity(self, call, src: bytes) -> tuple | None:
        """``(primary_key, extra_keys)`` naming the API of one tree-sitter ``call`` node, or None
        when the call is not one of the hub's loaders (strict metric; docs/scoring.md)."""
        raise NotImplementedError

    def loader_function(self, call, src: bytes) -> bytes | None:
        """The function text of a database call that the response search should also treat as
        a loader (HuggingFace's constructors), or None."""
        return None

    def loader_pattern(self, loaders: set[bytes]) -> re.Pattern:
        """Regex finding where a loader call of a response starts (strict metric); ``loaders``
        are the database's :meth:`loader_function` texts."""
        raise NotImplementedError

    def is_loader(self, call, src: bytes, loaders: set[bytes]) -> bool:
        """Whether a call found at a loader position is a loader (strict metric)."""
        return True


class TorchHubRules(HubRules):
    """TorchHub (ast_eval_th.py; strict: ``torch.hub.load``)."""

    name = "torchhub"
    parses_text_without_marker = False
    evidence = re.compile(r"torch\.hub\.load\s*\(")
    database_extra_keys = False

    #: ``(repository, entry point) -> keyword`` of TorchHub entry points whose own first argument
    #: names the model (strict metric). Source: MEAL-V2's hubconf.py defines only
    #: ``meal_v2(model_name, pretrained=True, ...)`` (docs/scoring.md#torchhub-repository-and-model).
    VARIANT_ENTRY_POINTS = {
        (b"szq0214/MEAL-V2", b"meal_v2"): b"model_name",
    }

    def reference_argument(self, child, ctext: bytes, src: bytes) -> bytes | None:
        """Semantics §4, TorchHub: only arguments whose text holds ``repo_or_dir`` or ``model``."""
        if b"repo_or_dir" in ctext or b"model" in ctext:
            return _keyword_value(child, src)
        return None

    @staticmethod
    def repo(text: bytes) -> bytes:
        """``owner/repo`` of ``owner/repo[:ref]`` (the ref is ignored: docs/scoring.md)."""
        return text.split(b":", 1)[0].strip().rstrip(b"/")

    def repo_model(self, positional, keywords, src: bytes):
        """``(repo, model)`` of a ``torch.hub.load`` call by torch.hub's argument order, or None without
        a repository (docs/scoring.md#torchhub-repository-and-model)."""
        rest = list(positional)
        repo = keywords.get(b"repo_or_dir")
        if repo is None:
            if not rest:
                return None
            repo = rest.pop(0)
        model = keywords.get(b"model")
        if model is None and rest:
            model = rest.pop(0)
        repo_v = self.repo(value(repo, src))
        model_v = value(model, src) if model is not None else None
        variant_keyword = self.VARIANT_ENTRY_POINTS.get((repo_v, model_v))
        if variant_keyword is not None:
            variant = keywords.get(variant_keyword)
            if variant is None and rest:
                variant = rest[0]
            if variant is not None:
                model_v = value(variant, src)
        return repo_v, model_v

    def call_identity(self, call, src: bytes) -> tuple | None:
        """``torch.hub.load`` with repo_or_dir and model in torch.hub's argument order
        (:meth:`repo_model`), the repo's ``:ref`` tag ignored. Key ``("th", repo, model)``; a
        call also names the repo-only APIs (``("th", repo, None)``, database entries 81 and 82)."""
        fn, positional, keywords = call_parts(call, src)
        if fn != b"torch.hub.load":
            return None
        named = self.repo_model(positional, keywords, src)
        if named is None:
            return None
        repo_v, model_v = named
        return ("th", repo_v, model_v), (("th", repo_v, None),)

    def loader_pattern(self, loaders: set[bytes]) -> re.Pattern:
        return re.compile(r"torch\s*\.\s*hub\s*\.\s*load\s*\(")


class HuggingFaceRules(HubRules):
    """HuggingFace (ast_eval_hf.py; strict: ``pipeline``, ``*.from_pretrained`` and the
    database's own constructors)."""

    name = "huggingface"
    evidence = re.compile(r"\.from_pretrained\s*\(|(?<![\w.])pipeline\s*\(")

    #: Keyword arguments that carry the model id of a non-pipeline loader, in priority order
    #: (from the forms in api/huggingface_api.jsonl: from_pretrained, from_hparams(source=),
    #: load_from_hub(repo_id=), Parrot(model_tag=), ...).
    MODEL_KEYWORDS = (b"pretrained_model_name_or_path", b"model_name_or_path", b"model", b"model_id",
                      b"model_name", b"model_tag", b"repo_id", b"source", b"checkpoint")

    def reference_argument(self, child, ctext: bytes, src: bytes) -> bytes | None:
        """Semantics §4, HuggingFace: every keyword argument's value and every positional
        argument's text (not the punctuation)."""
        if b"=" in ctext:
            return _keyword_value(child, src)
        if ctext not in _PUNCTUATION:
            return ctext
        return None

    def call_identity(self, call, src: bytes) -> tuple | None:
        """``pipeline(task, model=...)`` keys ``("pipeline", task, model)`` and also names
        ``("model", model)``; any other loader (``*.from_pretrained``, the database's own
        constructors) keys ``("model", model_id)``, the id being the first of
        :attr:`MODEL_KEYWORDS` or the first positional argument."""
        fn, positional, keywords = call_parts(call, src)
        if fn == b"pipeline":
            task = keywords.get(b"task", positional[0] if positional else None)
            model = keywords.get(b"model")
            if model is None:
                rest = positional[1:] if b"task" not in keywords else positional
                model = rest[0] if rest else None
            if model is not None and model.type == "call":
                # pipeline(task, model=X.from_pretrained('id')): one level only, no recursion
                _, inner_pos, inner_kw = call_parts(model, src)
                inner = next((inner_kw[kw] for kw in self.MODEL_KEYWORDS if kw in inner_kw),
                             inner_pos[0] if inner_pos else None)
                model = inner if inner is not None else model
            task_v = value(task, src) if task is not None else None
            model_v = value(model, src) if model is not None else None
            if task_v is None and model_v is not None:
                return ("model", model_v), ()  # no task: the model id alone names the API
            return ("pipeline", task_v, model_v), ((("model", model_v),) if model_v else ())
        for kw in self.MODEL_KEYWORDS:
            if kw in keywords:
                return ("model", value(keywords[kw], src)), ()
        if positional:
            return ("model", value(positional[0], src)), ()
        return ("call", fn + WHITESPACE.sub(b"", src[call.start_byte:call.end_byte])[len(fn):]), ()

    def loader_function(self, call, src: bytes) -> bytes | None:
        return call_parts(call, src)[0]

    def loader_pattern(self, loaders: set[bytes]) -> re.Pattern:
        names = sorted({fn.decode("utf-8", "replace") for fn in loaders if fn}, key=len, reverse=True)
        alternatives = "".join("|" + re.escape(name) for name in names)
        return re.compile(r"(?<![\w.])(?:[\w.]*from_pretrained|pipeline" + alternatives + r")\s*\(")

    def is_loader(self, call, src: bytes, loaders: set[bytes]) -> bool:
        fn = call_parts(call, src)[0]
        return fn == b"pipeline" or fn.endswith(b"from_pretrained") or fn in loaders


class TensorFlowHubRules(HubRules):
    """TensorFlow Hub (ast_eval_tf.py; strict: ``hub.KerasLayer`` and ``hub.load``)."""

    name = "tensorflowhub"
    evidence = re.compile(r"(?<!torch\.)(?<![\w])hub\.(?:KerasLayer|load)\s*\(")

    def reference_argument(self, child, ctext: bytes, src: bytes) -> bytes | None:
        """Semantics §4, TensorFlow Hub: a ``model=`` keyword's value and every positional
        argument's text (not the punctuation)."""
        if b"model=" in ctext or b"model =" in ctext:
            return _keyword_value(child, src)
        if ctext not in _PUNCTUATION:
            return ctext
        return None

    def call_identity(self, call, src: bytes) -> tuple | None:
        """``hub.KerasLayer`` / ``hub.load`` key ``("tf", loader, handle_url)``; the URL alone
        (``("url", handle)``) is also named, so a known handle with the wrong loader is an error,
        not a hallucination."""
        fn, positional, keywords = call_parts(call, src)
        name = fn.rsplit(b".", 1)
        if len(name) != 2 or name[0] not in (b"hub", b"tensorflow_hub") or name[1] not in (b"KerasLayer", b"load"):
            return None
        handle = keywords.get(b"handle", positional[0] if positional else None)
        if handle is None:
            return None
        url = value(handle, src).rstrip(b"/")
        return ("tf", name[1], url), (("url", url),)

    def loader_pattern(self, loaders: set[bytes]) -> re.Pattern:
        return re.compile(r"(?<![\w.])(?:tensorflow_)?hub\s*\.\s*(?:KerasLayer|load)\s*\(")


#: The rules of every APIBench hub, in :data:`~ratune.sources.apibench.HUBS` order.
HUB_RULES: dict[str, HubRules] = {rules.name: rules for rules in (TorchHubRules(), HuggingFaceRules(),
                                                                 TensorFlowHubRules())}


def rules_for(hub: str) -> HubRules:
    """The rules of an APIBench hub.

    Raises:
        RatuneError: unknown hub (:func:`~ratune.sources.apibench.check_hub`'s message).
    """
    return HUB_RULES[check_hub(hub)]


def call_identity(hub: str, call, src: bytes) -> tuple | None:
    """:meth:`HubRules.call_identity` of ``hub``'s rules (strict metric; docs/scoring.md)."""
    return rules_for(hub).call_identity(call, src)
