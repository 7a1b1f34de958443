"""Config loading and validation shared by every stage: the one bounded YAML loader
(docs/reliability.md#user-errors), pydantic schemas that refuse unknown keys (docs/configs.md), and
the bounded number types that schemas, settings dataclasses and flags all check with."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ratune.errors import InputError, RatuneError
from ratune.registry import BM25_BACKENDS, EVAL_SETTINGS, RETRIEVED_MODES, TRAIN_MODES, check_name

M = TypeVar("M", bound=BaseModel)

#: Counts and sizes (batch sizes, top-k, questions, steps, tokens, epochs): at least 1.
Count = Annotated[int, Field(ge=1)]
#: Tokens per training row (prompt, answer and EOS): at least 16.
MaxLength = Annotated[int, Field(ge=16)]
#: Random seeds: what numpy, torch and Python's random all accept (0 .. 2**32 - 1).
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
#: Thread and process counts: at least 1.
Threads = Annotated[int, Field(ge=1)]
#: A positive, finite float (learning rates, TFLOP/s).
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: Any finite float (thresholds).
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
#: A share in (0, 1] (MFU).
Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
#: A share strictly between 0 and 1 (a held-out fraction).
OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
#: A TCP port.
Port = Annotated[int, Field(ge=1, le=65535)]
#: What a training run does with an unfinished earlier run in its output folder (train/resume.py).
OnUnfinished = Literal["resume", "restart"]
ON_UNFINISHED = get_args(OnUnfinished)



def one_of(kind: str, names: tuple[str, ...]) -> Any:
    """A ``str`` field type that must be one of a registry's ``names`` (listed as the JSON schema's enum)."""
    return Annotated[str, AfterValidator(functools.partial(check_name, kind, known=names)),
                     Field(json_schema_extra={"enum": list(names)})]


#: Registry names as schema field types.
TestSettingName = one_of("test setting", EVAL_SETTINGS)
TrainModeName = one_of("train-time retrieval mode", TRAIN_MODES)
Top1RetrieverName = one_of("top1 retriever", RETRIEVED_MODES)
BM25BackendName = one_of("BM25 backend", BM25_BACKENDS)

#: The pydantic model config of every config schema: unknown keys are errors, floats are finite.
SCHEMA_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

#: Largest config file read (configs are a few KB; this bounds the memory a hostile file takes).
MAX_CONFIG_BYTES = 1 << 20
#: Most values (scalars, lists, mappings) a config may hold once its aliases are expanded.
MAX_CONFIG_VALUES = 100_000
#: Deepest nesting of lists and mappings in a config (ratune's configs nest 3 levels).
MAX_CONFIG_DEPTH = 64


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names valid at a location (walking nested models)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return list(current.model_fields) if current is not None else []


def format_validation_error(exc: ValidationError, model: type[BaseModel], source: str) -> str:
    """``source: key.path: message`` per problem (with a did-you-mean for unknown keys), joined
    with ``; `` so that the whole error is one line."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(allowed)}"
            lines.append(f"{source}: unknown key {where!r}{hint}")
        else:
            lines.append(f"{source}: {where}: {err['msg']} (got {_short(err.get('input'))})")
    return "; ".join(lines)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and deep nesting; ``what`` names the document kind."""

    _depth = 0
    what = "a ratune config"

    def fetch_flow_collection_start(self, TokenClass):
        # bounded while scanning: the scanner's work grows with the square of the flow nesting
        if self.flow_level >= MAX_CONFIG_DEPTH:
            raise _Refused(self.line + 1, f"nested more than {MAX_CONFIG_DEPTH} levels deep; not {self.what}")
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                raise _Refused(self.peek_event().start_mark.line + 1,
                               f"nested more than {MAX_CONFIG_DEPTH} levels deep; not {self.what}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges; its keys may be overridden on purpose
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error follows
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _Refused(line, f"duplicate key {key!r} (first given on line {first})")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _Refused(Exception):
    """A config the loader refuses, at a 1-based line."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def _check_expansion(root: yaml.Node, limit: int = MAX_CONFIG_VALUES, what: str = "the config") -> None:
    """Refuse a composed document that aliases expand beyond ``limit`` values (each node sized once)."""
    sizes: dict[int, int | None] = {}

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            if sizes[key] is None:
                raise _Refused(node.start_mark.line + 1, "an alias refers to the mapping or list that contains "
                               "it (a recursive structure)")
            return sizes[key]
        sizes[key] = None
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > limit:
            raise _Refused(node.start_mark.line + 1, f"aliases expand {what} to more than {limit} values "
                           "(an alias bomb?); write the values out")
        sizes[key] = total
        return total

    size(root)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping with the one config loader.

    Raises:
        RatuneError: naming the file (and line): missing, a folder, too large, not UTF-8, as
            :func:`parse_yaml`, or not a mapping.
    """
    path = Path(path)
    if path.is_dir():
        raise RatuneError(f"{path}: is a folder, expected a YAML config file")
    if not path.exists():
        raise RatuneError(f"{path}: config file not found")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise RatuneError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise RatuneError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a ratune config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise RatuneError(f"{path}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x}); save the config as UTF-8") from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise RatuneError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def parse_yaml(text: str, source: str, *, max_values: int = MAX_CONFIG_VALUES, what: str = "a ratune config",
               noun: str = "the config"):
    """Parse YAML ``text`` with the one loader's guards (aliases expand to at most ``max_values``).

    ``source`` is named in every error, ``what`` and ``noun`` in refusals. Returns the document
    (None for an empty one).

    Raises:
        InputError: invalid YAML, a duplicate key, nesting too deep or too many values.
    """
    loader = _ConfigLoader(text)
    loader.what = what
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node, max_values, noun)
        return loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise InputError(source, mark.line + 1 if mark is not None else None, None,
                         f"not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, None, None, f"not valid YAML: {' '.join(str(exc).split())}") from None
    except _Refused as exc:
        raise InputError(source, exc.line, None, str(exc)) from None
    finally:
        loader.dispose()


def key_line(path: str | Path, key: str) -> int | None:
    """The 1-based line of the top-level ``key`` in the YAML file ``path``, or None."""
    try:
        loader = _ConfigLoader(Path(path).read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except (OSError, UnicodeDecodeError, yaml.YAMLError, _Refused):
        return None
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value == key),
                None)


def validate(model: type[M], data: dict, source: str) -> M:
    """Validate ``data`` against ``model``; raise RatuneError with readable lines on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RatuneError(format_validation_error(exc, model, source)) from None


def load_config(model: type[M], path: str | Path) -> M:
    """Load a YAML config file into ``model`` (:func:`load_yaml`, then :func:`validate`).

    Raises:
        RatuneError: as :func:`load_yaml` and :func:`validate`.
    """
    return validate(model, load_yaml(path), str(path))


# ---------------------------------------------------------------- bounded fields of settings schemas


@functools.lru_cache(maxsize=None)
def field_annotation(schema: type, name: str) -> Any:
    """The annotation (with its bounds) of field ``name`` of a settings dataclass or pydantic model.

    Raises:
        KeyError: no such field.
    """
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        info = schema.model_fields[name]
        return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return typing.get_type_hints(schema, include_extras=True)[name]


@functools.lru_cache(maxsize=None)
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)


def check_value(annotation: Any, value: Any) -> Any:
    """``value`` validated against ``annotation`` (lax: ``"8"`` is 8).

    Raises:
        ValueError: the first problem, in pydantic's words (``Input should be ...``).
    """
    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"]) from None


def check_fields(obj: Any, source: str | None = None) -> None:
    """Check every field of a settings dataclass against its annotation (from ``__post_init__``).

    Raises:
        RatuneError: ``Schema.field: message (got value)`` for the first bad field.
    """
    cls = type(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        try:
            check_value(field_annotation(cls, f.name), value)
        except ValueError as exc:
            raise RatuneError(f"{source or cls.__name__}.{f.name}: {exc} (got {_short(value)})") from None
