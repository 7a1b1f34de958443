"""Command-line argument types: every value a user types is checked when it is parsed
(docs/reliability.md#user-errors); a number's rule is the schema field's it sets (:func:`setting`).

Each type carries ``good_example`` and ``bad_examples`` (paths as :data:`PATH_KINDS`, written into
a value by ``template``), which tests/test_cli_errors.py feeds to every sub-command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

#: Candidate numbers; a bounded type's ``bad_examples`` are the ones it refuses.
_NUMBER_PROBES = ("0", "-1", "-3", "1.5", "inf", "nan", "-inf", "x", str(2**32), "1e309")
#: Path kinds the examples use (tests make them: a missing path, a file, a folder, a new path).
PATH_KINDS = ("missing", "file", "folder", "new")


class RatuneArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (``ratune: error: ...``, no usage), exit 2."""

    def error(self, message: str):
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{sub}: " if sub else ""
        sys.stderr.write(f"ratune: error: {where}{' '.join(message.split())} (see {self.prog} --help)\n")
        sys.exit(2)


def _typed(fn: Callable[[str], Any], name: str, *, good: str, bad: tuple, template: str = "{}"
           ) -> Callable[[str], Any]:
    fn.__name__ = name  # argparse names the type in "invalid NAME value"
    fn.good_example = good  # type: ignore[attr-defined]
    fn.bad_examples = bad  # type: ignore[attr-defined]
    fn.template = template  # type: ignore[attr-defined]  # how a path kind is written as a value
    return fn


def bounded(annotation: Any, name: str | None = None) -> Callable[[str], Any]:
    """An argparse type checking a number against a bounded annotation (``Count``, ``Seed``, ...)."""
    from ratune.config import check_value

    def convert(text: str):
        try:
            return check_value(annotation, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (got {text!r})") from None

    def accepted(probe: str) -> bool:
        try:
            check_value(annotation, probe)
            return True
        except ValueError:
            return False

    good = next(p for p in ("1", "2", "0.5", "2048", "0") if accepted(p))
    bad = tuple(p for p in _NUMBER_PROBES if not accepted(p))
    return _typed(convert, name or getattr(annotation, "__name__", "number"), good=good, bad=bad)


def setting(schema: type, field: str) -> Callable[[str], Any]:
    """An argparse type derived from a schema field (a settings dataclass or a pydantic model):
    the flag accepts exactly what the field accepts."""
    from ratune.config import field_annotation

    return bounded(field_annotation(schema, field), name=f"{schema.__name__}.{field}")


def registered(kind: str, names: Sequence[str], *extra: str) -> dict:
    """argparse keywords (``type``, ``metavar``) of a flag that takes one of a registry's names
    or one of ``extra`` (such as ``all``)."""
    from ratune.registry import unknown_name

    known = (*extra, *names)

    def convert(text: str) -> str:
        if text not in known:
            raise argparse.ArgumentTypeError(unknown_name(kind, text, known))
        return text

    typed = _typed(convert, kind, good=known[0], bad=("no_such_name",))
    return {"type": typed, "metavar": "{" + ",".join(known) + "}"}


def checked(parse: Callable[[str], Any], name: str, *, good: str, bad: tuple) -> Callable[[str], str]:
    """An argparse type that runs ``parse`` (which raises RatuneError on bad text) and keeps the text."""
    from ratune.errors import RatuneError

    def convert(text: str) -> str:
        try:
            parse(text)
        except RatuneError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return _typed(convert, name, good=good, bad=bad)


def _exists_message(path: Path) -> str:
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{path}: {parent} is a file, not a folder"
    return f"{path}: no such file or folder"


def _input(kind: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        path = Path(text)
        if not text:
            raise argparse.ArgumentTypeError("an empty path")
        if not path.exists():
            raise argparse.ArgumentTypeError(_exists_message(path))
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: is a folder, expected a file")
        if kind == "folder" and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: is a file, expected a folder")
        if not os.access(path, os.R_OK):
            raise argparse.ArgumentTypeError(f"{path}: not readable (permission denied)")
        return text

    bad = ("missing",) + {"file": ("folder",), "folder": ("file",), "path": ()}[kind]
    return _typed(convert, f"input_{kind}", good="folder" if kind == "folder" else "file", bad=bad)


#: An existing file to read.
input_file = _input("file")
#: An existing folder to read.
input_dir = _input("folder")
#: An existing file or folder to read.
input_path = _input("path")


def _output(kind: str) -> Callable[[str], str]:
    """An output path's check: not empty, not the other kind where it exists, under folders."""
    def convert(text: str) -> str:
        path = Path(text)
        if not text:
            raise argparse.ArgumentTypeError("an empty path")
        if kind == "folder" and path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: exists and is not a folder")
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: is a folder, expected a file")
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: {parent} is a file, not a folder")
        return text

    return convert


#: An output folder: missing (it is made) or an existing folder, never a file.
output_dir = _typed(_output("folder"), "output_dir", good="new", bad=("file",))
#: An output file: missing or an existing file (replaced), never a folder.
output_file = _typed(_output("file"), "output_file", good="new", bad=("folder",))


def _model_ref(text: str) -> str:
    from ratune.models import DEMO_MODEL_ALIAS, is_hub_id

    if text == DEMO_MODEL_ALIAS:
        return text
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path}: is a file, expected a model folder")
        return text
    if is_hub_id(text):
        return text  # a hub id (org/name): from_pretrained resolves it where the hub is reachable
    raise argparse.ArgumentTypeError(f"{_exists_message(path)} (expected a model folder, a hub id org/name or "
                                     f"{DEMO_MODEL_ALIAS})")


#: A model: a local model folder, a hub id ``org/name`` or the demo alias.
model_ref = _typed(_model_ref, "model", good="folder", bad=("missing", "file"))


def _key_dir(text: str) -> str:
    key, sep, folder = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=FOLDER, got {text!r}")
    input_dir(folder)
    return text


#: ``NAME=FOLDER`` with an existing folder (``ratune report --eval TRAIN_RETRIEVER=EVAL_DIR``).
key_equals_dir = _typed(_key_dir, "NAME=FOLDER", good="folder", bad=("missing", "file"), template="none={}")


def _latest_or_dir(text: str) -> str:
    if text == "latest":
        return text
    return input_dir(text)


#: ``latest`` or an existing checkpoint folder.
latest_or_dir = _typed(_latest_or_dir, "checkpoint", good="latest", bad=("missing", "file"))


#: Where ``--apibench`` looks when it is not given (sources/apibench.py ``resolve_apibench_dir``).
APIBENCH_DEFAULT = "$RATUNE_APIBENCH or ../shared/apibench"


def add_apibench_argument(parser: argparse.ArgumentParser, *, default_text: str = APIBENCH_DEFAULT) -> None:
    """Add ``--apibench DIR`` (an existing folder; None when not given), the one definition of
    that flag; ``default_text`` is what the help says is used without it."""
    parser.add_argument("--apibench", default=None, type=input_dir, metavar="DIR",
                        help=f"APIBench folder (default: {default_text})")

