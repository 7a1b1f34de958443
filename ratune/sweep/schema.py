"""The sweep file's schema (docs/sweeps.md#the-sweep-file): the validated sections and :func:`load_sweep`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field

from ratune.config import SCHEMA_CONFIG, Count, OnUnfinished, Port, TestSettingName, load_yaml, parse_yaml, validate
from ratune.errors import RatuneError
from ratune.data.build import BUILD_OPTIONS, BuildSettings
from ratune.data.mixture import MIXTURE_OPTIONS, Mixture
from ratune.sources.validate import LEAKAGE_POLICIES
from ratune.eval.bfcl import CATEGORIES as BFCL_CATEGORIES
from ratune.eval.selection import SELECTION_RULES
from ratune.eval.settings import BFCL_OPTIONS, EVAL_OPTIONS, BfclSettings, EvalSettings
from ratune.options import config_fields, config_model
from ratune.sweep.pairs import ComparePair

#: A sweep run's copy of its validated sweep file in its out_dir, and its key naming the file run.
SAVED_SWEEP_FILE = "sweep.yaml"
SAVED_SWEEP_SOURCE_KEY = "source"


#: A sweep file's ``data:`` section: every data build option under its flag's name, plus ``tokenizer``,
#: ``leakage`` and ``mixtures``; ``max_length`` and ``tokenizer`` default to the cells' own.
SweepData = config_model(
    "SweepData", BuildSettings, BUILD_OPTIONS, doc="Settings of the shared ``ratune data build`` (one build per hub).",
    defaults={"max_length": None},
    extra={**config_fields(Mixture, MIXTURE_OPTIONS),
           "tokenizer": (str | None, Field(None, description="the model whose tokenizer measures lengths "
                                                             "(default: the cells' model)")),
           "leakage": (Literal[LEAKAGE_POLICIES], Field("error", description="eval instructions in the training "
                                                                          "data: error, drop or allow")),
           "mixtures": (list[str], Field(default_factory=list,
                                         description="mixture specs NAME:component=p,... (data/mixture.py); a cell "
                                                     "trains on one with train_retriever: mix-NAME"))})


#: A sweep file's ``eval:`` section: every eval option under its flag's name, plus the curve's settings.
SweepEval = config_model(
    "SweepEval", EvalSettings, EVAL_OPTIONS, doc="Arguments of ``ratune eval run`` for every cell.",
    extra={"curve_settings": (list[TestSettingName], Field(
        default_factory=list,
        description="a learning curve: after training, every Trainer checkpoint of a cell is evaluated under "
                    "these settings (cells/NAME/curve/); the base config must save checkpoints (save_strategy: "
                    "epoch or save_steps) and keep them all (no save_total_limit)")),
           "selection_rule": (Literal[tuple(SELECTION_RULES)] | dict[str, Literal[tuple(SELECTION_RULES)]] | None,
                              Field(None, description="choose each cell's checkpoint on the validation questions by "
                                    "this rule (eval/selection.py), or by a rule per train_retriever ({none: "
                                    "zero_shot, oracle: oracle, ...}): the curve runs on --split validation, and "
                                    "eval.settings evaluate the chosen checkpoint's test questions; needs "
                                    "curve_settings and data.validation_fraction")),
           "selection_metric": (Literal["strict", "gorilla"], Field(
               "strict", description="the counts the selection rule compares"))})


#: A sweep file's optional ``bfcl:`` section: ``ratune eval bfcl`` of every cell into CELL/bfcl/.
SweepBfcl = config_model(
    "SweepBfcl", BfclSettings, BFCL_OPTIONS, doc="Arguments of ``ratune eval bfcl`` for every cell.",
    extra={"categories": (list[Literal[BFCL_CATEGORIES]] | None, Field(
               None, description="BFCL categories to score (default: all of eval/bfcl.py CATEGORIES)")),
           "limit": (Count | None, Field(None, description="the first N entries of each category (smoke runs)")),
           "unseen_by": (str | None, Field(None, description="a tool-set folder: leave out the entries it has seen "
                                                             "(ratune eval bfcl --unseen-by; the cells' training tools)"))})


class SlurmSettings(BaseModel):
    """Resources of each training job (eval jobs take one node and one GPU)."""

    model_config = SCHEMA_CONFIG
    nodes: Count = 1
    gpus_per_node: Count = 1
    time: str = "24:00:00"
    partition: str | None = None
    eval_time: str | None = None
    main_process_port: Port = 29500
    setup: list[str] = Field(default_factory=list, description="shell lines run first (module load, venv)")
    extra_sbatch: list[str] = Field(default_factory=list, description="extra #SBATCH options, e.g. --account=x")


class SweepConfig(BaseModel):
    """A sweep file (docs/sweeps.md#the-sweep-file)."""

    model_config = SCHEMA_CONFIG
    name: str | None = None
    out_dir: str | None = None
    apibench: str | None = None
    base: str | dict
    data: SweepData = SweepData()
    eval: SweepEval = SweepEval()
    bfcl: SweepBfcl | None = None
    axes: dict[str, list] = Field(default_factory=dict)
    groups: list[dict[str, list]] = Field(default_factory=list)
    accelerate_config: str | None = None
    on_unfinished: OnUnfinished = "resume"
    slurm: SlurmSettings = SlurmSettings()
    compare: list[ComparePair] = Field(default_factory=list)


@dataclass
class Sweep:
    """A loaded sweep: the validated file, where it came from and its output folder."""

    config: SweepConfig
    source: str
    out_dir: Path
    base: dict


def find_path(name: str, sweep_file: Path) -> Path:
    """A relative path a sweep file names: from the working directory, else from the sweep file's
    folder or the nearest folder above it that holds it; else ``name`` as given."""
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    for folder in sweep_file.resolve().parents:
        if (folder / path).exists():
            return folder / path
    return path


def check_files(sweep: Sweep) -> None:
    """Refuse a sweep whose ``accelerate_config`` names no file, before anything runs.

    Raises:
        RatuneError: naming the sweep file, the field and the paths looked up.
    """
    given = sweep.config.accelerate_config
    if given is not None and not Path(given).is_file():
        raise RatuneError(f"{sweep.source}: accelerate_config: {given}: no such file (a relative path is looked "
                          "up from the working directory, then from the sweep file's folder and the folders above it)")


def load_sweep(path: str | Path, out_dir: str | Path | None = None, overrides: Sequence[str] = ()) -> Sweep:
    """Read and validate a sweep file with ``overrides`` (``--set KEY=VALUE``) applied.

    Raises:
        RatuneError: an unreadable file; as :func:`sweep_from_data`.
    """
    return sweep_from_data(load_yaml(path), path, out_dir, overrides=overrides)


def parse_only(text: str, example: str = "train_retriever=oracle") -> tuple[str, str]:
    """``KEY=VALUE`` (one ``--only`` or ``--set``) -> ``(KEY, VALUE)``, stripped; VALUE may be empty.

    Raises:
        RatuneError: no ``=`` or an empty KEY.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RatuneError(f"{text!r}: expected KEY=VALUE, e.g. {example}")
    return key.strip(), value.strip()


#: An example of ``ratune sweep --set`` (its help and errors).
SET_EXAMPLE = "accelerate_config=configs/accelerate/1gpu.yaml"


def parse_set(text: str) -> tuple[list[str], Any]:
    """One ``ratune sweep --set KEY=VALUE``: the dotted KEY's parts and VALUE read as YAML.

    Raises:
        RatuneError: no ``=``, an empty part of KEY, or VALUE that is not valid YAML.
    """
    key, value = parse_only(text, SET_EXAMPLE)
    parts = key.split(".")
    if not all(parts):
        raise RatuneError(f"{text!r}: KEY {key!r} has an empty part; sections are joined with single dots, "
                          "e.g. base.learning_rate=2.0e-4")
    return parts, parse_yaml(value, f"--set {key}", what="a value")


def _apply_sets(data: dict, sets: list[tuple[list[str], Any, str]], where: str) -> dict:
    """``data`` (deep-copied) with each ``(parts, value, text)`` set; ``where`` names the document."""
    data = copy.deepcopy(data)
    for parts, value, text in sets:
        if parts[0] == "axes" and len(parts) > 2:  # an axis over a nested key is named with its dots: lora.r
            parts = [parts[0], ".".join(parts[1:])]
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RatuneError(f"--set {text}: {'.'.join(parts[:depth + 1])} in {where} is "
                                  f"{type(child).__name__}, not a section")
            node = child
        node[parts[-1]] = value
    return data




def load_saved_sweep(sweep_dir: str | Path) -> Sweep | None:
    """The sweep file a run saved in ``SWEEP_DIR/sweep.yaml``, validated with ``out_dir`` ``sweep_dir``
    (the folder may have moved) and the saved file as its source; None when there is none.

    Raises:
        RatuneError: the saved file does not validate, or names a ``base`` file that cannot be found.
    """
    path = Path(sweep_dir) / SAVED_SWEEP_FILE
    if not path.is_file():
        return None
    data = load_yaml(path)
    data.pop(SAVED_SWEEP_SOURCE_KEY, None)
    return sweep_from_data(data, path, sweep_dir)


def sweep_from_data(data: dict, path: str | Path, out_dir: str | Path | None = None,
                    overrides: Sequence[str] = ()) -> Sweep:
    """Validate a sweep file's mapping ``data`` read from ``path``, relative paths found by
    :func:`find_path`; ``out_dir`` overrides the file's; ``overrides`` (``--set`` texts; ``base.KEY``
    for the base training config) are applied before validation.

    Raises:
        RatuneError: unknown keys, bad values, a missing base config; a malformed override or one
            that runs into a value that is not a section.
    """
    path = Path(path)
    sets = [(*parse_set(text), text) for text in overrides]
    base_sets = [(parts[1:], value, text) for parts, value, text in sets if parts[0] == "base" and len(parts) > 1]
    data = _apply_sets(data, [s for s in sets if not (s[0][0] == "base" and len(s[0]) > 1)], str(path))
    source = f"{path} (with --set {' --set '.join(overrides)})" if overrides else str(path)
    cfg = validate(SweepConfig, data, source)
    if cfg.apibench:
        cfg = cfg.model_copy(update={"apibench": str(find_path(cfg.apibench, path))})
    if cfg.accelerate_config:
        cfg = cfg.model_copy(update={"accelerate_config": str(find_path(cfg.accelerate_config, path))})
    if isinstance(cfg.base, str):
        base_file = find_path(cfg.base, path)
        base, base_where = load_yaml(base_file), str(base_file)
    else:
        base, base_where = dict(cfg.base), f"{path} base"
    if base_sets:
        base = _apply_sets(base, base_sets, base_where)
    out = Path(out_dir or cfg.out_dir or Path("runs") / "sweeps" / (cfg.name or path.stem))
    return Sweep(config=cfg, source=str(path), out_dir=out, base=base)
