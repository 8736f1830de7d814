"""Eager or fused, for every op PANM can fuse, and why: the one place that decides.

The modules that run these ops describe a call (`Call`) and ask `decide(op, call)`; they never test devices,
dtypes or settings themselves. The answer names the kernel, `"c"` (the C kernels, `loader.py`), `"triton"`
(the Triton ports: `triton_port.py`, `triton_shift.py`, `triton_gru.py`, `triton_reads.py`), `"cudnn"`
(`nn.GRU`, one cuDNN op on CUDA) or `"eager"` (plain PyTorch ops, the reference), and for `"eager"` the reason:
the first row of `FALLBACKS` that holds for the call.

Ops (`OPS`):
    pointer_recurrence: the Pointer-Unit loop (`PointerUnits.forward`), either `pointer_update`.
    controller_gru: the Controller GRU over all steps (`Controller.forward`).
    cosine_normalize: cosine scoring's `scale * normalize(x)` (`AttentionScorer`, address keys).
    mode2_read: the Mode-2 read after its query MLP (`Mode2Reader`).
    controller_pool: `h^c_0`'s masked mean or sum of `M` (`Controller.initial_hidden`).
    address_bank, start_pointers: the address glue (`PanmMemory.address`, `initial_state`), Triton only
        (`ADDRESSING`): a few integer ops each on CPU, so the C path keeps them eager.

Under `recurrence_kernel="fused"` or `"triton"` a recurrence (`RECURRENCES`) that falls back raises a
ValueError with the reason (`require`); the other ops fall back silently under every setting.
`"triton"` runs the code path CUDA takes, on any device (on CPU under Triton's interpreter): the Pointer-Unit
loop and the reads (`READS`) in their Triton ports; the Controller GRU in its Triton port, where CUDA's `"auto"`
keeps cuDNN's `nn.GRU` (one op forward and one backward there, as the port is one launch each way; `nn.GRU` on
CPU would dispatch every step's ops). `fused_op` names the custom op that runs a read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..memory_config import CONTROLLER_READ_STEPS
from .loader import DTYPES, load_library, register_triton, triton_interpreted
from .shift_recurrence import shift_recurrence  # noqa: F401  (registers panm_hf::shift_recurrence)

OPS = ("pointer_recurrence", "controller_gru", "cosine_normalize", "mode2_read", "controller_pool", "address_bank",
       "start_pointers")  # fmt: skip
RECURRENCES = ("pointer_recurrence", "controller_gru")  # "fused" and "triton" raise when these fall back
READS = ("cosine_normalize", "mode2_read", "controller_pool")  # per-call ops: a C kernel on CPU, Triton on CUDA
ADDRESSING = ("address_bank", "start_pointers")  # per-call ops with a Triton kernel only
TRITON_TILE = 1 << 16  # elements of M one Mode-2 Triton program holds, padded to powers of two
CUSTOM_OPS = {"cosine_normalize": "normalize_rows", "mode2_read": "mode2_attention", "controller_pool": "masked_pool"}


@dataclass(frozen=True)
class Call:
    """What decides an op's path: the config's `recurrence_kernel` and the facts of one call.

    Args:
        setting: `PanmMemoryConfig.recurrence_kernel`.
        device, dtype: of the call's tensors.
        uniform: every tensor and parameter of the call shares the dtype and device.
        per_step: per-step masks, a step mask or anchors (causal decoding).
        compiled_step: `PointerUnits.compile_step()` was called.
        controller_read: `content_read="controller"`.
        tile: the Mode-2 read's `slots x dim` tile (`M` as one Triton program holds it), 0 for other ops.
    """

    setting: str
    device: torch.device
    dtype: torch.dtype
    uniform: bool = True
    per_step: bool = False
    compiled_step: bool = False
    controller_read: bool = False
    tile: int = 0


@dataclass(frozen=True)
class Decision:
    """`kernel`: `"c"`, `"triton"`, `"cudnn"` or `"eager"`; `reason`: why `"eager"` (None otherwise)."""

    kernel: str
    reason: str | None = None


def candidate(op: str, call: Call) -> str:
    """The kernel `op` runs when no fallback applies: CUDA's (and `"triton"`'s) or the C one."""
    cuda_path = call.device.type == "cuda" or call.setting == "triton"
    if cuda_path and op in ("pointer_recurrence", *READS, *ADDRESSING):
        return "triton"
    if call.setting == "triton" and op == "controller_gru":  # its Triton port: one launch, as cuDNN's is one op
        return "triton"
    if cuda_path and op == "controller_gru":
        return "cudnn"
    return "c"


def _c_library_reason(call: Call) -> str | None:
    return _c_library_reason_for(DTYPES[call.dtype])


@torch.compiler.assume_constant_result  # torch.compile reads it as a constant: no graph break at the first call
def _c_library_reason_for(dtype_name: str) -> str | None:
    library = load_library(dtype_name)
    return library if isinstance(library, str) else None


@torch.compiler.assume_constant_result
def _triton_registration() -> str | None:
    """`register_triton()`, read by torch.compile as a constant (Dynamo would trace the registration)."""
    return register_triton()


@torch.compiler.assume_constant_result
def _triton_interpreted() -> bool:
    return triton_interpreted()


ANY = ("c", "triton", "cudnn")
# (ops, kernels, when, reason): a call of one of `ops` whose candidate kernel is one of `kernels` runs eagerly
# when `when(call)` holds, for `reason` (a string, or a function of the call). The first row that holds wins.
FALLBACKS: tuple[tuple[tuple[str, ...], tuple[str, ...], Callable[[Call], bool], str | Callable[[Call], str]], ...] = (
    (OPS, ANY, lambda c: c.setting == "eager", 'recurrence_kernel="eager" keeps every op in plain PyTorch'),
    (("pointer_recurrence",), ANY, lambda c: c.per_step,
     "per-step masks and anchors (causal decoding) run step by step"),
    (("mode2_read",), ANY, lambda c: c.per_step, "a per-step (causal) mask is read with plain torch ops"),
    (ADDRESSING, ANY, lambda c: c.per_step,
     "distractor addresses or a causal start (the first slot alone) are built with plain torch ops"),
    (ADDRESSING, ("c",), lambda c: True, "the address glue has no C kernel: on CPU its integer ops run eagerly"),
    (("pointer_recurrence",), ANY, lambda c: c.compiled_step, "compile_step() was called"),
    (("controller_gru",), ANY, lambda c: c.controller_read, CONTROLLER_READ_STEPS),
    (OPS, ("c", "triton"), lambda c: not c.uniform, "the inputs, states and parameters differ in dtype or device"),
    (("mode2_read",), ("triton",), lambda c: c.tile > TRITON_TILE,
     f"M's padded (slots x dim) tile is past the {TRITON_TILE:,} elements one Triton program holds; plain torch ops "
     "(batched matmuls) read it"),
    (OPS, ("c",), lambda c: c.device.type != "cpu",
     lambda c: f"no fused kernel for device {c.device.type!r} (CPU, and CUDA with Triton)"),
    (OPS, ("c", "triton"), lambda c: c.dtype not in DTYPES,
     lambda c: f"no fused kernel for dtype {c.dtype} (float32 and float64 only)"),
    (OPS, ("c",), lambda c: _c_library_reason(c) is not None, _c_library_reason),
    (OPS, ("triton",), lambda c: _triton_registration() is not None, lambda c: _triton_registration()),
    (OPS, ("triton",), lambda c: c.device.type == "cpu" and not _triton_interpreted(),
     "on CPU tensors the Triton kernels run only under Triton's interpreter; set TRITON_INTERPRET=1 in the "
     "environment before triton (and panm_hf) is imported"),
)  # fmt: skip


def decide(op: str, call: Call) -> Decision:
    """Which kernel runs `op` for `call`, and why the eager path when it does."""
    kernel = candidate(op, call)
    for ops, kernels, when, reason in FALLBACKS:
        if op in ops and kernel in kernels and when(call):
            return Decision("eager", reason if isinstance(reason, str) else reason(call))
    return Decision(kernel)


def fused_op(op: str, call: Call) -> Callable | None:
    """The custom op that runs one of `READS` for `call` (`panm_hf::normalize_rows`, `mode2_attention`,
    `masked_pool`, or their `_triton` ports), or None for the plain torch ops."""
    kernel = decide(op, call).kernel
    if kernel == "eager":
        return None
    return getattr(torch.ops.panm_hf, CUSTOM_OPS[op] + ("_triton" if kernel == "triton" else ""))


def require(op: str, call: Call, what: str) -> Decision:
    """`decide`, raising a ValueError naming the setting and the fix when `"fused"` or `"triton"` cannot run
    the recurrence `op` (`what` names it in the message)."""
    decision = decide(op, call)
    if decision.reason is not None and op in RECURRENCES and call.setting in ("fused", "triton"):
        raise ValueError(
            f'recurrence_kernel="{call.setting}" cannot run {what}: {decision.reason}. Use '
            'recurrence_kernel="auto" (fused where it applies) or "eager".'
        )
    return decision


def unavailable_reason(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why no fused Pointer-Unit kernel runs on tensors of this dtype and device under `"auto"`; None when one
    does (the C kernel on CPU, the Triton port on CUDA)."""
    return decide("pointer_recurrence", Call(setting="auto", device=device, dtype=dtype)).reason
