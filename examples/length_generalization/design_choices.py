"""Measure PANM's two design choices on Copy at an equal budget (docs/RESULTS.md, "Design choices measured").

* scoring: `dot` vs `cosine` (inverse temperature 15, learnable) vs plain cosine (inverse temperature 1);
  reports token accuracy per test length and the max address-attention weight at L+1 and 2(L+1).
* controller init: `mean` vs `sum`; reports accuracy and the magnitude of `h^c_0` at L and 8(L+1).

Usage:
    python examples/length_generalization/design_choices.py --variant dot --steps 1500 --output-dir /tmp/design
    (variants: dot, cosine15, cosine1, sum)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from research import task_spec
from research.harness import TrainConfig, fixed_eval_batches, train_and_evaluate

VARIANTS = {
    "dot": {"scoring": "dot", "controller_init": "mean"},
    "cosine15": {"scoring": "cosine", "cosine_inverse_temperature": 15.0, "controller_init": "mean"},
    "cosine1": {"scoring": "cosine", "cosine_inverse_temperature": 1.0, "controller_init": "mean"},
    "sum": {"scoring": "dot", "controller_init": "sum"},
}


@torch.no_grad()
def probe(model, task: str, length: int) -> dict:
    """Max address-attention weight (mean over batch, steps, units) and `h^c_0` magnitude at one length."""
    batch = fixed_eval_batches(task, length, 256, 256, 30_000, "cpu")[0]
    states, _ = model.encoder(batch.inputs, batch.attention_mask)
    memory = model.memory.bind(states, batch.attention_mask)
    out = model.memory(memory, num_steps=batch.labels.shape[1], output_attentions=True)
    h0 = model.memory.initial_state(memory).controller_hidden  # (batch, hidden)
    return {
        "max_address_weight": float(out.address_attentions.amax(dim=-1).mean()),
        "max_address_weight_per_unit": out.address_attentions.amax(dim=-1).mean(dim=(0, 1)).tolist(),
        "h0_mean_abs": float(h0.abs().mean()),
        "h0_frac_abs_gt_1": float((h0.abs() > 1).float().mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output-dir", default="outputs/design_choices")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = TrainConfig(
        task="copy",
        model="panm",
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        model_kwargs=VARIANTS[args.variant],
    )
    result, model = train_and_evaluate(config, log=print)
    spec = task_spec("copy")
    L = spec.train_length
    probes = {n: probe(model, "copy", n) for n in (L, L + 1, 2 * (L + 1), 8 * (L + 1))}
    record = {
        "variant": args.variant,
        "model_kwargs": VARIANTS[args.variant],
        "steps": args.steps,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "best_step": result.best_step,
        "test_accuracy": result.test_accuracy,
        "probes": probes,
        "train_seconds": result.train_seconds,
    }
    if args.variant.startswith("cosine"):
        record["learned_inverse_temperature"] = float(model.memory.pointer_units.scorer.inverse_temperature)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.variant}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
