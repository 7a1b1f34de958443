"""``python -m ratune.train --config FILE`` (what ``accelerate launch -m ratune.train`` runs)."""

import sys

from ratune.boundary import run_guarded
from ratune.train.sft import main

if __name__ == "__main__":
    sys.exit(run_guarded(main))
