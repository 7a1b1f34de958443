"""Launcher and distributed checks of a training run (docs/training.md#a-gpu-launch-never-trains-on-the-cpu,
docs/scale-out.md#what-every-run-checks)."""

from __future__ import annotations

import os

from ratune.errors import RatuneError
from ratune.train.config import TrainConfig, read_deepspeed_config


_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def num_processes() -> int:
    """The process count the launcher set (torchrun: WORLD_SIZE; mpirun: its own variables); 1 without one."""
    for key in _WORLD_SIZE_VARS:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def check_launcher() -> None:
    """Refuse a launch that started one process where more were asked: ``accelerate launch --cpu
    --num_processes N`` and a MULTI_CPU config without MPI (accelerate 1.15) set MASTER_ADDR but no
    WORLD_SIZE or RANK.

    Raises:
        RatuneError: naming the launcher to use instead.
    """
    env = os.environ
    if (env.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in env
            and not any(k in env for k in _WORLD_SIZE_VARS) and "RANK" not in env):
        raise RatuneError(
            "accelerate started a single process although more than one was asked for (MASTER_ADDR is set, "
            "WORLD_SIZE is not): `accelerate launch --cpu --num_processes N` runs ONE process; use "
            "`accelerate launch --config_file configs/accelerate/cpu_2proc_deepspeed.yaml` (torchrun; with or "
            "without DeepSpeed) or an MPI launch (--mpirun_hostfile)")


#: accelerate launch sets these in every process it starts (accelerate 1.15, all launchers).
_ACCELERATE_LAUNCH_VARS = ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_MIXED_PRECISION")
_TRUE = ("1", "true", "yes", "on")


def gpu_launch_evidence(env=None) -> str | None:
    """Why this process's ``accelerate launch`` asked for a GPU run, a short reason naming the variable;
    None for a CPU launch, no sign either way, or no ``accelerate launch``. ``env`` defaults to
    ``os.environ``; what accelerate 1.15 sets: docs/training.md#a-gpu-launch-never-trains-on-the-cpu."""
    env = os.environ if env is None else env
    if not any(k in env for k in _ACCELERATE_LAUNCH_VARS + ("ACCELERATE_USE_CPU",)):
        return None
    use_cpu = env.get("ACCELERATE_USE_CPU")
    if use_cpu is not None:
        if use_cpu.strip().lower() in _TRUE:
            return None
        return (f"ACCELERATE_USE_CPU={use_cpu}: neither `accelerate launch --cpu` nor `use_cpu: true` in the "
                "accelerate config")
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision in ("bf16", "fp16", "fp8"):
        return f"ACCELERATE_MIXED_PRECISION={precision} under a torchrun launch (a MULTI_GPU/DEEPSPEED config)"
    return None


def check_cuda_launch(env=None) -> None:
    """Refuse a GPU launch (:func:`gpu_launch_evidence`) where torch sees no CUDA device and would
    silently train on the CPU.

    Raises:
        RatuneError: one line naming torch's version and CUDA build, the evidence and what to install.
    """
    reason = gpu_launch_evidence(env)
    if reason is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        fix = ("this torch is a CPU-only build: install a CUDA build of torch (make setup TORCH=torch, or pip install "
               "torch --index-url https://download.pytorch.org/whl/cu128 with the CUDA version your driver supports)")
    else:
        fix = (f"this torch is built for CUDA {torch.version.cuda} but finds no usable GPU: check nvidia-smi and "
               "CUDA_VISIBLE_DEVICES, and install a torch build whose CUDA version the driver supports")
    raise RatuneError(f"accelerate launch asked for a GPU run ({reason}) but torch {torch.__version__} "
                      f"(torch.version.cuda {torch.version.cuda}) sees no CUDA device; {fix}; to train on the CPU on "
                      "purpose use `accelerate launch --cpu`, configs/accelerate/cpu_1proc.yaml or "
                      "cpu_2proc_deepspeed.yaml, or export ACCELERATE_USE_CPU=true")


def device_facts(device) -> dict:
    """The device a run trains on, for the manifest: ``{"type": "cuda"|"cpu", "torch", "cuda_build"}``
    plus, on CUDA, ``"name"`` (the GPU's) and ``"count"`` (GPUs this process sees)."""
    import torch

    kind = getattr(device, "type", str(device).split(":")[0])
    facts = {"type": kind, "torch": torch.__version__, "cuda_build": torch.version.cuda}
    if kind == "cuda":
        index = getattr(device, "index", None)
        facts.update(name=torch.cuda.get_device_name(index if index is not None else 0),
                     count=torch.cuda.device_count())
    return facts


def deepspeed_settings(path: str | None) -> dict | None:
    """``{"path", "zero_stage"}`` of a DeepSpeed JSON; None for no ``path``.

    Raises:
        RatuneError: see :func:`read_deepspeed_config`; ZeRO-3 without
            ``stage3_gather_16bit_weights_on_model_save: true`` (its saves would hold empty partitions).
    """
    if path is None:
        return None
    zero = read_deepspeed_config(path)["zero_optimization"]
    stage = zero["stage"]
    if stage == 3 and zero.get("stage3_gather_16bit_weights_on_model_save") is not True:
        raise RatuneError(f"{path}: ZeRO-3 needs \"stage3_gather_16bit_weights_on_model_save\": true in "
                          "zero_optimization, or the saved model holds empty partitions")
    return {"path": str(path), "zero_stage": stage}


def init_deepspeed_on_cpu(config: TrainConfig) -> bool:
    """Without CUDA, start DeepSpeed's gloo process group before the training arguments are built (else
    accelerate counts 1 process where DeepSpeed counts WORLD_SIZE); a process without a launcher
    becomes rank 0 of 1. Returns whether it did (the arguments must then say ``use_cpu``).

    Raises:
        RatuneError: deepspeed is not installed.
    """
    import torch

    if not config.deepspeed or torch.cuda.is_available():
        return False
    try:
        import deepspeed
    except ImportError:
        raise RatuneError(f"deepspeed: {config.deepspeed} needs the deepspeed package: pip install -e '.[deepspeed]' "
                          "(make setup installs it)") from None
    if "RANK" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port)}.items():
            os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return True


def distributed_facts(trainer) -> dict:
    """What the trainer actually runs: ``{"world_size", "accelerator_num_processes",
    "distributed_type", "deepspeed", "zero_stage"}`` (zero_stage None without DeepSpeed)."""
    acc = trainer.accelerator
    ds = bool(getattr(trainer, "is_deepspeed_enabled", False))
    stage = None
    if ds:
        plugin = acc.state.deepspeed_plugin
        stage = int(plugin.zero_stage) if plugin is not None and plugin.zero_stage is not None else None
    return {"world_size": int(trainer.args.world_size), "accelerator_num_processes": int(acc.num_processes),
            "distributed_type": str(getattr(acc.distributed_type, "value", acc.distributed_type)),
            "deepspeed": ds, "zero_stage": stage}


def check_distributed(facts: dict, *, expected_processes: int, deepspeed: dict | None) -> None:
    """Refuse a trainer (``facts``: :func:`distributed_facts`) that runs other than the launcher
    started (``expected_processes``) or without the configured ``deepspeed`` (:func:`deepspeed_settings`),
    with a RatuneError naming the expected and the actual value."""
    seen = {facts["world_size"], facts["accelerator_num_processes"]}
    if seen != {expected_processes}:
        raise RatuneError(f"the launcher started {expected_processes} process(es) (WORLD_SIZE) but the trainer sees "
                          f"world_size {facts['world_size']} and accelerator num_processes "
                          f"{facts['accelerator_num_processes']} ({facts['distributed_type']}); refusing to train "
                          "with a batch arithmetic that does not hold")
    if deepspeed is not None:
        if not facts["deepspeed"] or facts["distributed_type"] != "DEEPSPEED":
            raise RatuneError(f"deepspeed: {deepspeed['path']} is configured but the trainer runs "
                              f"{facts['distributed_type']} without DeepSpeed; refusing a silent fallback")
        if facts["zero_stage"] != deepspeed["zero_stage"]:
            raise RatuneError(f"{deepspeed['path']} asks for ZeRO stage {deepspeed['zero_stage']} but the trainer "
                              f"runs stage {facts['zero_stage']}")
