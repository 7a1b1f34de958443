"""The reproduction's arms, named once for both scripts in this folder: each arm's folder under
docs/reproduction/, its label in the tables, and where its eval cells were written under runs/
(glob patterns: a sweep cell's folder name carries its hash). runs/ does not outlive a session; an
arm whose runs/ folders are gone is read from the cells already copied into docs/reproduction/ARM/."""
from glob import glob
from pathlib import Path

#: arm -> (label (worst_case.py lists the models in this order), runs/ folders holding one subfolder per eval setting)
ARMS = {
    "mix": ("mixture arm, LoRA, epoch 1", ("runs/repro/eval_mix_step105",)),
    "none": ("none arm, LoRA, epoch 3", ("runs/repro/eval_none_final", "runs/repro/curve_none/step315")),
    "oracle": ("oracle arm, LoRA, epoch 1", ("runs/repro/eval_oracle_step105",)),
    "mix_full": ("mixture arm, full finetuning, epoch 2", ("runs/repro/eval_mix_full_step210",)),
    "none_full": ("none arm, full finetuning, epoch 2",
                  ("runs/repro/eval_none_full_step210", "runs/repro/curve_none_full/step210")),
    "none_full3": ("none arm, full finetuning, epoch 3",
                   ("runs/repro/none_full3/cells/*/eval", "runs/repro/none_full3_more")),
    "none_full4": ("none arm, full finetuning, epoch 4",
                   ("runs/repro/none_full4/cells/*/eval", "runs/repro/none_full4_more")),
    "oracle_full1": ("oracle arm, full finetuning, epoch 1", ("runs/repro/oracle_full1/cells/*/eval",)),
    "oracle_full3": ("oracle arm, full finetuning, epoch 3", ("runs/repro/oracle_full3/eval", "runs/repro/oracle_full3_more")),
    "mix_bm25_full3": ("robust_bm25 mixture arm, full finetuning, epoch 3",
                       ("runs/repro/mix_bm25_full3/cells/*/eval", "runs/repro/mix_bm25_full3_more")),
    "mix_bm25_full4": ("robust_bm25 mixture arm, full finetuning, epoch 4", ("runs/repro/mix_bm25_full4/eval",)),
}
#: each mixture arm against these arms, setting by setting
MIXTURE_VS = {"mix": ("none", "oracle"), "mix_full": ("none_full", "oracle", "mix"),
              "mix_bm25_full3": ("none_full3", "oracle", "mix_full", "oracle_full3"),
              "mix_bm25_full4": ("mix_bm25_full3", "none_full3", "none_full4", "oracle", "oracle_full1", "oracle_full3")}
#: arm -> (the other arm, key in comparisons.json, heading): one more arm compared setting by setting
VS = {"none_full": ("none", "vs_lora_none_arm", "Full finetuning against the LoRA none arm"),
      "none_full4": ("none_full3", "vs_epoch3", "The fourth epoch against the third"),
      "oracle_full1": ("oracle", "vs_lora_oracle_arm", "Full finetuning against the LoRA oracle arm"),
      "oracle_full3": ("oracle_full1", "vs_epoch1", "The third epoch against the first")}
#: an arm of configs/sweeps/reproduce_torchhub.yaml (its train_retriever) -> the arm folders that hold its cells
#: (check_reproduce.py): "final" -> the cells of the trained model, and its learning curve as curve_stepN/;
#: a step -> the cells of that checkpoint, committed by a shorter run of the same recipe
SWEEP_ARMS = {"none": {"final": "none_full3", 210: "none_full"},
              "oracle": {"final": "oracle_full3", 105: "oracle_full1"},
              "mix-robust_bm25": {"final": "mix_bm25_full3"}}
DOCS = Path("docs/reproduction")


def label(arm: str) -> str:
    """The arm's label in every table."""
    return ARMS[arm][0]


def sources(arm: str) -> list[Path]:
    """The arm's runs/ folders that exist now (globs expanded, sorted)."""
    return [Path(p) for pattern in ARMS[arm][1] for p in sorted(glob(pattern)) if Path(p).is_dir()]
