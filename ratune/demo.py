"""The CPU demo (docs/demo.md): the sweep file configs/demo.yaml run with the local launcher and
reported, after converting the demo model, with the wall time per stage printed."""

from __future__ import annotations

import time
from pathlib import Path

from ratune.config import load_yaml
from ratune.sources.apibench import resolve_apibench_dir
from ratune.eval.report import table2_markdown
from ratune.manifest import DEMO_STAGE, SWEEP_FOLDER_STAGES
from ratune.models import resolve_model_path
from ratune.output import StageOutput
from ratune.sweep import check_changed, expand, is_finished, report_sweep, run_local, sweep_from_data
from ratune.sweep import local as sweep_local
from ratune.sweep.schema import check_files

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"

def run_demo(config_path: str | None = None, *, out_dir: str | None = None, apibench: str | None = None,
             rerun_changed: bool = False) -> int:
    """Run (or resume) the demo; returns 0 when every cell finished, else 1. ``apibench`` overrides the
    config's; ``rerun_changed`` reruns an arm whose resolved config changed.

    Raises:
        RatuneError: a bad config, a missing APIBench, a refused output folder, a changed arm, and
            the stages' errors.
        LockHeld: another process is writing the output folder (or one of its stages' folders).
    """
    path = Path(config_path) if config_path else DEFAULT_CONFIG
    data = load_yaml(path)
    sweep = sweep_from_data(data, path, out_dir)
    check_files(sweep)
    if apibench is not None:
        sweep.config = sweep.config.model_copy(update={"apibench": apibench})
    resolve_apibench_dir(sweep.config.apibench)
    cells = expand(sweep)
    out = sweep.out_dir
    with StageOutput(out, DEMO_STAGE, also=SWEEP_FOLDER_STAGES, command=DEMO_STAGE).writing():  # a sweep folder too
        return _run_demo(sweep, cells, rerun_changed=rerun_changed)


def _run_demo(sweep, cells, *, rerun_changed: bool) -> int:
    """The body of :func:`run_demo`, run under the output folder's lock."""
    if not rerun_changed:
        check_changed(sweep, cells, rerun_changed=False)  # a changed arm is refused before the model conversion
    times: dict[str, float] = {}
    t0 = time.time()
    for model in dict.fromkeys(c.config["model"] for c in cells):
        resolve_model_path(model)  # the demo alias: converted once (ratune/models.py)
    times["convert model"] = time.time() - t0

    arm = {str(c.dir): " ".join(str(v) for v in c.axes.values()) for c in cells}

    def timed(cmd: list[str], log: Path) -> None:  # the sweep's runner, timing each step by stage
        stage = "build data" if log.parent == sweep.out_dir / "logs" else f"{log.stem} {arm[str(log.parent.parent)]}"
        start = time.time()
        try:
            sweep_local.run_command(cmd, log)
        finally:
            times[stage] = times.get(stage, 0.0) + time.time() - start

    status = run_local(sweep, cells, runner=timed, rerun_changed=rerun_changed)
    if not any(is_finished(sweep, c) for c in cells):
        return status  # run_local named the failures; there is nothing to report
    t0 = time.time()
    tables = report_sweep(sweep.out_dir)
    times["report"] = time.time() - t0
    for table in tables.values():
        print(table2_markdown(table))
    print("Wall time per stage (s):")
    for stage, seconds in times.items():
        print(f"  {stage:16s} {seconds:8.1f}")
    print(f"  {'total':16s} {sum(times.values()):8.1f}")
    print(f"Wrote {sweep.out_dir / 'report'}: " + ", ".join(f"{name}/table2.{{md,csv,json,png}}" for name in tables))
    return status


def cli_demo(args) -> int:
    """``ratune demo [--config FILE] [--out DIR] [--apibench DIR] [--rerun-changed]``: :func:`run_demo`
    (``args`` from its parser, ratune/cli.py). Returns its status."""
    return run_demo(args.config, out_dir=args.out, apibench=args.apibench, rerun_changed=args.rerun_changed)
