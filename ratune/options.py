"""A stage's settings, defined once: its command-line flags, its config sections and the commands a
sweep runs are derived from one list of :class:`Option` over the stage's settings dataclass.

A stage (``ratune eval run``, eval/settings.py ``EVAL_OPTIONS``) has a settings dataclass whose
fields carry each setting's type (the bounded types of ratune/config.py, a registry name, a
``Literal``) and default, and a tuple of :class:`Option`, one per setting a user can give,
naming its flag and help. From them:

* :func:`add_arguments` adds the flags to an argparse parser (the type of each derived from the
  dataclass field: ``bool`` a ``store_true`` flag, a ``Literal`` its choices, a number
  :func:`ratune.args.setting`; a list ``nargs="+"``), and :func:`values_from_args` reads them
  back as dataclass keywords;
* :func:`config_model` makes the pydantic model of a config section (a sweep file's ``eval:``,
  the demo's ``eval:``): one key per option (the flag without dashes, ``-`` as ``_``), the same
  annotation and default unless the section overrides a default, and the option's help as the
  field description; :func:`config_values` maps a section back to dataclass keywords;
* :func:`command_arguments` writes a section's values as the flags of the command a sweep runs.

So a new setting is one dataclass field, one :class:`Option` and its use.
"""

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
    """One setting of a stage, as users give it.

    Attributes:
        field: the settings dataclass field it fills.
        flag: its command-line flag (``--batch-size``); the config key is :attr:`key`.
        help: the flag's help and the config field's description.
        cli: argparse keywords that replace the derived ones (``type``, ``metavar``, ``choices``;
            e.g. a folder flag's :func:`ratune.args.input_dir`, a registry name's
            :func:`ratune.args.registered`).
        cli_default: the flag's default when it is not the field's (``settings``: None, so the
            command picks a hub's defaults).
        config: whether config sections (sweep, demo) have it; a setting that follows from
            elsewhere (``trust_remote_code``: the trained model's config) has none.
        command: :data:`CommandPolicy` of :func:`command_arguments`.
    """

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
    """Add one flag per option to ``parser`` (see the module docstring); defaults are the
    dataclass's unless :attr:`Option.cli_default` says otherwise.

    Raises:
        ValueError: a ``bool`` setting that does not default to False (its flag could not turn it
            off).
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
    """``{key: (annotation, FieldInfo)}`` of the options that have :attr:`Option.config`: each field's
    annotation (a sequence as a list), its default or the one ``defaults`` gives (None makes the
    field optional: "taken from elsewhere"), its help as the description.

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
    """The pydantic model of a config section with one key per option that has :attr:`Option.config`
    (:func:`config_fields`), in option order, then ``extra``.

    Args:
        name: the model's class name (``SweepEval``).
        schema: the stage's settings dataclass (each field's annotation and default).
        options: the stage's options, in the order the section lists them.
        doc: the model's docstring.
        defaults: ``{key: default}`` where this section's default differs from the dataclass's
            (a sweep's ``data: max_length: None``: the cells' own).
        extra: more fields, ``{key: (annotation, FieldInfo)}`` (a sweep's ``curve_settings``, or
            :func:`config_fields` of another settings class).

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

    Args:
        section: a :func:`config_model` instance.
        schema: the stage's settings dataclass (the defaults an option is compared with).
        options: the stage's options.
        policy: write the options of this :data:`CommandPolicy` only (a command puts its own
            arguments between the two groups).
        text: how a value is written.

    Returns:
        ``[flag, value...]`` per option: a list's items after its flag, a ``True`` flag alone, and
        under ``changed`` only the options whose value is not the dataclass default (None and
        False are never written).
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
