"""The Slurm launcher: sbatch scripts per hub and cell, and ``slurm/submit.sh`` chaining them."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from ratune.io import write_json, write_text
from ratune.sweep.cells import Cell, data_plan
from ratune.sweep.commands import _fmt, bfcl_command, data_command, eval_command, select_command, train_command
from ratune.sweep.local import _yaml, prepare_sweep_folder
from ratune.sweep.schema import SlurmSettings, Sweep
from ratune.sweep.state import cell_record, is_finished


def _sbatch_header(job: str, log: Path, *, nodes: int, gpus: int, time: str, s: SlurmSettings) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={gpus}", f"#SBATCH --time={time}", f"#SBATCH --output={log}"]
    if s.partition:
        lines.append(f"#SBATCH --partition={s.partition}")
    lines += [f"#SBATCH {opt}" for opt in s.extra_sbatch]
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(Path.cwd()))}", *s.setup]
    return lines


def write_slurm(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool = False, out=None,
                data_cells: list[Cell] | None = None) -> Path:
    """Write one data sbatch script per hub, ``train.sbatch`` and ``eval.sbatch`` per cell, and
    ``slurm/submit.sh`` chaining them with ``--dependency=afterok`` (finished cells commented out);
    folder and changed cells checked, ``data_cells`` planned, as in :func:`run_local`. Returns submit.sh.
    """
    out = out or sys.stdout
    prepare_sweep_folder(sweep, cells, rerun_changed=rerun_changed, out=out)
    s = sweep.config.slurm
    plan = data_plan(sweep, data_cells or cells)
    slurm_dir = sweep.out_dir / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    submit = ["#!/bin/bash", f"# ratune sweep {sweep.source}: {len(cells)} cells", "set -euo pipefail"]
    data_jobs = {}
    for hub, entry in plan.items():
        name = re.sub(r"\W", "_", Path(entry["dir"]).name)  # a folder hub's path is no file or shell name
        script = slurm_dir / f"data_{name}.sbatch"
        lines = _sbatch_header(f"ratune-data-{name}", slurm_dir / f"data_{name}-%j.out", nodes=1, gpus=1,
                               time=s.eval_time or s.time, s=s)
        lines += ["# a folder built with the same request is reused (--reuse-if-same); one that differs is rebuilt",
                  _fmt(data_command(sweep, hub, entry))]
        write_text(script, "\n".join(lines) + "\n")
        data_jobs[hub] = f"data_{name}_jid"
        submit.append(f"data_{name}_jid=$(sbatch --parsable {shlex.quote(str(script))})")
    nprocs = s.nodes * s.gpus_per_node
    for cell in cells:
        sdir = cell.dir / "slurm"
        sdir.mkdir(parents=True, exist_ok=True)
        write_json(cell.dir / "cell.json", cell_record(sweep, cell))
        write_text(cell.dir / "train.yaml", _yaml(cell.config))
        launch = train_command(sweep, cell, launch_args=[
            "--num_machines", "$SLURM_NNODES", "--machine_rank", "$SLURM_NODEID",
            "--main_process_ip", "$MAIN_IP", "--main_process_port", str(s.main_process_port),
            "--num_processes", str(nprocs)])
        launch_text = " ".join(a if a.startswith("$") else shlex.quote(a) for a in launch)
        train = _sbatch_header(f"ratune-train-{cell.name}"[:120], sdir / "train-%j.out", nodes=s.nodes,
                               gpus=s.gpus_per_node, time=s.time, s=s)
        train += [f"if [ -f {shlex.quote(str(cell.dir / 'train'))}/.complete ]; then echo 'cell already trained'; exit 0; fi",
                  'export MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                  "# an unfinished run is resumed or restarted by ratune.train itself (--on-unfinished), under its lock",
                  "# one accelerate launcher per node; $SLURM_NODEID is expanded on each node",
                  f"srun --ntasks-per-node=1 bash -c {shlex.quote(launch_text)}"]
        write_text(sdir / "train.sbatch", "\n".join(train) + "\n")
        ev = _sbatch_header(f"ratune-eval-{cell.name}"[:120], sdir / "eval-%j.out", nodes=1, gpus=1,
                            time=s.eval_time or s.time, s=s)
        e = sweep.config.eval
        if e.selection_rule is None and e.settings:
            ev.append(_fmt(eval_command(sweep, cell)))
        if e.curve_settings:
            ev.append(_fmt(eval_command(sweep, cell, curve=True)))
        chosen = None
        if e.selection_rule is not None:  # the test questions of the checkpoint chosen on the curve
            chosen = "CHOSEN"
            ev.append(f"CHECKPOINT=$({_fmt(select_command(sweep, cell))})")
            if e.settings:
                ev.append(_fmt(eval_command(sweep, cell, checkpoint=chosen)).replace(chosen, '"$CHECKPOINT"', 1))
        if sweep.config.bfcl is not None:
            line = _fmt(bfcl_command(sweep, cell, checkpoint=chosen))
            ev.append(line.replace(chosen, '"$CHECKPOINT"', 1) if chosen else line)
        write_text(sdir / "eval.sbatch", "\n".join(ev) + "\n")
        prefix = "# finished: " if is_finished(sweep, cell) else ""
        submit += [f"# cell {cell.name}",
                   f"{prefix}jid=$(sbatch --parsable --dependency=afterok:${data_jobs[cell.hub]} "
                   f"{shlex.quote(str(sdir / 'train.sbatch'))})",
                   f"{prefix}sbatch --parsable --dependency=afterok:$jid {shlex.quote(str(sdir / 'eval.sbatch'))}"]
    path = slurm_dir / "submit.sh"
    write_text(path, "\n".join(submit) + "\n")
    path.chmod(0o755)
    print(f"wrote {len(cells)} cells' sbatch scripts; submit with: bash {path}", file=out)
    return path
