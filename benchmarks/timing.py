"""The benchmarks' one timing helper: interleaved repeats, synchronised on GPU, one statistic per run.

Interleaving (every run once per repeat, in turn) makes load on a shared machine hit all runs
alike, so their ratio is steadier than the ratio of separately timed blocks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def sync(device: str) -> None:
    """Wait for queued GPU work, so a timer brackets the kernels and not only their launch."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_interleaved(
    runs: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int,
    device: str = "cpu",
    reduce: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Seconds per call of each zero-argument callable in `runs`, reduced over `repeats` (median by default).

    Every callable runs `warmup` times first (not timed); then, `repeats` times, each runs once in turn.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0 (got repeats={repeats}, warmup={warmup}).")
    for _ in range(warmup):
        for fn in runs.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: reduce(values) for name, values in times.items()}
