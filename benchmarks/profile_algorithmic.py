"""Forward-time breakdown of the algorithmic PANM-LSTM vs the LSTM baseline (where PANM spends its time).

    python benchmarks/profile_algorithmic.py [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
from timing import time_interleaved

from research import build_model, make_batch, task_spec


def median_ms(fn, repeats: int = 30) -> float:
    return time_interleaved({"run": fn}, repeats, warmup=3)["run"] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = task_spec("copy")
    panm, lstm = build_model("panm", spec.feature_dim), build_model("lstm", spec.feature_dim)
    batch = make_batch("copy", 128, 10, generator=torch.Generator().manual_seed(0))
    steps = batch.labels.shape[1]
    memory = panm.memory
    with torch.no_grad():
        states, _ = panm.encoder(batch.inputs, batch.attention_mask)
        bound = memory.bind(states, batch.attention_mask)
        state = memory.initial_state(bound)
        encoder = median_ms(lambda: panm.encoder(batch.inputs, batch.attention_mask))
        bind = median_ms(lambda: memory.bind(states, batch.attention_mask))
        loop = median_ms(lambda: memory.pointer_units(
            state.pointers, state.pointer_hidden, bound.address_bank, bound.address_keys, bound.attention_mask, steps
        ))
        total = median_ms(lambda: panm(batch.inputs, batch.attention_mask, steps))
        baseline = median_ms(lambda: lstm(batch.inputs, batch.attention_mask, steps))
        baseline_encoder = median_ms(lambda: lstm.encoder(batch.inputs, batch.attention_mask))
    print(f"forward ms (batch 128, L=T={steps}): PANM total {total:.1f} = encoder {encoder:.1f} + bind {bind:.1f} "
          f"+ pointer loop {loop:.1f} + reads/controller {total - encoder - bind - loop:.1f}")
    decoder = baseline - baseline_encoder
    print(f"LSTM baseline total {baseline:.1f} = encoder {baseline_encoder:.1f} + decoder {decoder:.1f}")


if __name__ == "__main__":
    main()
