"""Where PANM's aten ops per training step come from: pointer loop, binding, reads, Controller, the rest.

    python benchmarks/op_breakdown.py [--cases lstm,seq2seq] [--recurrence-kernel eager|fused|auto]
    python benchmarks/op_breakdown.py --time 20   # also: training-step times, backbone / eager / fused

One forward + backward of `benchmarks/overhead.py`'s cases (`--sections cost` counts the same step),
with every aten op attributed to the PANM part that dispatched it. Forward ops are attributed to the
innermost part running when they are dispatched; backward ops to the part whose forward op created the
autograd node being run (`torch._C._current_autograd_node`). Ops of the backbone and the loss fall in
"backbone + loss"; the parameters' gradient accumulation is its own line.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
from collections import Counter

import torch
from overhead import build_case, set_recurrence_kernel, train_step
from timing import time_interleaved
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from panm_hf import controller, memory, pointer_unit, reads
from panm_hf.kernels import linear_rows

OTHER = "backbone + loss"
FUNCTIONS = [linear_rows._LinearRows]  # PANM's autograd Functions (not seen by a torch-function mode)
# (owner, method name) -> part; the innermost running part wins
PARTS = [
    (memory.PanmMemory, "forward", "PANM glue (PanmMemory.forward)"),
    (memory.PanmMemory, "bind", "binding (address bank, g^a keys)"),
    (memory.PanmMemory, "initial_state", "initial state"),
    (pointer_unit.PointerUnits, "forward", "pointer loop"),
    (memory, "mode1_read", "reads (Mode 1, Mode 2)"),  # memory.py's own reference to it
    (reads.Mode2Reader, "forward", "reads (Mode 1, Mode 2)"),
    (controller.Controller, "forward", "controller (GRU, g^o)"),
]


class Attribution(TorchFunctionMode):
    """Forward: remembers which part created each autograd node (by the outputs' `grad_fn`)."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.created: list[tuple[int, str]] = []  # (sequence number of an output's node, part)
        self.seen: set[int] = set()  # nodes already attributed: a call returning its input unchanged made none

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.record(func(*args, **(kwargs or {})))

    def record(self, out):
        """Attribute the nodes of `out` to the running part (also for autograd Functions, whose `apply` a
        torch-function mode does not see)."""
        part = self.stack[-1] if self.stack else OTHER
        for value in out if isinstance(out, (tuple, list)) else (out,):
            node = getattr(value, "grad_fn", None) if isinstance(value, torch.Tensor) else None
            if node is not None and node._sequence_nr() not in self.seen:  # e.g. a no-op `.to(dtype)`
                self.seen.add(node._sequence_nr())
                self.created.append((node._sequence_nr(), part))
        return out

    def part_of(self, node) -> str:
        """The part of the call that created `node`: nodes made inside one torch call (a composite such
        as `nn.GRU`'s per-step ops) have sequence numbers up to that of the call's output node."""
        if node.name() == "torch::autograd::AccumulateGrad":
            return "gradient accumulation"
        index = bisect.bisect_left(self.created, (node._sequence_nr(), ""))
        return self.created[index][1] if index < len(self.created) else OTHER


class PartCounter(TorchDispatchMode):
    """Counts aten ops per part: the running part in forward, the node's creator in backward."""

    def __init__(self, attribution: Attribution):
        super().__init__()
        self.attribution = attribution
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        if node is not None:
            part = self.attribution.part_of(node) + " (backward)"
        else:
            part = (self.attribution.stack[-1] if self.attribution.stack else OTHER) + " (forward)"
        self.counts[part] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def attributed(attribution: Attribution):
    """Wrap every part's method so the attribution knows which part is running."""
    originals = []
    for owner, name, part in PARTS:
        original = getattr(owner, name)

        def wrapper(*args, _original=original, _part=part, **kwargs):
            attribution.stack.append(_part)
            try:
                return _original(*args, **kwargs)
            finally:
                attribution.stack.pop()

        setattr(owner, name, wrapper)
        originals.append((owner, name, original))
    for function in FUNCTIONS:  # autograd Functions: their outputs' nodes, recorded as they are made
        function.apply = lambda *args, _original=function.apply: attribution.record(_original(*args))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        for function in FUNCTIONS:
            del function.apply  # `torch.autograd.Function.apply` again


def breakdown(loss_fn) -> Counter:
    """Aten ops of one forward + backward of `loss_fn()`, per part and direction."""
    loss_fn().backward()  # warm-up (lazy inits, kernel compilation)
    attribution = Attribution()
    counter = PartCounter(attribution)
    with attributed(attribution), attribution, counter:
        loss = loss_fn()
    attribution.created.sort()
    with counter:
        loss.backward()
    return counter.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="lstm,seq2seq")
    parser.add_argument("--recurrence-kernel", default=None, help="override PanmMemoryConfig.recurrence_kernel")
    parser.add_argument("--smoke", action="store_true", help="tiny models (the CI test of this script)")
    parser.add_argument("--time", type=int, default=0, metavar="REPEATS",
                        help="also time training steps (forward, backward, AdamW) of the backbone and PANM with "
                             "eager and fused recurrences, interleaved, medians of REPEATS")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for case in args.cases.split(","):
        variant = "panm" if case == "lstm" else "panm-replace"
        model, loss_fn, _ = build_case(case, variant, "cpu", size="smoke" if args.smoke else "full")
        if args.recurrence_kernel is not None:
            set_recurrence_kernel(model, args.recurrence_kernel)
        model.train()
        counts = breakdown(lambda m=model, f=loss_fn: f(m))
        total = sum(counts.values())
        print(f"{case} ({variant}): {total} aten ops per training step (forward + backward)")
        for part, count in sorted(counts.items(), key=lambda item: -item[1]):
            print(f"  {part:45s} {count:6d}  {100 * count / total:5.1f}%")
        if args.time:
            print(f"{case}: training step ms (median of {args.time}, interleaved): " + time_steps(case, variant, args))


def time_steps(case: str, variant: str, args) -> str:
    """Backbone, PANM with eager recurrences and PANM with fused ones, each with its own AdamW, interleaved."""
    runs = {}
    for name, kernel in (("backbone", None), ("panm eager", "eager"), ("panm fused", "auto")):
        model, loss_fn, _ = build_case(case, "backbone" if kernel is None else variant, "cpu")
        if kernel is not None:
            set_recurrence_kernel(model, kernel)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        runs[name] = lambda m=model, f=loss_fn, o=optimizer: train_step(m, f, o)
    medians = time_interleaved(runs, args.time, warmup=2)
    return ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in medians.items())


if __name__ == "__main__":
    main()
