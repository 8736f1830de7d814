"""Two checkpoint-selection rules on the same training runs (docs/RESULTS.md, "Which checkpoint").

The paper's text selects on L+1; the authors' released code validates on about 2(L+1). A run made with
`run.py --select-multiple 2 --monitor-lengths 1 2 4 8` selects on a held-out validation set at 2(L+1) and
records the test sets at L+1, 2(L+1), 4(L+1) and 8(L+1) at every validation. From its `history` this script
reads what the paper's rule would have kept: the last validation with the best accuracy at L+1 (ties go to
the later checkpoint, as in the harness; here scored on the monitored L+1 test set, not on a separate
validation set). It prints, per run, both checkpoints' step and accuracies, and the means.

Usage:
    python examples/length_generalization/selection_rules.py RUN_DIR/results.json [MORE/results.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

from research import task_spec


def paper_rule(history: list[dict], length: int) -> dict:
    """The last history entry with the highest monitored accuracy at `length` (L+1)."""
    best = max(entry["monitor_accuracy"][str(length)] for entry in history)
    return [entry for entry in history if entry["monitor_accuracy"][str(length)] == best][-1]


def compare(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        for run in json.loads(Path(path).read_text())["runs"]:
            spec = task_spec(run["task"])
            lengths = [k * (spec.train_length + 1) for k in (1, 2, 4, 8)]
            if not run["history"] or any(str(n) not in run["history"][0].get("monitor_accuracy", {}) for n in lengths):
                raise ValueError(f"{path}: run without --monitor-lengths 1 2 4 8; rerun run.py with that flag.")
            kept = paper_rule(run["history"], lengths[0])
            rows.append({
                "task": run["task"], "model": run["model"], "seed": run["seed"],
                "paper_rule": {"step": kept["step"], **{n: kept["monitor_accuracy"][str(n)] for n in lengths}},
                "selected": {"step": run["best_step"], "select_length": run.get("select_length"),
                             **{n: run["test_accuracy"][str(n)] for n in lengths}},
            })  # fmt: skip
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    rows = compare(parser.parse_args(argv).results)
    for row in rows:
        for rule in ("paper_rule", "selected"):
            figures = " / ".join(f"{value:.1f}" for key, value in row[rule].items() if isinstance(key, int))
            print(f"{row['task']} {row['model']} seed {row['seed']} {rule}: step {row[rule]['step']}: {figures}")
    for rule in ("paper_rule", "selected"):
        keys = [key for key in rows[0][rule] if isinstance(key, int)]
        print(f"mean {rule}: " + " / ".join(f"{mean(row[rule][key] for row in rows):.1f}" for key in keys))
    return rows


if __name__ == "__main__":
    main()
