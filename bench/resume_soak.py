"""A soak of the resume path: a tiny model's training killed (SIGKILL) at random moments, M times,
resumed each time, must end with the weights of an uninterrupted run.

Usage::

    python bench/resume_soak.py --kills 50 [--steps 12] [--seed 0] [--out result.json]

The run (``python -m ratune.train --on-unfinished resume``, what a sweep reruns) trains a tiny
random Llama (the SmolLM2 tokenizer) on the first rows of the real TorchHub data build, saving a
Trainer checkpoint every step. Kills alternate between a random moment of the process (start-up,
a step, a save) and a moment inside the next checkpoint's save (after its weights, before its
optimizer and trainer state: a partial checkpoint). After each kill the next start resumes from
the newest complete checkpoint. It prints the kills survived (restarts that did not end in an
error), then compares every tensor of the final model with the uninterrupted run's and exits 1 on
any divergence or failed restart. About 10 s a kill on 2 cores; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from behaviour_hashes import TINY_MODEL  # noqa: E402  (the tiny model every bench shares)

ROOT = Path(__file__).resolve().parent.parent
#: Kill the process inside the save of checkpoint-$RATUNE_SOAK_KILL_AT: after its weights, before the rest.
KILL_IN_SAVE = """
import os, signal
import transformers.trainer as t
_orig = t.Trainer._save_optimizer_and_scheduler
def save(self, output_dir):
    if output_dir.endswith("checkpoint-" + os.environ.get("RATUNE_SOAK_KILL_AT", "-")):
        os.kill(os.getpid(), signal.SIGKILL)
    return _orig(self, output_dir)
t.Trainer._save_optimizer_and_scheduler = save
"""


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)


def prepare(work: Path, apibench: str, steps: int) -> tuple[Path, dict]:
    """The tiny model, its data build (mode none) and the run's config (without output_dir)."""
    model, data = work / "model", work / "data"
    proc = _run(["-c", TINY_MODEL, str(model)])
    if proc.returncode:
        raise SystemExit(f"resume_soak: making the tiny model failed:\n{proc.stderr[-2000:]}")
    proc = _run(["-m", "ratune.cli", "data", "build", "--apibench", apibench, "--hub", "torchhub", "--out", str(data),
                 "--tokenizer", str(model), "--modes", "none", "--max-length", "512"])
    if proc.returncode:
        raise SystemExit(f"resume_soak: the data build failed:\n{proc.stderr[-2000:]}")
    return data, {"model": str(model), "data_dir": str(data), "train_retriever": "none", "max_length": 512,
                  "global_batch_size": 2, "per_device_batch_size": 1, "gradient_accumulation_steps": 2,
                  "max_steps": steps, "max_examples": 2 * steps, "save_steps": 1, "learning_rate": 1e-3,
                  "lr_scheduler": "linear", "warmup_ratio": 0.25, "seed": 0, "torch_threads": 1}


def _config(work: Path, base: dict, out: Path) -> Path:
    path = work / f"{out.name}.yaml"
    path.write_text(json.dumps({**base, "output_dir": str(out)}))
    return path


def _newest_complete_step(run: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in (run / "trainer").glob("checkpoint-*")
             if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()] if (run / "trainer").is_dir() else []
    return max(steps, default=0)


def soak(work: Path, base: dict, kills: int, seed: int, reference: Path, duration: float) -> dict:
    """Kill and resume the run until ``kills`` kills have landed; each time the run finishes (a
    round), compare its model with ``reference`` and start a new round. A random kill lands at a
    uniform moment of an uninterrupted run's ``duration`` (seconds, start-up included). Returns the counts."""
    rng = random.Random(seed)
    run = work / "soaked"
    config = _config(work, base, run)
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(KILL_IN_SAVE)
    done = {"kills": 0, "in_save": 0, "restarts_failed": 0, "rounds": 0, "rounds_identical": 0,
            "tensors_differing": [], "errors": []}

    def end_round():
        differ = compare_weights(reference, run / "model")
        done["rounds"] += 1
        done["rounds_identical"] += not differ
        done["tensors_differing"] += differ
        shutil.rmtree(run)

    while done["kills"] < kills and done["restarts_failed"] < 3:
        if (run / ".complete").exists():
            end_round()
        in_save = done["kills"] % 2 == 1
        env = dict(os.environ)
        if in_save:
            env["PYTHONPATH"] = f"{hook}{os.pathsep}{env.get('PYTHONPATH', '')}"
            env["RATUNE_SOAK_KILL_AT"] = str(_newest_complete_step(run) + 1)
        proc = subprocess.Popen([sys.executable, "-m", "ratune.train", "--config", str(config), "--on-unfinished",
                                 "resume"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not in_save:
            time.sleep(rng.uniform(0.05, 1.0) * duration)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        if proc.returncode == -signal.SIGKILL:
            done["kills"] += 1
            done["in_save"] += in_save
        elif proc.returncode != 0:
            done["restarts_failed"] += 1
            done["errors"].append(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}")
        print(f"[soak] kills {done['kills']}/{kills} (inside a save: {done['in_save']}), rounds {done['rounds']}, "
              f"failed restarts {done['restarts_failed']}, newest complete checkpoint {_newest_complete_step(run)}",
              flush=True)
    if not (run / ".complete").exists():
        proc = _run(["-m", "ratune.train", "--config", str(config), "--on-unfinished", "resume"])
        if proc.returncode:
            done["restarts_failed"] += 1
            done["errors"].append(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "final run failed")
    if (run / ".complete").exists():
        end_round()
    return done


def _machine() -> dict:
    """Package versions and the host's CPU facts (ratune.manifest), for the result file."""
    from ratune.manifest import host_facts, package_versions

    return {"versions": package_versions(), "host": host_facts()}


def compare_weights(a: Path, b: Path) -> list[str]:
    """The tensor names whose values differ (or that only one model has)."""
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return sorted(k for k in x.keys() | y.keys() if k not in x or k not in y or not torch.equal(x[k], y[k]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apibench", default=os.environ.get("RATUNE_APIBENCH", str(ROOT.parent / "shared" / "apibench")))
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result (JSON) here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ratune-soak-") as tmp:
        work = Path(tmp)
        _, base = prepare(work, args.apibench, args.steps)
        start = time.perf_counter()
        reference = _run(["-m", "ratune.train", "--config", str(_config(work, base, work / "straight"))])
        if reference.returncode:
            raise SystemExit(f"resume_soak: the uninterrupted run failed:\n{reference.stderr[-2000:]}")
        duration = time.perf_counter() - start
        done = soak(work, base, args.kills, args.seed, work / "straight" / "model", duration)
        result = {**done, "kills_asked": args.kills, "steps": args.steps, "seed": args.seed,
                  "identical": done["rounds"] > 0 and done["rounds_identical"] == done["rounds"]
                  and not done["restarts_failed"], "seconds": round(time.perf_counter() - start, 1),
                  **_machine()}
    print(f"kills survived: {result['kills'] - result['restarts_failed']} of {result['kills']} "
          f"({result['in_save']} inside a save); failed restarts {result['restarts_failed']}; final weights of "
          f"{result['rounds_identical']} of {result['rounds']} finished runs identical to the uninterrupted run's")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
