#!/usr/bin/env python
"""Plot SCAN runs' curves against training steps: exact match on the fixed test and i.i.d. samples.

    python examples/scan/plot_curves.py runs/scan/panm_nope_L26_s0 runs/scan/transformer_L26_s0 \
        --output docs/results/scan/curves_L26.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_curve(run_dir: Path) -> tuple[str, list[dict]]:
    """(label, curve) of one run folder's results.json; ValueError when it has no curve."""
    path = run_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass run folders written by run_scan.py.")
    summary = json.loads(path.read_text())
    (curve,) = [result["curve"] for result in summary["results"].values()]
    if not curve:
        raise ValueError(f"{path} has no curve; train with --eval_every N.")
    return f"{run_dir.parent.name}/{run_dir.name}", curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for run_dir in args.runs:
        label, curve = load_curve(run_dir)
        steps = [point["step"] for point in curve]
        line = axes[0].plot(steps, [point["test_exact_match"] for point in curve], marker="o", label=label)[0]
        axes[1].plot(steps, [point["heldout_exact_match"] for point in curve], marker="o", color=line.get_color())
    axes[0].set_title("longer outputs (test sample)")
    axes[1].set_title("i.i.d. lengths (held-out sample)")
    for axis in axes:
        axis.set_xlabel("training step")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("exact match (%)")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.output, dpi=110)
    from PIL import Image  # matplotlib's own dependency: a 256-colour palette makes the file a third as large

    Image.open(args.output).convert("RGB").quantize(colors=256).save(args.output, optimize=True)


if __name__ == "__main__":
    main()
