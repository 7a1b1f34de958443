"""Config loading and validation shared by every stage.

Configs are YAML files validated by pydantic models with ``extra="forbid"``: an unknown key is an
error that names the key, the file and the closest valid key; a wrong type names the field. All
of it happens before any model is loaded.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ratune.errors import RatuneError

M = TypeVar("M", bound=BaseModel)


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
    """One line per problem: ``source: key.path: message`` (with a did-you-mean for unknown keys)."""
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
            lines.append(f"{source}: {where}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping.

    Raises:
        RatuneError: missing file, YAML syntax error (with its line), or a top level that is not a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise RatuneError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RatuneError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RatuneError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def validate(model: type[M], data: dict, source: str) -> M:
    """Validate ``data`` against ``model``; raise RatuneError with readable lines on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RatuneError(format_validation_error(exc, model, source)) from None


def load_config(model: type[M], path: str | Path, overrides: dict | None = None) -> M:
    """Load a YAML config file into ``model``; ``overrides`` (dotted keys) are applied first."""
    data = load_yaml(path)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate(model, data, str(path))
