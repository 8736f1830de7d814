"""A function cache that `torch.compile` traces as a lookup.

Dynamo ignores `functools.cache` and traces the cached function's body at every call, so a cached
registration (the Triton ports' `torch.library` calls) or a table built under `inference_mode` breaks
the graph there. `traced_cache` keeps its results in a plain dict, which Dynamo reads as a constant once
the first eager call has filled it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")


def traced_cache(function: Callable[..., Result]) -> Callable[..., Result]:
    """Cache `function`'s result per positional arguments (hashable); `cache_clear()` empties it."""
    results: dict[tuple, Result] = {}

    @functools.wraps(function)
    def cached(*args) -> Result:
        if args not in results:
            results[args] = function(*args)
        return results[args]

    cached.cache_clear = results.clear  # type: ignore[attr-defined]
    return cached
