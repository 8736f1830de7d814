"""Plot test perplexity per epoch of several `run_translation.py` runs on one figure.

Each `results.json` holds one or two models; a model is labelled `name` (plus its
placement for PANM), or `name@file` when two files hold the same label.

    python examples/translation/plot_runs.py runs/mt_0.5/results.json runs/mt_0.5_stack/results.json \
        --output runs/perplexity_0.5.png --title "Multi30K, split 0.5"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from run_translation import plot_perplexity  # this script's folder is first on the import path


def collect(paths: list[str]) -> dict:
    """`{label: model results}` over the files, in order; the model's placement joins PANM's label."""
    merged: dict = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        missing = [key for key in ("results", "placement") if key not in run]
        if missing:
            raise ValueError(f"{path} lacks {missing}; pass results.json files written by run_translation.py.")
        for name, result in run["results"].items():
            label = f"{name} ({run['placement']})" if name == "panm" else name
            if label in merged:
                label = f"{label}@{Path(path).name}"
            merged[label] = result
    return merged


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.json files written by run_translation.py")
    parser.add_argument("--output", required=True, help="PNG to write")
    parser.add_argument("--title", default="test perplexity per epoch")
    args = parser.parse_args(argv)
    merged = collect(args.results)
    plot_perplexity(merged, args.output, args.title)
    return merged


if __name__ == "__main__":
    main()
