#!/usr/bin/env python
"""Which longer SCAN outputs need a composition the training set never showed.

A SCAN command is one clause or two joined by `and` / `after` (`jump around left thrice after walk twice`).
Below a cut-off L the long clauses can only appear alone: at L = 24, `look around left thrice` (24 actions)
is in the training set, but never beside a second clause. This script sorts every test command of a run by
what training showed of its clauses:

- **composed**: every clause appears in some two-clause training command;
- **alone only**: some clause appears in training, but only as a whole command;
- **unseen**: some clause never appears in training.

and gives each class's share of the test set, its exact match and its EOS outcome (from the run's saved
model, greedy as in the run; with `--no_model`, only the shares). A low score on **composed** is a length
failure; on the other two, the model must also compose a clause it never saw composed.

    python examples/scan/composition.py runs/scan/panm_one_design_ek_L24_s0 --data_dir ../shared/data/scan \
        --output composition.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from panm_hf.pipelines.scan_data import ScanSplit, load_cutoff_split, score

CLASSES = ("composed", "alone only", "unseen")
CONJUNCTION = re.compile(r" (?:and|after) ")


def clauses(command: str) -> list[str]:
    """The one or two clauses of a SCAN command."""
    return CONJUNCTION.split(command)


def classify(commands: list[str], training: list[str]) -> list[str]:
    """One of CLASSES per command, from the clauses of the training commands."""
    composed = {clause for command in training for clause in clauses(command) if len(clauses(command)) > 1}
    seen = {clause for command in training for clause in clauses(command)}

    def one(command: str) -> str:
        parts = clauses(command)
        if any(part not in seen for part in parts):
            return "unseen"
        return "composed" if all(part in composed for part in parts) else "alone only"

    return [one(command) for command in commands]


def breakdown(classes: list[str], predictions: list[str] | None, targets: list[str]) -> dict:
    """Per class: count, share of the test set (%), and with predictions `score`'s EOS diagnosis (% of the class)."""
    rows = {}
    for name in CLASSES:
        chosen = [i for i, c in enumerate(classes) if c == name]
        row = {"count": len(chosen), "share": 100.0 * len(chosen) / max(len(classes), 1)}
        if predictions is not None and chosen:  # the run's own EOS diagnosis, on this class alone
            split = ScanSplit([""] * len(chosen), [targets[i] for i in chosen])
            row.update(score([predictions[i] for i in chosen], split)["eos_diagnosis"])
        rows[name] = row
    return rows


def analyse(run_dir: Path, data_dir: Path, use_model: bool) -> dict:
    path = run_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass run folders written by run_scan.py.")
    summary = json.loads(path.read_text())
    train, _, test = load_cutoff_split(data_dir, summary["cutoff"])
    classes = classify(test.commands, train.commands)  # what the run trained on, not its i.i.d. set
    predictions = None
    if use_model:
        from eos_oracle import decode, load_run  # torch and transformers only when a model is decoded

        _, model, tokenizer = load_run(run_dir)
        predictions = decode(model, tokenizer, test.commands, None)
    return {"run": run_dir.name, "cutoff": summary["cutoff"], "num_test": len(test.commands),
            "classes": breakdown(classes, predictions, test.actions)}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--data_dir", type=Path, default=Path("../shared/data/scan"))
    parser.add_argument("--no_model", action="store_true", help="only the classes' shares; decode nothing")
    parser.add_argument("--output", type=Path, default=None, help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = [analyse(run_dir, args.data_dir, not args.no_model) for run_dir in args.runs]
    for row in rows:
        parts = []
        for name, values in row["classes"].items():
            scored = f", right {values['correct']:.1f}, early {values['early']:.1f}" if "correct" in values else ""
            parts.append(f"{name} {values['share']:.1f}% ({values['count']}{scored})")
        print(f"{row['run']} (L = {row['cutoff']}): " + "; ".join(parts))
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
