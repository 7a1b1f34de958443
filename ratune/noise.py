"""Third-party messages ratune silences (matched by text, each with the reason it is noise here);
every other warning and log line stays. Installed by the error boundary."""

from __future__ import annotations

import logging
import warnings

#: (logger name, message prefix, why it is noise). DeepSpeed 0.19.8's accelerator autodetection
#: (deepspeed/accelerator/real_accelerator.py) warns whenever torch sees no CUDA; ratune refuses a
#: GPU launch without CUDA itself (train/launch.py check_cuda_launch), so on a CPU run it says nothing.
NOISY_LOG_RECORDS = (
    ("DeepSpeed", "Setting accelerator to CPU", "a CPU run is intended; GPU launches without CUDA are refused"),
)

#: (category, message regex, why it is noise). peft 0.21 (peft_model.py, mixed_model.py) and
#: TRL 1.16 (models/utils.py) read ``model.is_gradient_checkpointing``, which transformers 5.24
#: deprecates; ratune passes the new ``activation_checkpointing`` training argument itself.
NOISY_WARNINGS = (
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", "read by peft and TRL, not by ratune or the user"),
)


class _DropPrefixes(logging.Filter):
    """A logging filter that drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


_installed = False


def quiet_known_noise() -> None:
    """Install the filters of NOISY_LOG_RECORDS and NOISY_WARNINGS (idempotent)."""
    global _installed
    if _installed:
        return
    by_logger: dict[str, list[str]] = {}
    for name, prefix, _why in NOISY_LOG_RECORDS:
        by_logger.setdefault(name, []).append(prefix)
    for name, prefixes in by_logger.items():
        logging.getLogger(name).addFilter(_DropPrefixes(tuple(prefixes)))
    for category, message, _why in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    _installed = True
