"""Merge several `results.json` files (e.g. seeds run as separate processes) into one summary.

Usage:
    python examples/length_generalization/merge_results.py OUT_DIR run_a/results.json run_b/results.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from panm_hf.tasks.harness import load_results, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir")
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args()
    results, metas = [], []
    for path in args.inputs:
        results += load_results(path)
        metas.append(json.loads(Path(path).read_text())["meta"])
    commands = "; ".join(meta.get("command", "?") for meta in metas)
    walls = [meta.get("wall_seconds") for meta in metas]
    write_results(results, args.output_dir, meta={"commands": commands, "wall_seconds": walls})
    print((Path(args.output_dir) / "results.md").read_text())


if __name__ == "__main__":
    main()
