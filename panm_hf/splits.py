"""The paper's length split: train on the shorter inputs, test on the longer ones.

Le et al. (Sec. 3.4 for translation, Sec. 4.3 for question answering) pool every sample,
sort them by input length, train on the shortest fraction and test on the rest, so
every test input is at least as long as every training input. One function serves
both examples; each passes how its records are measured and grouped.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def length_split(
    items: Sequence[T],
    train_fraction: float,
    *,
    sort_key: Callable[[T], Any],
    group: Callable[[T], Hashable] | None = None,
) -> tuple[list[T], list[T]]:
    """Sort `items` by `sort_key` (stable) and cut after `round(train_fraction * n)` of them (at least 1).

    Args:
        items: the pooled samples.
        train_fraction: share of the samples used for training, in (0, 1) (the paper: 0.8 and 0.5).
        sort_key: the sort order; its first criterion is the input length (e.g. whitespace words),
            ties keep the data order unless the key breaks them.
        group: samples that must stay on one side of the cut (e.g. questions on one context); the
            cut moves forward to the end of the current group. `sort_key` must keep a group contiguous.

    Returns:
        `(train, test)`, both in sorted order.

    Raises:
        ValueError: when `train_fraction` is outside (0, 1), or no test sample is left.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1) (got {train_fraction!r}); the paper uses 0.8 and 0.5.")
    ordered = sorted(items, key=sort_key)
    cut = min(max(round(train_fraction * len(ordered)), 1), len(ordered))
    if group is not None:
        while cut < len(ordered) and group(ordered[cut]) == group(ordered[cut - 1]):
            cut += 1
    if cut >= len(ordered):
        raise ValueError(
            f"length_split of {len(ordered)} samples at train_fraction={train_fraction} leaves no test sample"
            + (" (the last group reaches the end)" if group is not None and ordered else "")
            + "; pass more samples or a smaller train_fraction."
        )
    return ordered[:cut], ordered[cut:]


__all__ = ["length_split"]
