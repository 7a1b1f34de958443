"""A stage's settings, defined once: its command-line flags, its config sections and the commands a
sweep runs are derived from one list of :class:`Option` over the stage's settings dataclass
(docs/pipeline.md#settings-one-definition-per-stage-option)."""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from pydantic import BaseModel, Field, create_model

from ratune.args import setting
from ratune.config import SCHEMA_CONFIG, field_annotation

#: An option that :func:`command_arguments` always writes (``always``) or only when its value is
#: not the default (``changed``).
CommandPolicy = Literal["always", "changed"]

#: :attr:`Option.cli_default` of an option whose flag defaults to the dataclass field's default.
FIELD_DEFAULT = object()


@dataclass(frozen=True)
class Option:
    """One setting of a stage, as users give it: the dataclass ``field`` it fills, its ``flag`` and
    ``help``, argparse keywords (``cli``) and default (``cli_default``) replacing the derived ones,
    whether config sections have it (``config``) and its ``command`` policy."""

    field: str
    flag: str
    help: str | None = None
    cli: dict = dataclasses.field(default_factory=dict)
    cli_default: Any = FIELD_DEFAULT
    config: bool = True
    command: CommandPolicy = "changed"

    @property
    def key(self) -> str:
        """Its key in a config section: the flag without dashes, ``-`` written ``_``."""
        return self.flag.lstrip("-").replace("-", "_")


def _default(schema: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(schema) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    raise KeyError(f"{schema.__name__}.{name} has no default")


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """``(inner annotation, optional)`` of ``X | None`` (Annotated bounds kept)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    return annotation, False


def _argparse_keywords(schema: type, option: Option) -> dict:
    """The argparse keywords of an option, derived from its dataclass field, then ``option.cli``."""
    annotation, _ = _unwrap(field_annotation(schema, option.field))
    base = typing.get_origin(annotation)
    out: dict = {}
    if "type" in option.cli or "choices" in option.cli:
        pass  # the option names its own (a path check, a registry's names)
    elif annotation is bool:
        out["action"] = "store_true"
    elif base is Literal:
        out["choices"] = typing.get_args(annotation)
    else:
        out["type"] = setting(schema, option.field)
    if base in (list, tuple, collections.abc.Sequence):
        out["nargs"] = "+"
    out.update(option.cli)
    return out


def add_arguments(parser: argparse.ArgumentParser, schema: type, options: Sequence[Option]) -> None:
    """Add one flag per option to ``parser``, typed and defaulted from the dataclass field.

    Raises:
        ValueError: a ``bool`` setting that does not default to False.
    """
    for option in options:
        keywords = _argparse_keywords(schema, option)
        if keywords.get("action") == "store_true" and _default(schema, option.field) is not False:
            raise ValueError(f"{schema.__name__}.{option.field}: a flag's setting defaults to False")
        text = option.help
        if keywords.get("action") != "store_true":
            keywords["default"] = (_default(schema, option.field) if option.cli_default is FIELD_DEFAULT
                                   else option.cli_default)
            if keywords["default"] is not None and text and "default" not in text:
                shown = keywords["default"]
                text += f" (default {' '.join(map(str, shown)) if isinstance(shown, (list, tuple)) else shown})"
        parser.add_argument(option.flag, dest=option.key, help=text, **keywords)


def values_from_args(args: argparse.Namespace, options: Sequence[Option]) -> dict:
    """``{dataclass field: value}`` of parsed flags (:func:`add_arguments`)."""
    return {o.field: getattr(args, o.key) for o in options}


def config_fields(schema: type, options: Sequence[Option], *, defaults: dict | None = None) -> dict:
    """``{key: (annotation, FieldInfo)}`` of the options that have :attr:`Option.config`
    (``defaults`` overrides a field's default; None makes it optional).

    Raises:
        KeyError: a key of ``defaults`` that is no option's.
    """
    defaults = dict(defaults or {})
    fields: dict = {}
    for option in options:
        if not option.config:
            continue
        annotation = field_annotation(schema, option.field)
        if typing.get_origin(_unwrap(annotation)[0]) is collections.abc.Sequence:
            annotation = list[typing.get_args(_unwrap(annotation)[0])[0]]
        default = defaults.pop(option.key) if option.key in defaults else _default(schema, option.field)
        if isinstance(default, tuple):
            default = list(default)
        if default is None and not _unwrap(annotation)[1]:
            annotation = typing.Optional[annotation]
        fields[option.key] = (annotation, Field(default, description=option.help))
    if defaults:
        raise KeyError(f"no option {', '.join(defaults)}")
    return fields


def config_model(name: str, schema: type, options: Sequence[Option], *, doc: str,
                 defaults: dict | None = None, extra: dict | None = None) -> type[BaseModel]:
    """The pydantic model ``name`` (docstring ``doc``) of a config section: :func:`config_fields`
    of ``schema``'s ``options`` in option order, then ``extra`` (``{key: (annotation, FieldInfo)}``).

    Raises:
        KeyError: a key of ``defaults`` that is no option's (naming the model).
    """
    try:
        fields = config_fields(schema, options, defaults=defaults)
    except KeyError as exc:
        raise KeyError(f"{name}: {exc.args[0]}") from None
    fields.update(extra or {})
    return create_model(name, __config__=SCHEMA_CONFIG, __doc__=doc, **fields)


def config_values(section: BaseModel, options: Sequence[Option]) -> dict:
    """``{dataclass field: value}`` of a config section (:func:`config_model`) for its options."""
    return {o.field: getattr(section, o.key) for o in options if o.config and o.key in type(section).model_fields}


def command_arguments(section: BaseModel, schema: type, options: Sequence[Option], *,
                      policy: CommandPolicy, text: Callable[[Any], str] = str) -> list[str]:
    """The flags that give a config section's values to the stage's command, in option order.

    Only options of ``policy`` are written (under ``changed``, values other than the default,
    None and False); ``text`` writes a value.
    """
    out: list[str] = []
    for option in options:
        if not option.config or option.command != policy:
            continue
        value = getattr(section, option.key)
        if policy == "changed":
            default = _default(schema, option.field)
            if value is None or value is False or value == default or (
                    isinstance(default, tuple) and value == list(default)):
                continue
        if value is True:
            out.append(option.flag)
        elif isinstance(value, (list, tuple)):
            out += [option.flag, *(text(v) for v in value)]
        else:
            out += [option.flag, text(value)]
    return out
