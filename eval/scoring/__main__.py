"""``python -m ratune.eval.scoring --hub ... --responses ...`` (the same as ``ratune eval score``)."""

import sys

from ratune.eval.cli import score_main

sys.exit(score_main())
