#!/usr/bin/env python
"""Separate the EOS decision from the content: re-decode a trained SCAN run with the target length given.

For each run folder written by `run_scan.py` (its `results.json` and saved model), on the run's test set:
- **free**: greedy decoding as in the run, split by what went wrong: stopped early with every action
  right so far (`early_prefix`), ran past the end with the whole target produced first (`late_prefix`),
  or an action was wrong before either (`content`);
- **oracle length**: greedy decoding forced to emit exactly the target's number of actions (EOS
  suppressed before it, decoding stopped after it), Newman et al. 2020's oracle: exact match here is
  what the model would score if its only error were the EOS decision.

    python examples/scan/eos_oracle.py runs/scan/panm_L26_s0 runs/scan/transformer_L26_s0 \
        --data_dir ../shared/data/scan --output eos_oracle.json
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from run_scan import greedy_actions
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import panm_hf  # noqa: F401  (registers PANM with the Auto classes)
from panm_hf.decoder_positions import apply as apply_decoder_positions
from panm_hf.pipelines.controls import apply_control
from panm_hf.pipelines.scan_data import ScanSplit, diagnosis_parser, load_cutoff_split


def load_run(run_dir: Path):
    """(summary, model, tokenizer) of a run folder; ValueError naming what is missing."""
    path = run_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass run folders written by run_scan.py.")
    summary = json.loads(path.read_text())
    (name,) = summary["results"]
    model_dir = run_dir / name
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} holds no saved model; run_scan.py saves it at the end of training.")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    apply_control(model, summary["model_args"].get("control"))  # a control's hook is not in the weights
    positions, window = summary["model_args"].get("decoder_positions"), summary["model_args"].get("decoder_window", 0)
    if positions == "alibi" or window:  # nor is the attention function
        apply_decoder_positions(model, "alibi" if positions == "alibi" else "absolute", window=window)
    return summary, model, AutoTokenizer.from_pretrained(model_dir)


@torch.no_grad()
def decode(model, tokenizer, commands: list[str], length: int | None, batch_size: int = 256) -> list[str]:
    """Greedy actions as in the run; with `length`, exactly that many (EOS and every other special token
    suppressed before, decoding stopped after)."""
    split = ScanSplit(commands, [""] * len(commands))
    if length is None:
        return greedy_actions(model, split, tokenizer, batch_size, 64)
    specials = [i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id]
    # forced_eos_token_id=None: Marian's config forces token 0 at the length limit
    limits = {"min_new_tokens": length, "suppress_tokens": specials, "forced_eos_token_id": None}
    return greedy_actions(model, split, tokenizer, batch_size, length, **limits)


def ran_late(prediction: list[str], target: list[str]) -> bool:
    """The prediction wrote the whole target and went on."""
    return len(prediction) > len(target) and prediction[: len(target)] == target


def free_outcomes(predictions: list[str], targets: list[str]) -> dict:
    """% of outputs right, stopped early on a right prefix, ran late after the whole target, or wrong content."""
    outcome = Counter()
    for prediction, target in zip(predictions, targets):
        p, t = prediction.split(), target.split()
        if p == t:
            outcome["correct"] += 1
        elif len(p) < len(t) and t[: len(p)] == p:
            outcome["early_prefix"] += 1
        elif ran_late(p, t):
            outcome["late_prefix"] += 1
        else:
            outcome["content"] += 1
    return {key: 100.0 * outcome[key] / len(targets) for key in ("correct", "early_prefix", "late_prefix", "content")}


def overruns(predictions: list[str], targets: list[str]) -> dict:
    """The outputs that ran late after the whole target, by how many extra actions (% of all outputs), and
    the share of all outputs whose extra actions repeat the target's own last actions (one repetition too
    many: a count that ran past its end, not a wrong action)."""
    extra, repeats = Counter(), 0
    for prediction, target in zip(predictions, targets):
        p, t = prediction.split(), target.split()
        if ran_late(p, t):
            tail = p[len(t) :]
            extra[len(tail)] += 1
            repeats += len(tail) <= len(t) and tail == t[len(t) - len(tail) :]
    share = 100.0 / len(targets)
    return {"extra_actions": {str(k): share * n for k, n in sorted(extra.items())}, "repeats_the_end": share * repeats}


@torch.no_grad()
def end_probabilities(model, tokenizer, commands: list[str], actions: list[str], batch_size: int = 256) -> torch.Tensor:
    """P(EOS) right after the whole target, teacher-forced: how close each stop decision is (one per command)."""
    model.eval()
    probabilities = []
    for start in range(0, len(commands), batch_size):
        batch = tokenizer(commands[start : start + batch_size], padding=True, return_tensors="pt").to(model.device)
        labels = tokenizer(actions[start : start + batch_size], padding=True, return_tensors="pt")["input_ids"]
        logits = model(**batch, labels=labels.to(model.device)).logits  # (batch, steps, vocab)
        ends = torch.tensor([len(a.split()) for a in actions[start : start + batch_size]], device=logits.device)
        end_logits = logits[torch.arange(len(ends), device=logits.device), ends]  # (batch, vocab): after the target
        probabilities.append(end_logits.softmax(-1)[:, tokenizer.eos_token_id].cpu())
    return torch.cat(probabilities) if probabilities else torch.zeros(0)


def stop_margins(model, tokenizer, test: ScanSplit, predictions: list[str]) -> dict:
    """Teacher-forced P(EOS) after the whole target, median and 10th / 90th percentiles, over the outputs
    that ran late after it and over the right ones: a late stop that was a near miss or never close."""
    result = {}
    for name, keep in (("late_prefix", ran_late), ("correct", list.__eq__)):
        chosen = [i for i, (p, t) in enumerate(zip(predictions, test.actions)) if keep(p.split(), t.split())]
        if not chosen:
            continue
        values = end_probabilities(model, tokenizer, [test.commands[i] for i in chosen],
                                   [test.actions[i] for i in chosen]).double()  # fmt: skip
        quantiles = torch.quantile(values, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
        result[name] = {"count": len(chosen), "p10": quantiles[0], "median": quantiles[1], "p90": quantiles[2]}
    return result


def oracle_exact_match(model, tokenizer, test: ScanSplit) -> float:
    """Exact match (%) with every command decoded to its target's length, one generate() per length."""
    by_length: dict[int, list[int]] = {}
    for index, actions in enumerate(test.actions):
        by_length.setdefault(len(actions.split()), []).append(index)
    correct = 0
    for length, indices in by_length.items():
        predictions = decode(model, tokenizer, [test.commands[i] for i in indices], length)
        correct += sum(p == test.actions[i] for p, i in zip(predictions, indices))
    return 100.0 * correct / len(test.actions)


def analyse(run_dir: Path, data_dir: Path) -> dict:
    summary, model, tokenizer = load_run(run_dir)
    _, _, test = load_cutoff_split(data_dir, summary["cutoff"])
    free = decode(model, tokenizer, test.commands, None)
    return {
        "run": run_dir.name,
        "cutoff": summary["cutoff"],
        "num_test": len(test.commands),
        "free": free_outcomes(free, test.actions),
        "late_overrun": overruns(free, test.actions),
        "eos_probability_at_the_end": stop_margins(model, tokenizer, test, free),
        "oracle_length_exact_match": oracle_exact_match(model, tokenizer, test),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = diagnosis_parser(__doc__)
    args = parser.parse_args(argv)
    rows = [analyse(run_dir, args.data_dir) for run_dir in args.runs]
    for row in rows:
        free = ", ".join(f"{key} {value:.1f}" for key, value in row["free"].items())
        late = row["late_overrun"]
        print(f"{row['run']}: free decoding {free}; oracle length {row['oracle_length_exact_match']:.1f}; "
              f"late by {late['extra_actions']}, repeating the end {late['repeats_the_end']:.1f}")
    if args.output is not None:
        args.output.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
