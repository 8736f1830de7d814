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

`pairs` splits the same test set by the action counts of its clauses in the order the output writes them
(`16+24`: a 16-action clause, then a 24-action one; `after` writes its second clause first; one number: a
single clause). Every longer output pairs two clauses longer together than training ever did; the cells say
which pairings a run fails.

`after_longest` splits the commands whose first written clause is SCAN's longest (`<action> around
<direction> thrice`, 24 actions) by their partner: **repeat** when the partner writes only actions the
clause writes (`walk around right thrice and walk around right`: no token marks where one ends and the other
begins, so a decoder that sees only its last tokens cannot count the partner), **differ** otherwise.

`turns` splits the test set by the turns its output makes: **one way** when every turn action turns the same way
(`jump around right thrice and walk around right thrice`: 48 actions that all turn right), **both ways** when it
turns left and right, **none** without a turn. Each group gives its `one_way_stretch`, and `training_one_way_stretch`
the training set's: the most consecutive actions an output writes without turning the other way (at L = 40: 40 in
training; 48 in the test outputs that turn one way, 24 in those that turn both ways, which change direction where
their clauses meet). `one_way_by_action` splits the two-clause outputs that turn one way by their clauses' other
actions: **same action** (`walk around right thrice and walk around right thrice`) or **other action** (`jump ...
and walk ...`): whether a miss follows the turn's direction or the action written.

    python examples/scan/composition.py runs/scan/panm_one_design_ek_L24_s0 --data_dir ../shared/data/scan \
        --output composition.json
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from panm_hf.pipelines.scan_data import TASKS_FILE, ScanSplit, diagnosis_parser, load_cutoff_split, score

CLASSES = ("composed", "alone only", "unseen")
LONGEST_CLAUSE = 24  # actions of SCAN's longest clause, `<action> around <direction> thrice`
PARTNERS = ("repeat", "differ")  # `after_longest`'s groups
TURNS = ("one way", "both ways", "none")  # `turns`' groups
ACTION_GROUPS = ("same action", "other action")  # `one_way_by_action`'s groups
CONJUNCTION = re.compile(r" (?:and|after) ")


def clauses(command: str) -> list[str]:
    """The one or two clauses of a SCAN command."""
    return CONJUNCTION.split(command)


def output_order(command: str) -> list[str]:
    """The clauses in the order the output writes them (`x after y` writes y's actions first)."""
    parts = clauses(command)
    return parts[::-1] if " after " in command else parts


def pair_key(command: str, actions: dict[str, int]) -> str:
    """`16+24`: the action counts of the clauses in output order (`actions`: a clause's count, as a command)."""
    parts = output_order(command)
    missing = [part for part in parts if part not in actions]
    if missing:
        raise ValueError(
            f"clause {missing[0]!r} of {command!r} is not a command of the tasks file; pass SCAN's "
            f"full {TASKS_FILE} in --data_dir."
        )
    return "+".join(str(actions[part]) for part in parts)


def partner(command: str, actions: dict[str, str]) -> str | None:
    """For a command whose first written clause has LONGEST_CLAUSE actions, "repeat" when the second writes only
    actions the first writes, else "differ"; None for any other command (`actions`: a clause's actions)."""
    parts = output_order(command)
    if len(parts) != 2 or len(actions[parts[0]].split()) != LONGEST_CLAUSE:
        return None
    return "repeat" if set(actions[parts[1]].split()) <= set(actions[parts[0]].split()) else "differ"


def turn_kind(actions: str) -> str:
    """One of TURNS: the directions an output's turn actions (`I_TURN_LEFT`, `I_TURN_RIGHT`) take."""
    directions = {action for action in actions.split() if action.startswith("I_TURN_")}
    return {0: "none", 1: "one way"}.get(len(directions), "both ways")


def one_way_action(command: str, actions: dict[str, str]) -> str | None:
    """For a two-clause command whose output turns one way, "same action" when both clauses write the same actions
    besides their turns, else "other action"; None for any other command (`actions`: a clause's actions)."""
    parts = clauses(command)
    if len(parts) != 2 or turn_kind(" ".join(actions[part] for part in parts)) != "one way":
        return None
    others = [{a for a in actions[part].split() if not a.startswith("I_TURN_")} for part in parts]
    return "same action" if others[0] == others[1] else "other action"


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


def diagnosis(chosen: list[int], predictions: list[str], targets: list[str]) -> dict:
    """`score`'s EOS diagnosis (% right, early, late, wrong content) of the chosen outputs alone."""
    split = ScanSplit([""] * len(chosen), [targets[i] for i in chosen])
    return score([predictions[i] for i in chosen], split)["eos_diagnosis"]


def cell(chosen: list[int], predictions: list[str] | None, targets: list[str]) -> dict:
    """The chosen outputs' count and, with predictions, `score`'s EOS diagnosis (% of them)."""
    row = {"count": len(chosen)}
    if predictions is not None and chosen:  # the run's own EOS diagnosis, on these outputs alone
        row.update(diagnosis(chosen, predictions, targets))
    return row


def breakdown(classes: list[str], predictions: list[str] | None, targets: list[str]) -> dict:
    """Per class: `cell` and the class's share of the test set (%)."""
    rows = {}
    for name in CLASSES:
        chosen = [i for i, c in enumerate(classes) if c == name]
        rows[name] = {**cell(chosen, predictions, targets), "share": 100.0 * len(chosen) / max(len(classes), 1)}
    return rows


def pairs(keys: list[str], predictions: list[str] | None, targets: list[str]) -> dict:
    """Per clause-length pair (`pair_key`), count and, with predictions, `score`'s EOS diagnosis (% of the pair)."""
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    order = sorted(groups, key=lambda k: [int(n) for n in k.split("+")])
    return {key: cell(groups[key], predictions, targets) for key in order}


def after_longest(groups: list[str | None], predictions: list[str] | None, targets: list[str]) -> dict:
    """Per `partner` group, its `cell`."""
    return {name: cell([i for i, g in enumerate(groups) if g == name], predictions, targets) for name in PARTNERS}


def one_way_by_action(groups: list[str | None], predictions: list[str] | None, targets: list[str]) -> dict:
    """Per `one_way_action` group, its `cell`."""
    return {name: cell([i for i, g in enumerate(groups) if g == name], predictions, targets) for name in ACTION_GROUPS}


def turns(predictions: list[str] | None, targets: list[str]) -> dict:
    """Per `turn_kind` of the targets, its `cell` and the longest `one_way_stretch` of its targets."""
    groups = {name: [i for i, actions in enumerate(targets) if turn_kind(actions) == name] for name in TURNS}
    return {name: {**cell(chosen, predictions, targets),
                   "one_way_stretch": max((one_way_stretch(targets[i]) for i in chosen), default=0)}
            for name, chosen in groups.items()}  # fmt: skip


def one_way_stretch(actions: str) -> int:
    """The most consecutive actions of an output without a turn the other way (such a turn starts a new stretch)."""
    longest = current = 0
    direction = None
    for action in actions.split():
        if action.startswith("I_TURN_") and action != direction:
            if direction is not None:
                current = 0  # a turn the other way starts a new stretch
            direction = action
        current += 1
        longest = max(longest, current)
    return longest


def analyse(run_dir: Path, data_dir: Path, use_model: bool) -> dict:
    path = run_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass run folders written by run_scan.py.")
    summary = json.loads(path.read_text())
    train, heldout, test = load_cutoff_split(data_dir, summary["cutoff"])
    classes = classify(test.commands, train.commands)  # what the run trained on, not its i.i.d. set
    predictions = None
    if use_model:
        from eos_oracle import decode, load_run  # torch and transformers only when a model is decoded

        _, model, tokenizer = load_run(run_dir)
        predictions = decode(model, tokenizer, test.commands, None)
    # the three sets hold every command of the tasks file, and every clause of SCAN is a command of its own
    splits = (train, heldout, test)
    texts = {c: a for split in splits for c, a in zip(split.commands, split.actions)}
    counts = {c: len(a.split()) for c, a in texts.items()}
    keys = [pair_key(command, counts) for command in test.commands]
    groups = [partner(command, texts) for command in test.commands]  # pair_key checked every clause is there
    return {"run": run_dir.name, "cutoff": summary["cutoff"], "num_test": len(test.commands),
            "classes": breakdown(classes, predictions, test.actions),
            "pairs": pairs(keys, predictions, test.actions),
            "after_longest": after_longest(groups, predictions, test.actions),
            "turns": turns(predictions, test.actions),
            "one_way_by_action": one_way_by_action([one_way_action(c, texts) for c in test.commands], predictions,
                                                   test.actions),
            "training_one_way_stretch": max(map(one_way_stretch, train.actions), default=0)}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = diagnosis_parser(__doc__)
    parser.add_argument("--no_model", action="store_true", help="only the classes' shares; decode nothing")
    args = parser.parse_args(argv)
    rows = [analyse(run_dir, args.data_dir, not args.no_model) for run_dir in args.runs]
    for row in rows:
        parts = []
        for name, values in row["classes"].items():
            scored = f", right {values['correct']:.1f}, early {values['early']:.1f}" if "correct" in values else ""
            parts.append(f"{name} {values['share']:.1f}% ({values['count']}{scored})")
        print(f"{row['run']} (L = {row['cutoff']}): " + "; ".join(parts))
        # the pairings (`first+second`) and the partner after the 24-action clause, as `key (count) right/early`
        groups = {"pairs": row["pairs"], f"after a {LONGEST_CLAUSE}-action clause": row["after_longest"],
                  "turns": row["turns"], "one way, by action": row["one_way_by_action"]}  # fmt: skip
        for label, cells in groups.items():
            scored = [f"{k} ({c['count']}) {c['correct']:.1f}/{c['early']:.1f}" for k, c in cells.items()
                      if "correct" in c]  # fmt: skip
            if scored:
                print(f"  {label}: " + "; ".join(scored))
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
