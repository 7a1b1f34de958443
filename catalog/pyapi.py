"""Catalog source 3: the public callables of an imported Python module, read with :mod:`inspect`
and never called (docs/catalogs.md, "Source 3: a Python module").
"""

from __future__ import annotations

import importlib
import inspect
import platform
import re
from importlib import metadata

from ratune.catalog.schema import (API_CALL, API_NAME, ARGUMENTS, DESCRIPTION, DOMAIN, EXAMPLE_CODE,
                                   IDENTIFYING_ARGUMENTS, PROVIDER, Imported, Reject, argument, validate_document)
from ratune.errors import InputError, RatuneError
from ratune.io import sha256_file

#: The manifest's ``source.kind`` of this source.
KIND = "python"
#: A ``repr`` default longer than this is cut (with ``...``).
MAX_REPR_CHARS = 300

_P = inspect.Parameter
#: A dotted module path (``json``, ``huggingface_hub.utils``).
MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _plain_json(value, depth: int = 0) -> bool:
    """Whether ``value`` is made of exactly JSON's types (no subclasses such as enums or tuples)."""
    if depth > 32:
        return False
    if value is None or type(value) in (str, bool, int):
        return True
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if type(value) is list:
        return all(_plain_json(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    return False


def _default(value):
    if value is _P.empty:
        return None
    if _plain_json(value):
        return value
    try:
        text = repr(value)
    except Exception:  # a default whose __repr__ fails is still a default; say what it is
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= MAX_REPR_CHARS else text[:MAX_REPR_CHARS] + "..."


def _annotation(annotation) -> str | None:
    if annotation is _P.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())


def _description(obj) -> str:
    if inspect.isclass(obj):
        own = vars(obj).get("__doc__")
        return _first_paragraph(inspect.cleandoc(own) if isinstance(own, str) else None)
    return _first_paragraph(inspect.getdoc(obj))


def _document(dotted: str, params: list[inspect.Parameter], *, module: str, doc_of) -> dict:
    """The API document of a callable whose (already trimmed) parameters are ``params``."""
    arguments, call_args = [], []
    for p in params:
        star = {_P.VAR_POSITIONAL: "*", _P.VAR_KEYWORD: "**"}.get(p.kind, "")
        required = not star and p.default is _P.empty
        arguments.append(argument(star + p.name, type=_annotation(p.annotation), required=required,
                                  default=_default(p.default)))
        if required:
            call_args.append(p.name if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD) else f"{p.name}={p.name}")
    return {API_NAME: dotted, API_CALL: f"{dotted}({', '.join(call_args)})", DESCRIPTION: _description(doc_of),
            DOMAIN: module, PROVIDER: module.split(".")[0], ARGUMENTS: arguments, EXAMPLE_CODE: "",
            IDENTIFYING_ARGUMENTS: []}


def _signature_params(obj, *, drop_first: bool) -> list[inspect.Parameter]:
    """The parameters of ``obj``'s signature, the first dropped with ``drop_first``; ValueError
    or TypeError from :func:`inspect.signature` when there is none to read."""
    params = list(inspect.signature(obj).parameters.values())
    if drop_first and params and params[0].kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return params


def _methods(cls) -> list[tuple[str, object, bool, object]]:
    """``(name, signature object, drop first, doc object)`` of a class's own public methods."""
    out = []
    for name, raw in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(raw, staticmethod):
            out.append((name, raw.__func__, False, raw.__func__))
        elif isinstance(raw, classmethod):
            out.append((name, raw.__func__, True, raw.__func__))
        elif inspect.isfunction(raw) or inspect.ismethoddescriptor(raw) or inspect.isbuiltin(raw):
            out.append((name, raw, True, raw))
    return out


def _candidates(mod, module: str) -> tuple[list[tuple[str, object]], list[Reject]]:
    """``(name, object)`` of the module's public functions and classes, and the rejects of
    ``__all__`` (names undefined or not callable)."""
    names = getattr(mod, "__all__", None)
    if names is None:
        out = []
        for name, obj in vars(mod).items():
            owner = getattr(obj, "__module__", None)
            if (not name.startswith("_") and (inspect.isclass(obj) or inspect.isroutine(obj))
                    and isinstance(owner, str) and (owner == module or owner.startswith(module + "."))):
                out.append((name, obj))
        return out, []
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InputError(module, None, "__all__", "expected a list of names")
    out, rejects = [], []
    for name in dict.fromkeys(names):
        try:
            obj = getattr(mod, name)
        except Exception as exc:  # a lazy attribute whose import fails is one reject, not the end
            rejects.append(Reject(f"{module}.{name}", f"listed in __all__, but getting it raised "
                                  f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
            continue
        if inspect.isclass(obj) or inspect.isroutine(obj):
            out.append((name, obj))
        else:
            rejects.append(Reject(f"{module}.{name}", f"not a function or class (a {type(obj).__name__})"))
    return out, rejects


def _version(mod, module: str) -> str | None:
    top = module.split(".")[0]
    for dist in metadata.packages_distributions().get(top, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    version = getattr(mod, "__version__", None)
    return version if isinstance(version, str) else None


def import_module(module: str):
    """Import the module path the user gave; RatuneError when it is no dotted path or does not import."""
    if not isinstance(module, str) or not MODULE_PATH.fullmatch(module):
        raise RatuneError(f"python module {module!r}: expected a dotted module path such as json or "
                          "huggingface_hub (the module must be importable, not a file path)")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RatuneError(f"python module {module!r}: cannot import it ({exc}); install it or put it on "
                          "PYTHONPATH") from None


def read_python_source(module: str, *, methods: bool = False) -> Imported:
    """The public callables of ``module`` (with ``methods``, also its public classes' methods as
    ``MODULE.Class.method``) as catalog documents located by dotted path, and the rejects.

    Raises:
        RatuneError: from :func:`import_module`.
        InputError: the module's ``__all__`` is not a list of names.
    """
    mod = import_module(module)
    file = getattr(mod, "__file__", None)
    imported = Imported(source={"kind": KIND, "module": module, "file": file,
                                "sha256": sha256_file(file) if file else None, "version": _version(mod, module),
                                "python": platform.python_version(), "methods": methods})
    found, imported.rejects = _candidates(mod, module)
    targets = []  # (dotted path, signature object, drop first, doc object)
    for name, obj in found:
        targets.append((f"{module}.{name}", obj, False, obj))
        if methods and inspect.isclass(obj):
            targets += [(f"{module}.{name}.{m}", sig_of, drop, doc_of) for m, sig_of, drop, doc_of in _methods(obj)]
    for dotted, sig_of, drop, doc_of in targets:
        try:
            params = _signature_params(sig_of, drop_first=drop)
        except (ValueError, TypeError) as exc:
            imported.rejects.append(Reject(dotted, f"no signature to read ({' '.join(str(exc).split())})"))
            continue
        doc = _document(dotted, params, module=module, doc_of=doc_of)
        try:
            validate_document(doc, path=dotted, line=None)
        except InputError as exc:
            imported.rejects.append(Reject(dotted, f"no callable form: {exc.reason}"))
            continue
        imported.entries.append((dotted, doc))
    return imported
