"""The CPU demo: the whole RAT pipeline on real data in about half an hour on 2 cores.

Steps (each skipped when its output folder is already complete, so a rerun resumes):
convert SmolLM2-135M-Instruct once, build the TorchHub chats, train one LoRA model per arm
(train-time retrieval none and oracle), evaluate each under the test settings, and write the
Table 2 files. Prints the table and the wall time per stage.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

from ratune.config import SCHEMA_CONFIG, Threads, TrainModeName, load_yaml, validate
from ratune.data.apibench import HUBS
from ratune.data.build import BUILD_OPTIONS, BuildSettings
from ratune.eval.settings import EVAL_OPTIONS, EvalSettings
from ratune.options import config_model, config_values
from ratune.train.model import DEMO_MODEL_ALIAS

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


#: The demo's ``data:`` section: every data build option of :class:`~ratune.data.build.BuildSettings`
#: (data/build.py BUILD_OPTIONS), with the demo's own defaults.
DemoData = config_model("DemoData", BuildSettings, BUILD_OPTIONS, doc="The demo's data build settings.",
                        defaults={"max_length": 768, "max_document_tokens": 128})


#: The demo's ``eval:`` section: every eval option (eval/settings.py EVAL_OPTIONS), with the demo's
#: own defaults (configs/demo.yaml names its settings); ``threads`` defaults to the top-level
#: ``torch_threads``.
DemoEval = config_model("DemoEval", EvalSettings, EVAL_OPTIONS, doc="The demo's eval settings.",
                        defaults={"n_questions": 50, "max_new_tokens": 80, "stop_after_api_call": True})


class DemoConfig(BaseModel):
    """configs/demo.yaml."""

    model_config = SCHEMA_CONFIG
    hub: Literal[HUBS] = "torchhub"
    out_dir: str = "runs/demo"
    model: str = DEMO_MODEL_ALIAS
    apibench: str | None = None
    torch_threads: Threads | None = 2
    data: DemoData = DemoData()
    arms: list[TrainModeName] = Field(default_factory=lambda: ["none", "oracle"])
    train: dict = Field(default_factory=dict)
    eval: DemoEval = DemoEval()


def run_demo(config_path: str | None = None, *, out_dir: str | None = None, apibench: str | None = None) -> int:
    """Run (or resume) the demo; returns 0. See the module docstring.

    ``apibench`` (``ratune demo --apibench DIR``) overrides the config's ``apibench`` key; with
    neither, the APIBench folder is $RATUNE_APIBENCH or ../shared/apibench
    (:func:`ratune.data.apibench.resolve_apibench_dir`).

    Holds the output folder's lock throughout (:func:`ratune.locks.output_lock`) and writes only
    into a folder that is new, empty or a ratune demo output (:func:`ratune.manifest.require_owned`).
    An unfinished training arm is deleted only when it is a ratune train output.

    Raises:
        RatuneError: a bad config, an output folder ratune did not make, and the stages' errors.
        LockHeld: another process is writing the output folder (or one of its stages' folders).
    """
    from ratune.locks import output_lock
    from ratune.manifest import OWNER_MARKER, claim_folder, require_owned

    path = Path(config_path) if config_path else DEFAULT_CONFIG
    cfg = validate(DemoConfig, load_yaml(path), str(path))
    if apibench is not None:
        cfg = cfg.model_copy(update={"apibench": apibench})
    out = Path(out_dir or cfg.out_dir)
    require_owned(out, "demo", action="write into")
    with output_lock(out, command="demo"):
        require_owned(out, "demo", action="write into")
        if not (out / OWNER_MARKER).exists():
            claim_folder(out, "demo")
        return _run_demo(cfg, path, out)


def _run_demo(cfg: DemoConfig, path: Path, out: Path) -> int:
    """The body of :func:`run_demo`, run under the output folder's lock."""
    from ratune.data.apibench import resolve_apibench_dir
    from ratune.data.build import build_dataset
    from ratune.eval.report import make_cell, table2_markdown, write_table2
    from ratune.eval.run import evaluate_checkpoint
    from ratune.locks import output_lock
    from ratune.manifest import is_complete, require_owned
    from ratune.train.config import TrainConfig
    from ratune.train.model import load_tokenizer, resolve_model_path, set_torch_threads
    from ratune.train.sft import train

    apibench = resolve_apibench_dir(cfg.apibench)
    set_torch_threads(cfg.torch_threads)
    times: dict[str, float] = {}

    t0 = time.time()
    model_path = resolve_model_path(cfg.model)  # the demo alias: converted once (train/model.py)
    times["convert model"] = time.time() - t0

    t0 = time.time()
    data_dir = out / "data"
    if not is_complete(data_dir):
        build_dataset(apibench_dir=apibench, hub=cfg.hub, out_dir=data_dir, tokenizer=load_tokenizer(model_path),
                      tokenizer_name=cfg.model, modes=cfg.arms, overwrite=True,
                      settings=BuildSettings(**config_values(cfg.data, BUILD_OPTIONS)))
    times["build data"] = time.time() - t0

    cells = []
    for arm in cfg.arms:
        run_dir = out / f"train_{arm}"
        train_cfg = validate(TrainConfig, {
            "model": cfg.model, "data_dir": str(data_dir), "train_retriever": arm, "output_dir": str(run_dir),
            "hub": cfg.hub, "max_length": cfg.data.max_length, "torch_threads": cfg.torch_threads, **cfg.train,
        }, f"{path}: train")
        t0 = time.time()
        if not is_complete(run_dir):
            import shutil

            require_owned(run_dir, "train", action="delete")  # an unfinished ratune run, or nothing
            with output_lock(run_dir, command="demo"):  # not while a `ratune train` writes it
                shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished demo arm restarts from scratch
            run_dir.mkdir(parents=True)
            (run_dir.parent / f"train_{arm}.yaml").write_text(yaml.safe_dump(train_cfg.model_dump(), sort_keys=True))
            train(train_cfg, config_path=str(run_dir.parent / f"train_{arm}.yaml"))
        times[f"train {arm}"] = time.time() - t0

        t0 = time.time()
        results = evaluate_checkpoint(
            run_dir, hub=cfg.hub, apibench_dir=apibench, out_dir=out / f"eval_{arm}", model_name=f"train_{arm}",
            settings=EvalSettings(**{**config_values(cfg.eval, EVAL_OPTIONS),
                                     "torch_threads": cfg.eval.threads or cfg.torch_threads}))
        times[f"eval {arm}"] = time.time() - t0
        cells += [make_cell(arm, setting, metrics) for setting, metrics in results.items()]

    t0 = time.time()
    table = write_table2(cells, hub=cfg.hub, model=Path(cfg.model).name, out_dir=out)
    times["report"] = time.time() - t0
    print(table2_markdown(table))
    print("Wall time per stage (s):")
    for stage, seconds in times.items():
        print(f"  {stage:16s} {seconds:8.1f}")
    print(f"  {'total':16s} {sum(times.values()):8.1f}")
    print(f"Wrote {out}/table2.md, table2.csv, table2.json, table2.png")
    return 0


def cli_demo(args) -> int:
    """``ratune demo [--config FILE] [--out DIR] [--apibench DIR]``: :func:`run_demo` (``args`` from its
    parser, ratune/cli.py). Returns 0."""
    return run_demo(args.config, out_dir=args.out, apibench=args.apibench)
