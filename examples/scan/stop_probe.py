#!/usr/bin/env python
"""Which state could make the stop decision past the training length? Linear probes on a trained SCAN run.

For each run folder written by `run_scan.py`, the saved model is run teacher-forced over a sample of its
training range and of its test set (every longer command), and a logistic regression "the next token is
EOS" is fitted per step on the training sample from one kind of state at a time:
- `z`: the backbone decoder's output `z_t` (what the Controller reads; for a Transformer, its last layer);
- `h`: what the LM head reads (PANM's output with `placement="replace"`);
- `pointers`: where each Mode-1 pointer stands in the command: its expected slot, the distance to the
  command's last slot, their ratio, and the command's length (content-free: what the Pointer Units know);
- `mode1`: the Mode-1 values (memory content at the pointers);
- `pointers+mode1`;
- `cross`: where the decoder's cross-attention reads in the command (per layer and head: its mass on the
  command's last slot and the distance from its expected slot to that slot), and `mode2`: the same for
  PANM's Mode-2 attention (content-based, outside principle II): can the stop come from where the model reads?
Scored on the test sample as a stop rule: the share of commands whose first step with a positive score is
exactly the target's end, and how many stop early or run late. The model's own EOS (its EOS logit above
every other token's) is scored the same way. PANM's pointers see no content, so their path is a function
of the step and the command's length only.

    python examples/scan/stop_probe.py runs/scan/panm_L30_s0 runs/scan/transformer_L30_s0 \
        --data_dir ../shared/data/scan --output stop_probe.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from eos_oracle import load_run

from panm_hf.decoder_positions import ALIBI_ATTENTION
from panm_hf.pipelines.scan_data import ScanSplit, diagnosis_parser, load_cutoff_split

FEATURE_SETS = {
    "z": ("z",), "h": ("h",), "pointers": ("pointers",), "mode1": ("mode1",), "pointers+mode1": ("pointers", "mode1"),
    "cross": ("cross",), "mode2": ("mode2",), "cross+mode2": ("cross", "mode2"),
}  # fmt: skip


def read_position(weights: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:
    """Where an attention over the command reads, per head: its mass on the command's last real slot and the
    distance from its expected slot to that slot. `weights` `(batch, heads, tgt_len, slots)` -> `(batch, tgt_len,
    2 * heads)`."""
    last = source_mask.sum(1) - 1  # (batch,)
    on_last = weights.gather(-1, last[:, None, None, None].expand(*weights.shape[:-1], 1)).squeeze(-1)
    slots = torch.arange(weights.shape[-1], dtype=weights.dtype)  # (slots,)
    distance = last.to(weights.dtype)[:, None, None] - (weights * slots).sum(-1)  # (batch, heads, tgt_len)
    return torch.cat([on_last, distance], dim=1).transpose(1, 2)  # (batch, tgt_len, 2 * heads)


@torch.no_grad()
def step_features(model, tokenizer, split: ScanSplit, batch_size: int = 256) -> dict[str, torch.Tensor]:
    """Teacher-forced per-step states of every real target step, stacked over the split's commands.

    Returns `{"z", "h", "logit_margin", "is_end", "sequence"}` (and `"pointers"`, `"mode1"` for a PANM
    model), each with one row per (command, target step): `(steps, ...)`.
    """
    model.eval()
    if model.config._attn_implementation != ALIBI_ATTENTION:  # keep a window's or ALiBi's attention function
        model.set_attn_implementation("eager")  # SDPA returns no attention weights (nor does ALiBi's: no `cross`)
    rows: dict[str, list] = {}
    for start in range(0, len(split.commands), batch_size):
        source = tokenizer(split.commands[start : start + batch_size], padding=True, return_tensors="pt")
        target = tokenizer(split.actions[start : start + batch_size], padding=True, return_tensors="pt")
        real = target["attention_mask"].bool()  # (batch, tgt_len)
        labels = target["input_ids"].masked_fill(~real, -100)
        output = model(**source, labels=labels, output_attentions=True, output_hidden_states=True)
        logits = output.logits  # (batch, tgt_len, vocab)
        eos = tokenizer.eos_token_id
        others = logits.clone()
        others[..., eos] = float("-inf")
        features = {
            "z": output.decoder_hidden_states[-2],  # (batch, tgt_len, d)
            "h": output.decoder_hidden_states[-1],  # (batch, tgt_len, d)
            "logit_margin": logits[..., eos] - others.amax(-1),  # (batch, tgt_len)
            "is_end": labels == eos,  # (batch, tgt_len)
            "sequence": torch.arange(start, start + real.shape[0]).unsqueeze(1).expand_as(real),  # (batch, tgt_len)
        }
        if output.cross_attentions:  # one (batch, heads, tgt_len, slots) per decoder layer
            layers = [read_position(layer, source["attention_mask"]) for layer in output.cross_attentions]
            features["cross"] = torch.cat(layers, dim=-1)  # (batch, tgt_len, layers * 2 * heads)
        mode2 = getattr(output, "mode2_attentions", None)  # (batch, tgt_len, H^c, slots) for PANM
        if mode2 is not None:
            features["mode2"] = read_position(mode2.transpose(1, 2), source["attention_mask"])
        weights = getattr(output, "address_attentions", None)  # (batch, tgt_len, units, slots) for PANM
        if weights is not None:
            slots = torch.arange(weights.shape[-1], dtype=weights.dtype)  # (slots,)
            expected = (weights * slots).sum(-1)  # (batch, tgt_len, units)
            last = (source["attention_mask"].sum(1) - 1).to(weights.dtype)[:, None, None]  # (batch, 1, 1)
            last = last.expand_as(expected[..., :1])  # (batch, tgt_len, 1)
            features["pointers"] = torch.cat([expected, last - expected, expected / last, last], dim=-1)
            values = torch.einsum("btus,bsd->btud", weights, output.encoder_last_hidden_state)
            features["mode1"] = values.flatten(2)  # (batch, tgt_len, units * d)
        for name, value in features.items():
            rows.setdefault(name, []).append(value[real])  # (real steps, ...)
    return {name: torch.cat(values) for name, values in rows.items()}


def fit_probe(inputs: torch.Tensor, is_end: torch.Tensor, weight_decay: float = 1e-3, iterations: int = 300):
    """A class-balanced, standardised logistic regression; returns the scoring function (positive: stop)."""
    mean, std = inputs.mean(0), inputs.std(0) + 1e-6
    scaled = (inputs - mean) / std
    weight = torch.zeros(inputs.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    targets = is_end.to(inputs.dtype)
    balance = (targets == 0).sum() / targets.sum().clamp(min=1)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=iterations, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        scores = scaled @ weight + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, targets, pos_weight=balance)
        loss = loss + weight_decay * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    weight, bias = weight.detach(), bias.detach()
    return lambda new_inputs: ((new_inputs - mean) / std) @ weight + bias


def stop_outcomes(scores: torch.Tensor, sequence: torch.Tensor, is_end: torch.Tensor) -> dict:
    """The stop rule "first step with a positive score": % of commands stopped exactly at the end, early, late.

    `scores`, `sequence` (command index of each step, steps in order) and `is_end` are `(steps,)`.
    """
    _, command = torch.unique(sequence, return_inverse=True)  # (steps,) 0..commands-1
    count = int(command.max()) + 1
    step = torch.arange(len(scores))
    never = torch.full((count,), len(scores) + 1)
    first = never.scatter_reduce(0, command[scores > 0], step[scores > 0], "amin")  # (commands,)
    end = never.scatter_reduce(0, command[is_end], step[is_end], "amin")  # (commands,)

    def share(hits: torch.Tensor) -> float:
        return round(100.0 * hits.float().mean().item(), 1)

    return {"exact": share(first == end), "early": share(first < end), "late": share(first > end)}


def analyse(run_dir: Path, data_dir: Path, train_samples: int, test_samples: int) -> dict:
    summary, model, tokenizer = load_run(run_dir)
    train, _, test = load_cutoff_split(data_dir, summary["cutoff"])
    fit = step_features(model, tokenizer, train.subset(train_samples, 0))
    held = step_features(model, tokenizer, test.subset(test_samples, 0))
    result = {
        "run": run_dir.name,
        "cutoff": summary["cutoff"],
        "own_eos": stop_outcomes(held["logit_margin"], held["sequence"], held["is_end"]),
    }
    for name, parts in FEATURE_SETS.items():
        if all(part in fit for part in parts):
            score = fit_probe(torch.cat([fit[p] for p in parts], -1), fit["is_end"])
            result[name] = {
                "train": stop_outcomes(score(torch.cat([fit[p] for p in parts], -1)), fit["sequence"], fit["is_end"]),
                "test": stop_outcomes(score(torch.cat([held[p] for p in parts], -1)), held["sequence"], held["is_end"]),
            }
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = diagnosis_parser(__doc__)
    parser.add_argument("--train_samples", type=int, default=3000, help="training-range commands to fit on")
    parser.add_argument("--test_samples", type=int, default=1500, help="longer commands to score on")
    args = parser.parse_args(argv)
    results = [analyse(run, args.data_dir, args.train_samples, args.test_samples) for run in args.runs]
    for result in results:
        probes = ", ".join(f"{name} {result[name]['test']['exact']}" for name in FEATURE_SETS if name in result)
        print(f"{result['run']}: own EOS {result['own_eos']['exact']}; probes on longer commands: {probes}")
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
