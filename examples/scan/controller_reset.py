#!/usr/bin/env python
"""Where a trained PANM model keeps its count of the output: reset the Controller GRU's state at one output step.

Teacher-forced on a run's test set, the Controller's state `h^c_t` is set back to `h^c_0` (the state it starts
from) at output step `k`, and the recurrence runs on from there over the same reads and `z_t` (the reads do not
depend on the Controller's state, principle II). For the run as trained and for each `--reset_steps` `k`, per
`composition.py`'s `turns` group (one way, both ways, none):

- **content**: % of outputs whose every action is the argmax (the right prefix at every step);
- **stop**: % whose argmax right after the whole target is EOS.

If the stop drops to 0 after a reset while the content holds, the stop reads a count the Controller's state
carries from the start of the output (docs/results/scan_count.md, point 29).

    python examples/scan/controller_reset.py runs/scan_sample40/panm_one_design_ek_L40_s4 --reset_steps 8 24 \
        --data_dir ../shared/data/scan --output controller_reset.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from composition import TURNS, turn_kind
from eos_oracle import load_run

from panm_hf.controller import Controller
from panm_hf.pipelines.scan_data import ScanSplit, diagnosis_parser, load_cutoff_split


def reset_forward(controller: Controller, step: int):
    """`controller.forward` with its state set back to the call's `h^c_0` at `step`: outputs `(batch, steps, out)`
    at steps `< step` as without the reset, from `step` on as a fresh call on the later steps' inputs.

    Raises:
        ValueError: the Controller is an LSTM or reads with its own state (`content_read="controller"`).
    """
    if controller.gru is None or controller.content_reader is not None:
        raise ValueError("controller_reset.py needs a GRU Controller without content_read='controller'.")

    def forward(reads, decoder_states, hidden, step_mask=None):
        if step_mask is not None:
            raise ValueError("controller_reset.py resets a teacher-forced forward (no step_mask, no cache).")
        batch, steps, rows, inputs, decoder_rows = controller._input_rows(reads, decoder_states, hidden)
        inputs = inputs.reshape(batch, steps, -1)  # (batch, steps, GRU input)
        start = hidden.unsqueeze(0).contiguous()  # (1, batch, hidden): h^c_0
        segments = [inputs[:, :step], inputs[:, step:]] if step < steps else [inputs]  # each from h^c_0
        states = torch.cat([controller.gru(part, start)[0] for part in segments], dim=1)  # (batch, steps, hidden)
        state_rows = states.reshape(batch * steps, -1)  # (batch*steps, hidden)
        outputs, undecoded = controller.output([rows, state_rows], decoder_rows, batch, steps)
        return outputs, states[:, -1], undecoded  # a one-layer GRU's last state is its last output

    return forward


@torch.no_grad()
def outcomes(model, tokenizer, split: ScanSplit, batch_size: int = 256) -> dict:
    """Per `turns` group: count, % of outputs with every action right and % with EOS right after the target
    (teacher-forced argmax)."""
    totals = {name: [0, 0, 0] for name in TURNS}
    for start in range(0, len(split.commands), batch_size):
        commands, actions = split.commands[start : start + batch_size], split.actions[start : start + batch_size]
        source = tokenizer(commands, padding=True, return_tensors="pt").to(model.device)
        labels = tokenizer(actions, padding=True, return_tensors="pt")["input_ids"].to(model.device)
        predicted = model(**source, labels=labels).logits.argmax(-1)  # (batch, actions + 1)
        lengths = torch.tensor([len(target.split()) for target in actions], device=predicted.device)  # (batch,)
        before_end = torch.arange(predicted.shape[1], device=predicted.device) < lengths[:, None]  # (batch, steps)
        right = ((predicted == labels) | ~before_end).all(dim=1)  # (batch,): every action before the end
        stops = predicted.gather(1, lengths[:, None]).squeeze(1) == tokenizer.eos_token_id  # (batch,)
        for target, row_right, row_stop in zip(actions, right.tolist(), stops.tolist()):  # tally by turns group
            group = totals[turn_kind(target)]
            group[0], group[1], group[2] = group[0] + 1, group[1] + row_right, group[2] + row_stop
    return {name: {"count": n, "content": 100.0 * right / n, "stop": 100.0 * stop / n}
            for name, (n, right, stop) in totals.items() if n}  # fmt: skip


def analyse(run_dir: Path, data_dir: Path, reset_steps: list[int]) -> dict:
    summary, model, tokenizer = load_run(run_dir)
    if getattr(model.config, "input_feeding", False):
        raise ValueError(f"{run_dir} uses input feeding (the decoder runs a step at a time); reset needs one call.")
    _, _, test = load_cutoff_split(data_dir, summary["cutoff"])
    controller = model.panm.controller
    rows = {"none": outcomes(model, tokenizer, test)}
    for step in reset_steps:
        controller.forward = reset_forward(controller, step)  # an instance attribute: this model only
        try:
            rows[str(step)] = outcomes(model, tokenizer, test)
        finally:
            del controller.forward
    return {"run": run_dir.name, "cutoff": summary["cutoff"], "num_test": len(test.commands), "reset_at": rows}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = diagnosis_parser(__doc__)
    parser.add_argument("--reset_steps", nargs="+", type=int, default=[8, 16, 24, 32])
    args = parser.parse_args(argv)
    if any(step < 1 for step in args.reset_steps):
        raise ValueError(f"--reset_steps must be output steps >= 1 (got {args.reset_steps}).")
    rows = []
    for run_dir in args.runs:  # each run's rows printed as it ends (a run takes minutes at L = 26)
        rows.append(row := analyse(run_dir, args.data_dir, args.reset_steps))
        for step, groups in row["reset_at"].items():
            cells = "; ".join(f"{k} ({v['count']}) content {v['content']:.1f} stop {v['stop']:.1f}"
                              for k, v in groups.items())  # fmt: skip
            print(f"{row['run']} reset at {step}: {cells}")
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
