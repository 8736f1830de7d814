"""Training cost of the beyond-the-paper PANM variants against the faithful PANM (algorithmic suite).

Interleaved: each repeat times one training step (forward, backward, Adam) of every
variant in turn on the same batch, so load on the machine hits all of them alike;
reports medians and the ratio variant / faithful.

    python benchmarks/variants_cost.py [--task copy] [--batch-size 32] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial

import torch
from timing import time_interleaved

from research import build_model, make_batch, task_spec
from research.harness import sequence_loss
from research.models import PANM_VARIANTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="copy")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = task_spec(args.task)
    models, optimizers = {}, {}
    for name in PANM_VARIANTS:
        torch.manual_seed(0)
        models[name] = build_model(name, spec.feature_dim).train()
        optimizers[name] = torch.optim.Adam(models[name].parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    batches = [
        make_batch(args.task, args.batch_size, spec.train_length_range, generator=generator) for _ in range(8)
    ]

    calls = {name: itertools.count() for name in models}  # each variant walks the same batches in order

    def step(name: str) -> None:
        batch = batches[next(calls[name]) % len(batches)]
        logits = models[name](batch.inputs, batch.attention_mask, batch.labels.shape[1], generator=generator).logits
        loss = sequence_loss(logits, batch.labels)
        optimizers[name].zero_grad(set_to_none=True)
        loss.backward()
        optimizers[name].step()

    seconds = time_interleaved({name: partial(step, name) for name in models}, args.repeats, args.warmup)
    medians = {name: value * 1e3 for name, value in seconds.items()}
    result = {
        "task": args.task,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "repeats": args.repeats,
        "median_step_ms": medians,
        "ratio_to_faithful": {name: medians[name] / medians["panm"] for name in medians},
    }
    for name, value in medians.items():
        print(f"{name:>14}: {value:7.1f} ms/step  ratio {value / medians['panm']:.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
