"""A function cache that `torch.compile` traces as a lookup.

Dynamo ignores `functools.cache` and traces the cached function's body at every call, so a cached
registration (the Triton ports' `torch.library` calls) or a table built under `inference_mode` breaks
the graph there. `traced_cache` keeps its results in a plain dict, which Dynamo reads as a constant once
an eager call has filled it.

A compiled call never fills it: on a miss it computes the result in the graph and stores nothing. Storing
would be a side effect that Dynamo replays with the graph's own output, and under CUDA graphs
(`mode="reduce-overhead"`, the `cudagraphs` backend) that output lives in the graph's memory pool, which the
next replay overwrites: every later call would read a dead table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

Result = TypeVar("Result")


def traced_cache(function: Callable[..., Result]) -> Callable[..., Result]:
    """Cache `function`'s result per positional arguments (hashable), on eager calls only; `cache_clear()`
    empties it, `cache_size()` counts its entries."""
    results: dict[tuple, Result] = {}

    @functools.wraps(function)
    def cached(*args) -> Result:
        if args in results:
            return results[args]
        if torch.compiler.is_compiling():  # in the graph, with no side effect (see the module's docstring)
            return function(*args)
        results[args] = function(*args)
        return results[args]

    cached.cache_clear = results.clear  # type: ignore[attr-defined]
    cached.cache_size = results.__len__  # type: ignore[attr-defined]
    return cached
