#!/usr/bin/env python
"""Does the decoder's content read mark where one clause of a SCAN output ends and the next begins?

A count per clause (docs/results/scan_count.md, point 34) needs a signal at the clause boundary that the
Controller could restart its count on. The content read (`content_read="decoder"`) is the one read that follows
the output: `z_t` queries it. Teacher-forced on a run's two-clause test outputs, with `b` the first written
clause's action count (output step `b` writes the second clause's first action), per `turns` group:

- **move**: the mean total-variation distance between the read's weights at consecutive steps, at the
  boundary (`t = b`) and elsewhere; **move over two steps**: the same between steps `t - 2` and `t` (SCAN's
  `around` outputs alternate a turn and an action), at the boundary (the larger of `t = b`, `b + 1`) and
  elsewhere;
- **largest at boundary**: % of outputs whose largest move over two steps falls at `t = b` or `b + 1`;
- **reads**: % of steps whose weight peaks on a word of the clause being written, of the other clause, or
  elsewhere (the conjunction, `</s>`).

A gate from the read's move can restart a count per clause only if the move is large at the boundary and small
elsewhere; "reads the other clause" says whether the read follows the clause being written at all.

    python examples/scan/content_read_moves.py runs/scan_lr2e-3/panm_one_design_ek_L40_s4 \
        --data_dir ../shared/data/scan --output content_read_moves.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from composition import TURNS, clauses, output_order, pair_key, turn_kind
from eos_oracle import load_run

from panm_hf.pipelines.scan_data import diagnosis_parser, load_cutoff_split

READS = ("written clause", "other clause", "elsewhere")


def clause_spans(command: str) -> tuple[range, range]:
    """The word positions (= memory slots: one token per word) of the first and second written clause."""
    parts = clauses(command)
    if len(parts) != 2:
        raise ValueError(f"{command!r} has {len(parts)} clause(s); content_read_moves.py reads two-clause commands.")
    first = range(0, len(parts[0].split()))
    second = range(len(parts[0].split()) + 1, len(command.split()))  # after the conjunction
    return (first, second) if output_order(command)[0] == parts[0] else (second, first)


def total_variation(weights: torch.Tensor, lag: int) -> torch.Tensor:
    """`(steps, slots)` -> `(steps - lag,)`: half the L1 distance between the weights at `t` and `t - lag`."""
    return 0.5 * (weights[lag:] - weights[:-lag]).abs().sum(dim=-1)


def one_output(weights: torch.Tensor, boundary: int, spans: tuple[range, range]) -> dict:
    """One output's `(actions, slots)` weights (steps before its EOS): its moves and where its reads peak."""
    steps = weights.shape[0]
    move, move2 = total_variation(weights, 1), total_variation(weights, 2)  # index i: step i + lag
    at_boundary = torch.zeros(steps, dtype=torch.bool)
    at_boundary[boundary] = True
    at_boundary2 = at_boundary.clone()
    at_boundary2[boundary + 1 : boundary + 2] = True  # b + 1 too, where it is a step of the output
    peaks = weights.argmax(dim=-1).tolist()
    written = [spans[0] if t < boundary else spans[1] for t in range(steps)]
    other = [spans[1] if t < boundary else spans[0] for t in range(steps)]
    reads = [sum(p in span for p, span in zip(peaks, group)) for group in (written, other)]
    largest = int(move2.argmax()) + 2
    return {
        "move": (float(move[boundary - 1]), move[~at_boundary[1:]].tolist()),
        "move2": (float(move2[at_boundary2[2:]].max()), move2[~at_boundary2[2:]].tolist()),
        "largest_at_boundary": largest in (boundary, boundary + 1),
        "reads": [*reads, steps - sum(reads)],
    }


def summarise(rows: list[dict]) -> dict:
    """The `turns` group's means (moves), % (largest at boundary, reads) over its outputs."""

    def mean(values):
        return sum(values) / max(len(values), 1)

    cells = {"count": len(rows)}
    for name in ("move", "move2"):
        cells[name] = {"boundary": mean([row[name][0] for row in rows]),
                       "elsewhere": mean([v for row in rows for v in row[name][1]])}  # fmt: skip
    cells["largest_at_boundary"] = 100.0 * mean([row["largest_at_boundary"] for row in rows])
    totals = [sum(row["reads"][i] for row in rows) for i in range(len(READS))]
    cells["reads"] = {name: 100.0 * total / max(sum(totals), 1) for name, total in zip(READS, totals)}
    return cells


@torch.no_grad()
def analyse(run_dir: Path, data_dir: Path, batch_size: int = 128) -> dict:
    summary, model, tokenizer = load_run(run_dir)
    train, heldout, test = load_cutoff_split(data_dir, summary["cutoff"])
    # every clause of SCAN is a command of its own: its action count, as composition.py's `pairs` reads it
    counts = {c: len(a.split()) for split in (train, heldout, test) for c, a in zip(split.commands, split.actions)}
    chosen = [i for i, command in enumerate(test.commands) if len(clauses(command)) == 2]
    groups: dict[str, list[dict]] = {name: [] for name in TURNS}
    for start in range(0, len(chosen), batch_size):
        batch = chosen[start : start + batch_size]
        commands, actions = [test.commands[i] for i in batch], [test.actions[i] for i in batch]
        source = tokenizer(commands, padding=True, return_tensors="pt").to(model.device)
        labels = tokenizer(actions, padding=True, return_tensors="pt")["input_ids"].to(model.device)
        out = model(**source, labels=labels, output_attentions=True)
        if out.content_attentions is None:
            raise ValueError(f"{run_dir}'s model has no content read (content_read='decoder' or 'controller').")
        for row, (command, target) in enumerate(zip(commands, actions)):
            steps = len(target.split())
            if steps < 3:  # no move over two steps to compare (every longer output of SCAN has more)
                continue
            boundary = int(pair_key(command, counts).split("+")[0])  # the first written clause's actions
            weights = out.content_attentions[row, :steps].float().cpu()  # (actions, slots)
            groups[turn_kind(target)].append(one_output(weights, boundary, clause_spans(command)))
    return {"run": run_dir.name, "cutoff": summary["cutoff"],
            "turns": {name: summarise(rows) for name, rows in groups.items() if rows}}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = diagnosis_parser(__doc__)
    args = parser.parse_args(argv)
    rows = []
    for run_dir in args.runs:
        rows.append(row := analyse(run_dir, args.data_dir))
        for name, cells in row["turns"].items():
            reads = ", ".join(f"{k} {v:.1f}%" for k, v in cells["reads"].items())
            print(
                f"{row['run']} {name} ({cells['count']}): move {cells['move']['boundary']:.2f} at the boundary, "
                f"{cells['move']['elsewhere']:.2f} elsewhere; over two steps {cells['move2']['boundary']:.2f} / "
                f"{cells['move2']['elsewhere']:.2f}; largest at the boundary {cells['largest_at_boundary']:.1f}%; "
                f"reads {reads}"
            )
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
