"""One learning curve from eval cells of one training run that were evaluated at different times
(e.g. epochs 1-3 by the sweep's curve, epoch 4 after the run was resumed for one more epoch):
learning_curve.{md,csv,png} in the sweep report's format (ratune.eval.curve.write_curves_report).
Run from the repository root:
    python docs/reproduction/scripts/join_curve.py OUT LABEL STEP:EPOCH:CELL_FOLDER..."""
import sys
from pathlib import Path

from ratune.eval.curve import curve_row, write_curves_report
from ratune.io import read_json

out, label, *points = sys.argv[1:]
rows = []
for point in points:
    step, epoch, cell = point.split(":", 2)
    metrics = read_json(Path(cell) / "metrics.json")
    rows.append(curve_row(int(step), float(epoch), Path(cell).name, metrics))
write_curves_report({label: rows}, out)
print((Path(out) / "learning_curve.md").read_text())
