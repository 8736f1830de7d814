"""Merge several `results.json` files (e.g. seeds run as separate processes) into one summary.

Usage:
    python examples/length_generalization/merge_results.py OUT_DIR run_a/results.json run_b/results.json \
        [--models panm content]   # keep only these models' runs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from research.harness import load_results, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--models", nargs="+", default=None, help="keep only the runs of these models")
    parser.add_argument(
        "--plot", action="store_true", help="also draw accuracy_vs_length.png (and monitor_curves.png if monitored)"
    )
    args = parser.parse_args()
    results, metas = [], []
    for path in args.inputs:
        results += [run for run in load_results(path) if args.models is None or run.model in args.models]
        metas.append(json.loads(Path(path).read_text())["meta"])
    commands = "; ".join(meta.get("command") or meta.get("commands", "?") for meta in metas)
    walls = [meta.get("wall_seconds") for meta in metas]
    summary = write_results(results, args.output_dir, meta={"commands": commands, "wall_seconds": walls})
    if args.plot:
        from run import plot_accuracy, plot_monitor_curves  # the demo's plots, beside this script

        plot_accuracy(summary, Path(args.output_dir) / "accuracy_vs_length.png")
        if all(entry.get("monitor_accuracy") for run in results for entry in run.history):
            plot_monitor_curves(results, Path(args.output_dir) / "monitor_curves.png")
    print((Path(args.output_dir) / "results.md").read_text())


if __name__ == "__main__":
    main()
