"""``python -m ratune.eval.scoring --hub ... --responses ...`` (the same as ``ratune eval score``)."""

import sys

from ratune.eval.scoring.cli import main

sys.exit(main())
