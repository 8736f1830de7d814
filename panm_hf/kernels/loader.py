"""The fused kernels' loader: compiles the C source (`source.py`) and exposes it as `torch.library` ops.

PANM's recurrences fused: all decoding steps in one kernel, the backward in another.

`PointerUnits.forward` runs a Python loop over decoding steps (a grouped GRU cell and an address
attention per step, ~25 kernels forward and ~2x that backward). The loop never sees memory content
(principle II) and its shapes are fixed per (batch, slots, steps), so the whole recurrence can run as
one kernel. The Controller GRU (`nn.GRU`) has no fused CPU kernel in PyTorch either (it runs step by
step; on GPU cuDNN fuses it), so its recurrence gets the same treatment. Here the kernels are a small
C source (`source.py`, plain loops, no torch headers) compiled once per machine with the system C
compiler into a per-user cache, keyed by a hash of the source, the flags and the CPU, and called
through ctypes on contiguous CPU tensors.

They are exposed as `torch.library` custom ops, `panm_hf::pointer_recurrence` (forward: weights,
final pointers and hidden, plus the per-step states the backward needs) with
`panm_hf::pointer_recurrence_backward`, and `panm_hf::gru_recurrence` with
`panm_hf::gru_recurrence_backward`, wired with `register_autograd`, with fake (meta) kernels so
`torch.compile` can trace through them (`pointer_update="shift"` has its own pair, `shift_recurrence.py`,
built from the same C helpers). Scope: a (batch, slots) mask, on CPU in float32/float64; everything else
runs the eager loop and `nn.GRU`, which stay the reference (`PanmMemoryConfig.recurrence_kernel`). On CUDA
the Pointer-Unit ops and the three smaller ops below dispatch to Triton ports of the same algorithms
(`triton_port.py`, `triton_shift.py`, `triton_reads.py`), registered on first use (`register_triton`), as is the
Controller GRU's (`triton_gru.py`, which `recurrence_kernel="triton"` runs). Which path each op takes, and why,
is decided in `dispatch.py` alone.

The same C source holds three smaller kernels used outside the loops, each one op forward and one
backward: `panm_hf::normalize_rows` (cosine scoring's `scale * normalize(x)`, optionally writing the
unit-major address keys batch-major), `panm_hf::mode2_attention` (the Mode-2 read after its query MLP, and
the decoder content read) and `panm_hf::masked_pool` (`h^c_0`'s masked mean or sum of `M`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from ..memo import traced_cache
from .source import SOURCE

DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_FLAGS = ["-O3", "-fopenmp-simd", "-shared", "-fPIC"]  # omp simd: vectorised dot products, no runtime
_NATIVE = ["-march=native"]


def cache_dir() -> Path:
    """Where compiled kernels live: `$PANM_HF_CACHE`, else `$XDG_CACHE_HOME/panm_hf`, else `~/.cache/panm_hf`."""
    if os.environ.get("PANM_HF_CACHE"):
        return Path(os.environ["PANM_HF_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "panm_hf"


def find_compiler() -> str | None:
    """The C compiler used to build the kernel: `$CC`, else `cc`, else `gcc`; None when there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_name() -> str:
    try:  # -march=native code must not be reused on another CPU sharing the cache
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _build(source: str, compiler: str, defines: list[str], target: Path) -> str | None:
    """Compile `source` into `target`; a string saying why when the compiler fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built, source_file = Path(scratch) / target.name, Path(scratch) / "recurrences.c"
        source_file.write_text(source)
        errors = ""
        for extra in (_NATIVE, []):  # -march=native where the compiler knows it
            command = [compiler, *_FLAGS, *extra, *defines, str(source_file), "-o", str(built), "-lm"]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                os.replace(built, target)  # atomic: concurrent processes never load a half-written file
                return None
            errors = result.stderr.strip()
    return f"compiling the recurrences' C source with {compiler} failed: {errors[-500:]}"


_LONG, _PTR = ctypes.c_long, ctypes.c_void_p
_DIMS = [_LONG] * 6 + [ctypes.c_int, ctypes.c_double]  # units, batch, steps, slots, bits, hidden, cosine, tau
# The C functions the kernel exports and their argument types (all return void).
_SIGNATURES = {
    "pointer_forward": _DIMS + [_PTR, _PTR, _PTR, _LONG, _LONG] + [_PTR] * 14,
    "pointer_backward": _DIMS + [_PTR, _LONG, _LONG] + [_PTR] * 23,
    "shift_forward": _DIMS + [_PTR, _PTR, _PTR, _LONG, _LONG] + [_PTR] * 14 + [_LONG] + [_PTR] * 7,  # K, w0, ...
    "shift_backward": _DIMS + [_PTR, _LONG, _LONG] + [_PTR] * 23 + [_LONG] + [_PTR] * 10,
    "gru_forward": [_LONG] * 3 + [_PTR] * 7,  # batch, steps, hidden
    "gru_backward": [_LONG] * 3 + [_PTR] * 11,
    "normalize_forward": [_LONG] * 4 + [ctypes.c_int] + [_PTR] * 4,  # A, Bt, S, dim, swap
    "normalize_backward": [_LONG] * 4 + [ctypes.c_int] + [_PTR] * 6,
    "attention_forward": [_LONG] * 4 + [ctypes.c_int] + [_PTR] * 10,  # batch, queries, slots, dim
    "attention_backward": [_LONG] * 4 + [ctypes.c_int] + [_PTR] * 14,
    "pool_forward": [_LONG] * 3 + [ctypes.c_int] + [_PTR] * 3,  # batch, slots, dim, mean
    "pool_backward": [_LONG] * 3 + [ctypes.c_int] + [_PTR] * 3,
}


@traced_cache
def load_library(dtype_name: str) -> ctypes.CDLL | str:
    """The compiled kernel for `"float32"` or `"float64"`, or a string saying why it is unavailable."""
    compiler = find_compiler()
    if compiler is None:
        return "no C compiler found (set $CC or install cc/gcc)"
    source = SOURCE
    defines = ["-DUSE_DOUBLE"] if dtype_name == "float64" else []
    key = hashlib.sha256("\n".join([source, compiler, *_FLAGS, *defines, platform.machine(), _cpu_name()]).encode())
    target = cache_dir() / f"recurrences_{dtype_name}_{key.hexdigest()[:16]}.so"
    try:  # an unwritable cache or an unloadable library leaves the eager path, never an error under "auto"
        if not target.exists():
            failure = _build(source, compiler, defines, target)
            if failure is not None:
                return failure
        library = ctypes.CDLL(str(target))
    except OSError as error:
        return f"the fused kernel could not be built or loaded in {target.parent} ({error}); set $PANM_HF_CACHE"
    missing = [name for name in _SIGNATURES if not hasattr(library, name)]
    if missing:  # a stale or foreign file under the cache's name: "auto" falls back to eager
        return f"the cached kernel {target} lacks {', '.join(missing)}; delete it to rebuild, or set $PANM_HF_CACHE"
    for name, argtypes in _SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None
    return library


@traced_cache
def register_triton() -> str | None:
    """Register the Triton ports (`triton_port`, `triton_shift`, `triton_gru`, `triton_reads`) as their ops' CUDA
    kernels, and as `panm_hf::<op>_triton` on every device (`pointer_recurrence_triton`, `shift_recurrence_triton`,
    `gru_recurrence_triton`, `normalize_rows_triton`, `mode2_attention_triton`, `masked_pool_triton`: what
    `recurrence_kernel="triton"` calls), and the address glue's two kernels (`address_bank_triton`,
    `start_pointers_triton`); a string saying why when Triton is missing."""
    try:
        from .triton_gru import gru_backward_triton, gru_forward_triton
        from .triton_port import pointer_backward_triton, pointer_forward_triton
        from .triton_reads import PORTS as READ_PORTS
        from .triton_shift import shift_backward_triton, shift_forward_triton
    except ImportError as error:
        return f"the Triton kernel needs Triton ({error}); install it with `pip install triton`"
    from .shift_recurrence import TRITON_AUTOGRAD, _shift_recurrence_backward_fake, _shift_recurrence_fake

    ports = (
        ("pointer_recurrence", pointer_forward_triton, pointer_backward_triton, _pointer_recurrence_fake,
         _pointer_recurrence_backward_fake, (_triton_backward, _setup_context)),
        ("shift_recurrence", shift_forward_triton, shift_backward_triton, _shift_recurrence_fake,
         _shift_recurrence_backward_fake, TRITON_AUTOGRAD),
        ("gru_recurrence", gru_forward_triton, gru_backward_triton, _gru_recurrence_fake,
         _gru_recurrence_backward_fake, (_gru_triton_backward, _gru_setup_context)),
        ("normalize_rows", *READ_PORTS["normalize_rows"], _normalize_rows_fake, _normalize_rows_backward_fake,
         (_normalize_triton_backward, _normalize_setup_context)),
        ("mode2_attention", *READ_PORTS["mode2_attention"], _mode2_attention_fake, _mode2_attention_backward_fake,
         (_mode2_triton_backward, _mode2_setup_context)),
        ("masked_pool", *READ_PORTS["masked_pool"], _masked_pool_fake, _masked_pool_backward_fake,
         (_pool_triton_backward, _pool_setup_context)),
    )  # fmt: skip
    for name, forward, backward, fake, backward_fake, (autograd_backward, setup_context) in ports:
        torch.library.register_kernel(f"panm_hf::{name}", "cuda", forward)
        torch.library.register_kernel(f"panm_hf::{name}_backward", "cuda", backward)
        if _registered(f"{name}_triton"):
            continue
        for op, impl, op_fake in ((name, forward, fake), (f"{name}_backward", backward, backward_fake)):
            schema = str(getattr(torch.ops.panm_hf, op).default._schema)  # the C ops' arguments and outputs
            schema = schema[schema.index("(") :]
            triton_op = f"panm_hf::{op.replace(name, name + '_triton')}"
            torch.library.custom_op(triton_op, impl, mutates_args=(), schema=schema).register_fake(op_fake)
        torch.library.register_autograd(f"panm_hf::{name}_triton", autograd_backward, setup_context=setup_context)
    _register_addressing()
    return None


def _register_addressing() -> None:
    """`panm_hf::address_bank_triton` and `start_pointers_triton` (`triton_addressing`): no gradient, no C twin."""
    from .triton_addressing import address_bank_triton, start_pointers_triton

    if _registered("address_bank_triton"):
        return

    def bank_fake(mask, base_address, bits, dtype):
        return mask.new_empty((*mask.shape, bits), dtype=dtype), mask.new_empty(mask.shape[0], dtype=torch.long)

    def start_fake(mask, base_address, lengths, numerators, bits, dtype):
        batch, slots, units = *mask.shape, numerators.shape[0]
        return (mask.new_empty((batch, units, bits), dtype=dtype),
                mask.new_empty((batch, units, slots), dtype=dtype))  # fmt: skip

    for impl, fake in ((address_bank_triton, bank_fake), (start_pointers_triton, start_fake)):
        op = torch.library.custom_op(f"panm_hf::{impl.__name__}", impl, mutates_args=())
        op.register_fake(fake)


def triton_interpreted() -> bool:
    """Whether the Triton port was compiled for Triton's interpreter (`TRITON_INTERPRET=1` when triton was
    imported), the only way it runs on CPU tensors."""
    from .triton_port import _pointer_forward_kernel

    return type(_pointer_forward_kernel).__name__ == "InterpretedFunction"


def _ptr(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def pointer_recurrence(
    pointers: Tensor,
    hidden: Tensor,
    keys: Tensor,
    bank: Tensor,
    mask: Tensor,
    input_weight: Tensor,
    input_bias: Tensor,
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    inverse_temperature: Tensor | None,
    num_steps: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """All `num_steps` Pointer-Unit updates (Eqs. 1-3) in one kernel.

    Args:
        pointers: `(batch, units, bits)` `p_0`.  hidden: `(batch, units, hidden)` `h_0`.
        keys: `(batch, units, slots, hidden)` prepared address keys.  bank: `(batch, slots, bits)` `A`.
        mask: `(batch, slots)` bool.  input_weight/bias, hidden_weight/bias: the grouped GRU's
        `(units, bits|hidden, 3 hidden)` / `(units, 3 hidden)`.  inverse_temperature: `()` for cosine
        scoring, None for dot (the keys then carry `1/sqrt(hidden)`).

    Returns:
        `(weights (batch, steps, units, slots), pointers (batch, units, bits), hidden (batch, units, hidden))`
        and, for the backward, the states `h_0..h_T`, `p_0..p_T`, the gates `r|z|n|gh_n`, the norms of
        `h_t` and the softmax probabilities.
    """
    gru = (input_weight, input_bias, hidden_weight, hidden_bias)
    return run_recurrence("pointer_forward", pointers, hidden, keys, bank, mask, gru, inverse_temperature, num_steps)


def _tau(inverse_temperature: Tensor | None) -> tuple[int, float]:
    # (cosine, tau) as the C kernels take them
    return (1, float(inverse_temperature)) if inverse_temperature is not None else (0, 1.0)


def run_recurrence(
    function: str, pointers: Tensor, hidden: Tensor, keys: Tensor, bank: Tensor, mask: Tensor, gru: tuple,
    inverse_temperature: Tensor | None, num_steps: int, extra_inputs: tuple = (), extra_shapes: tuple = (),
) -> tuple[Tensor, ...]:
    """Call the C forward `function` (`pointer_forward`, or `shift_forward` with its `extra_inputs`, ints or tensors,
    and outputs of `extra_shapes` appended) on contiguous tensors; return `pointer_recurrence`'s eight outputs and
    the extra ones."""
    library = load_library(DTYPES[keys.dtype])
    batch, units, slots, size = keys.shape
    bits = bank.shape[-1]
    pointers, hidden, bank = pointers.contiguous(), hidden.contiguous(), bank.contiguous()
    mask = mask.to(torch.bool).contiguous()
    params = [p.contiguous() for p in gru]  # W_i, b_i, W_h, b_h
    if keys.stride(3) != 1 or keys.stride(2) != size:  # the kernel walks each row's (slots, hidden) block
        keys = keys.contiguous()
    new = functools.partial(torch.empty, dtype=keys.dtype, device=keys.device)
    outputs = (
        new(batch, num_steps, units, slots),  # weights
        new(batch, units, bits),  # final pointers
        new(batch, units, size),  # final hidden
        new(batch, units, num_steps + 1, size),  # h_0..h_T
        new(batch, units, num_steps + 1, bits),  # p_0..p_T
        new(batch, units, num_steps, 4 * size),  # r | z | n | gh_n
        new(batch, units, num_steps),  # |h_t|
        new(batch, units, num_steps, slots),  # softmax probabilities
        *(new(*shape) for shape in extra_shapes),
    )
    kept = [x if isinstance(x, int) else x.contiguous() for x in extra_inputs]  # alive through the call
    extra = [x if isinstance(x, int) else _ptr(x) for x in kept]
    getattr(library, function)(
        units, batch, num_steps, slots, bits, size, *_tau(inverse_temperature),
        _ptr(pointers), _ptr(hidden), _ptr(keys), keys.stride(0), keys.stride(1), _ptr(bank), _ptr(mask),
        *map(_ptr, params), *map(_ptr, outputs[:8]), *extra, *map(_ptr, outputs[8:]),
    )  # fmt: skip
    return outputs


def _pointer_recurrence_fake(pointers, hidden, keys, bank, mask, input_weight, input_bias, hidden_weight, hidden_bias,
      inverse_temperature, num_steps):  # fmt: skip
    batch, units, slots, size = keys.shape
    bits = bank.shape[-1]
    new = keys.new_empty
    return (new(batch, num_steps, units, slots), new(batch, units, bits), new(batch, units, size),
            new(batch, units, num_steps + 1, size), new(batch, units, num_steps + 1, bits),
            new(batch, units, num_steps, 4 * size), new(batch, units, num_steps),
            new(batch, units, num_steps, slots))  # fmt: skip


def pointer_recurrence_backward(
    grad_weights: Tensor | None,
    grad_pointers: Tensor | None,
    grad_hidden: Tensor | None,
    keys: Tensor,
    bank: Tensor,
    mask: Tensor,
    input_weight: Tensor,
    hidden_weight: Tensor,
    inverse_temperature: Tensor | None,
    hidden_states: Tensor,
    pointer_states: Tensor,
    gates: Tensor,
    norms: Tensor,
    probs: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The whole recurrence's backward in one kernel: gradients of `pointer_recurrence`'s inputs (mask aside),
    `(pointers, hidden, keys, bank, input_bias, hidden_bias, inverse_temperature)` (the last a zero `()` tensor
    under dot scoring), and the factors of the GRU weights' gradients, one GEMM each over all (sample, step)
    rows, which BLAS does better than a hand loop: per unit `h_t (units, hidden, batch*steps)` and
    `p_t (units, bits, batch*steps)` (written transposed: the GEMMs read them as they are) and the gate
    gradients `(units, batch*steps, 3 hidden)` of `W_h`, `W_i`.
    Missing output gradients count as zeros."""
    states = (hidden_states, pointer_states, gates, norms, probs)
    return run_recurrence_backward(
        "pointer_backward", (grad_weights, grad_pointers, grad_hidden), keys, bank, mask, input_weight, hidden_weight,
        inverse_temperature, states,
    )  # fmt: skip


def run_recurrence_backward(
    function: str, grads: tuple, keys: Tensor, bank: Tensor, mask: Tensor, input_weight: Tensor,
    hidden_weight: Tensor, inverse_temperature: Tensor | None, states: tuple, extra_inputs: tuple = (),
    extra_shapes: tuple = (),
) -> tuple[Tensor, ...]:
    """Call the C backward `function` (`pointer_backward`, or `shift_backward` with its `extra_inputs`, ints or
    tensors, and outputs of `extra_shapes` appended); return `pointer_recurrence_backward`'s eleven outputs and the
    extra ones. `grads`: the output gradients `(weights, pointers, hidden)`, None for zeros."""
    library = load_library(DTYPES[keys.dtype])
    batch, units, slots, size = keys.shape
    bits, steps = bank.shape[-1], states[-1].shape[2]
    new = functools.partial(torch.empty, dtype=keys.dtype, device=keys.device)
    shapes = ((batch, steps, units, slots), (batch, units, bits), (batch, units, size))
    grads_in = [torch.zeros(shape, dtype=keys.dtype, device=keys.device) if grad is None else grad.contiguous()
                for grad, shape in zip(grads, shapes)]  # fmt: skip
    if keys.stride(3) != 1 or keys.stride(2) != size:
        keys = keys.contiguous()
    bank, mask = bank.contiguous(), mask.to(torch.bool).contiguous()
    input_weight, hidden_weight = input_weight.contiguous(), hidden_weight.contiguous()
    rows = batch * steps
    outputs = (
        new(batch, units, bits), new(batch, units, size), new(batch, units, slots, size), new(batch, slots, bits),
        new(units, 3 * size), new(units, 3 * size), new(()),
        new(units, size, rows), new(units, bits, rows), new(units, rows, 3 * size), new(units, rows, 3 * size),
        *(new(*shape) for shape in extra_shapes),
    )  # fmt: skip
    kept = [x if isinstance(x, int) else x.contiguous() for x in extra_inputs]  # alive through the call
    extra = [x if isinstance(x, int) else _ptr(x) for x in kept]
    getattr(library, function)(
        units, batch, steps, slots, bits, size, *_tau(inverse_temperature),
        _ptr(keys), keys.stride(0), keys.stride(1), _ptr(bank), _ptr(mask), _ptr(input_weight), _ptr(hidden_weight),
        *map(_ptr, states), *map(_ptr, grads_in), *map(_ptr, outputs[:11]), *extra, *map(_ptr, outputs[11:]),
    )  # fmt: skip
    return outputs


def _pointer_recurrence_backward_fake(
      grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight, hidden_weight, inverse_temperature,
      hidden_states, pointer_states, gates, norms, probs):  # fmt: skip
    batch, units, slots, size = keys.shape
    bits, rows = bank.shape[-1], batch * probs.shape[2]
    new = keys.new_empty
    return (new(batch, units, bits), new(batch, units, size), new(batch, units, slots, size), new(bank.shape),
            new(units, 3 * size), new(units, 3 * size), new(()), new(units, size, rows), new(units, bits, rows),
            new(units, rows, 3 * size), new(units, rows, 3 * size))  # fmt: skip


def _setup_context(ctx, inputs, output):
    (_, _, keys, bank, mask, input_weight, _, hidden_weight, _, inverse_temperature, _) = inputs
    ctx.save_for_backward(keys, bank, mask, input_weight, hidden_weight, inverse_temperature, *output[3:])
    ctx.set_materialize_grads(False)  # unused outputs pass None, not zero tensors built here
    ctx.mark_non_differentiable(*output[3:])


def _pointer_backward(backward_op, ctx, grad_weights, grad_pointers, grad_hidden):
    keys, bank, mask, input_weight, hidden_weight, inverse_temperature, *states = ctx.saved_tensors
    grads = backward_op(
        grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight, hidden_weight,
        inverse_temperature, *states,
    )  # fmt: skip
    d_pointers, d_hidden, d_keys, d_bank, d_input_bias, d_hidden_bias, d_tau, h_rows, p_rows, dgh, dgi = grads
    d_hidden_weight = torch.bmm(h_rows, dgh)  # (units, hidden, 3 hidden)
    d_input_weight = torch.bmm(p_rows, dgi)  # (units, bits, 3 hidden)
    d_tau = d_tau if inverse_temperature is not None else None
    # inputs: pointers, hidden, keys, bank, mask, input_weight, input_bias, hidden_weight, hidden_bias, tau, steps
    return (d_pointers, d_hidden, d_keys, d_bank, None, d_input_weight, d_input_bias, d_hidden_weight, d_hidden_bias,
            d_tau, None)  # fmt: skip


def _backward(ctx, grad_weights, grad_pointers, grad_hidden, *_):
    backward_op = torch.ops.panm_hf.pointer_recurrence_backward
    return _pointer_backward(backward_op, ctx, grad_weights, grad_pointers, grad_hidden)


def _triton_backward(ctx, grad_weights, grad_pointers, grad_hidden, *_):
    backward_op = torch.ops.panm_hf.pointer_recurrence_triton_backward
    return _pointer_backward(backward_op, ctx, grad_weights, grad_pointers, grad_hidden)


def gru_recurrence(
    input_gates: Tensor, hidden: Tensor, hidden_weight: Tensor, hidden_bias: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """`nn.GRU`'s recurrence (one layer, batch first) over all steps in one kernel.

    Args:
        input_gates: `(batch, steps, 3 hidden)` `x W_ih^T + b_ih` for every step.  hidden: `(batch, hidden)` `h_0`.
        hidden_weight: `(3 hidden, hidden)` `W_hh`.  hidden_bias: `(3 hidden,)` `b_hh`.

    Returns:
        `(states (batch, steps, hidden), last (batch, hidden))` and the gates `r|z|n|gh_n` for the backward.
    """
    library = load_library(DTYPES[input_gates.dtype])
    batch, steps, size = hidden.shape[0], input_gates.shape[1], hidden.shape[1]
    inputs = [t.contiguous() for t in (input_gates, hidden, hidden_weight, hidden_bias)]
    new = functools.partial(torch.empty, dtype=hidden.dtype, device=hidden.device)
    outputs = (new(batch, steps, size), new(batch, size), new(batch, steps, 4 * size))
    library.gru_forward(batch, steps, size, *map(_ptr, inputs), *map(_ptr, outputs))
    return outputs


def _gru_recurrence_fake(input_gates, hidden, hidden_weight, hidden_bias):
    batch, steps, size = hidden.shape[0], input_gates.shape[1], hidden.shape[1]
    return hidden.new_empty(batch, steps, size), hidden.new_empty(batch, size), hidden.new_empty(batch, steps, 4 * size)


def gru_recurrence_backward(
    grad_states: Tensor | None, grad_last: Tensor | None, hidden: Tensor, hidden_weight: Tensor, states: Tensor,
    gates: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of `gru_recurrence`'s inputs `input_gates`, `hidden`, `hidden_bias` in one kernel, and the factors
    `(h_{t-1} (batch*steps, hidden), gate gradients (3 hidden, batch*steps), transposed)` of `hidden_weight`'s
    (one GEMM)."""
    library = load_library(DTYPES[hidden.dtype])
    batch, steps, size = states.shape
    zeros = functools.partial(torch.zeros, dtype=hidden.dtype, device=hidden.device)
    grad_states = grad_states.contiguous() if grad_states is not None else zeros(batch, steps, size)
    grad_last = grad_last.contiguous() if grad_last is not None else zeros(batch, size)
    hidden, hidden_weight = hidden.contiguous(), hidden_weight.contiguous()
    new = functools.partial(torch.empty, dtype=hidden.dtype, device=hidden.device)
    outputs = (new(batch, steps, 3 * size), new(batch, size), new(3 * size), new(batch * steps, size),
               new(3 * size, batch * steps))  # fmt: skip
    library.gru_backward(
        batch, steps, size, *map(_ptr, (hidden, hidden_weight, states, gates, grad_states, grad_last)),
        *map(_ptr, outputs),
    )  # fmt: skip
    return outputs


def _gru_recurrence_backward_fake(grad_states, grad_last, hidden, hidden_weight, states, gates):
    batch, steps, size = states.shape
    new = hidden.new_empty
    return (new(batch, steps, 3 * size), new(batch, size), new(3 * size), new(batch * steps, size),
            new(3 * size, batch * steps))  # fmt: skip


def _gru_setup_context(ctx, inputs, output):
    _, hidden, hidden_weight, _ = inputs
    states, _, gates = output
    ctx.save_for_backward(hidden, hidden_weight, states, gates)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(gates)


def _gru_backward_with(backward_op, ctx, grad_states, grad_last):
    d_input_gates, d_hidden, d_hidden_bias, h_rows, dgh = backward_op(grad_states, grad_last, *ctx.saved_tensors)
    return d_input_gates, d_hidden, torch.mm(dgh, h_rows), d_hidden_bias  # d W_hh: (3 hidden, hidden)


def _gru_backward(ctx, grad_states, grad_last, _):
    return _gru_backward_with(torch.ops.panm_hf.gru_recurrence_backward, ctx, grad_states, grad_last)


def _gru_triton_backward(ctx, grad_states, grad_last, _):
    return _gru_backward_with(torch.ops.panm_hf.gru_recurrence_triton_backward, ctx, grad_states, grad_last)


def _normalize_layout(x: Tensor, batch: int) -> tuple[tuple[int, int, int, int], bool]:
    # (A, Bt, S, dim) rows of x and whether rows move from (a, b, s) to (b, a, s)
    dim = x.shape[-1]
    if batch:
        units, rows = x.shape[0], x.shape[1]
        return (units, batch, rows // batch if batch else 0, dim), True
    return (1, 1, x.numel() // dim if dim else 0, dim), False


def normalize_rows(x: Tensor, scale: Tensor | None, batch: int = 0) -> tuple[Tensor, Tensor]:
    """`scale * torch.nn.functional.normalize(x, dim=-1)` (cosine scoring's queries and keys) in one kernel.

    Args:
        x: `(..., dim)`; with `batch > 0`, unit-major address keys `(units, batch*slots, dim)`.
        scale: `()` the inverse temperature, or None for 1.
        batch: 0, or the batch size: then the output is batch-major, `(batch, units, slots, dim)` (the
            normalised `x.unflatten(1, (batch, slots)).transpose(0, 1)`, written in place of those two views).

    Returns:
        `(y, norms)`, the norms `|x|` (x's rows, x's order) kept for the backward.
    """
    library = load_library(DTYPES[x.dtype])
    x = x.contiguous()
    (units, rows_b, slots, dim), swap = _normalize_layout(x, batch)
    scale = scale.contiguous() if scale is not None else None
    shape = (batch, units, slots, dim) if swap else x.shape
    y, norms = x.new_empty(shape), x.new_empty(x.shape[:-1])
    if units * rows_b * slots * dim:
        library.normalize_forward(units, rows_b, slots, dim, int(swap), _ptr(x), _ptr(scale), _ptr(y), _ptr(norms))
    return y, norms


def _normalize_rows_fake(x, scale, batch=0):
    if batch:
        return x.new_empty(batch, x.shape[0], x.shape[1] // batch, x.shape[2]), x.new_empty(x.shape[:-1])
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1])


def normalize_rows_backward(
    grad: Tensor, x: Tensor, scale: Tensor | None, norms: Tensor, batch: int
) -> tuple[Tensor, Tensor]:
    """Gradients of `normalize_rows` w.r.t. `x` (in x's layout) and the scale (`()`, zero without one)."""
    library = load_library(DTYPES[x.dtype])
    x, grad = x.contiguous(), grad.contiguous()
    (units, rows_b, slots, dim), swap = _normalize_layout(x, batch)
    scale = scale.contiguous() if scale is not None else None
    d_x, d_scale = torch.empty_like(x), x.new_zeros(())
    if units * rows_b * slots * dim:
        library.normalize_backward(
            units, rows_b, slots, dim, int(swap), _ptr(x), _ptr(scale), _ptr(norms), _ptr(grad), _ptr(d_x),
            _ptr(d_scale),
        )  # fmt: skip
    return d_x, d_scale


def _normalize_rows_backward_fake(grad, x, scale, norms, batch):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(())


def _normalize_setup_context(ctx, inputs, output):
    x, scale, batch = inputs
    ctx.has_scale, ctx.batch = scale is not None, batch
    ctx.save_for_backward(x, scale, output[1])
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])


def _normalize_backward_with(backward_op, ctx, grad):
    if grad is None:
        return None, None, None
    d_x, d_scale = backward_op(grad, *ctx.saved_tensors, ctx.batch)
    return d_x, d_scale if ctx.has_scale else None, None


def _normalize_backward(ctx, grad, _):
    return _normalize_backward_with(torch.ops.panm_hf.normalize_rows_backward, ctx, grad)


def _normalize_triton_backward(ctx, grad, _):
    return _normalize_backward_with(torch.ops.panm_hf.normalize_rows_triton_backward, ctx, grad)


def mode2_attention(
    queries: Tensor, memory: Tensor, mask: Tensor, scale: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The Mode-2 read after the query MLP (scoring, masked softmax, weighted sum of `M`) in one kernel.

    Args:
        queries: `(batch, queries, dim)` raw queries (steps x heads).  memory: `(batch, slots, dim)` `M`, both keys
        and values.  mask: `(batch, slots)` bool.  scale: `()` the inverse temperature of cosine scoring, or None
        for dot scoring (keys divided by `sqrt(dim)`).

    Returns:
        `(values (batch, queries, dim), weights (batch, queries, slots))` and, for the backward, the unit queries,
        their norms, the prepared keys and the slots' norms.
    """
    library = load_library(DTYPES[memory.dtype])
    queries, memory = queries.contiguous(), memory.contiguous()
    mask = mask.to(torch.bool).contiguous()
    scale = scale.contiguous() if scale is not None else None
    batch, num_queries, dim = queries.shape
    slots = memory.shape[1]
    new = functools.partial(torch.empty, dtype=memory.dtype, device=memory.device)
    outputs = (new(batch, num_queries, dim), new(batch, num_queries, slots), new(batch, num_queries, dim),
               new(batch, num_queries), new(batch, slots, dim), new(batch, slots))  # fmt: skip
    library.attention_forward(
        batch, num_queries, slots, dim, int(scale is not None), _ptr(scale), _ptr(queries), _ptr(memory), _ptr(mask),
        *map(_ptr, outputs),
    )  # fmt: skip
    return outputs


def _mode2_attention_fake(queries, memory, mask, scale):
    (batch, num_queries, dim), slots = queries.shape, memory.shape[1]
    new = memory.new_empty
    return (new(batch, num_queries, dim), new(batch, num_queries, slots), new(batch, num_queries, dim),
            new(batch, num_queries), new(batch, slots, dim), new(batch, slots))  # fmt: skip


def mode2_attention_backward(
    grad_values: Tensor | None, grad_weights: Tensor | None, queries: Tensor, memory: Tensor, mask: Tensor,
    scale: Tensor | None, weights: Tensor, query_units: Tensor, query_norms: Tensor, keys: Tensor, key_norms: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of `mode2_attention` w.r.t. the queries, `M` and the scale (`()`, zero for dot scoring)."""
    library = load_library(DTYPES[memory.dtype])
    queries, memory, mask = queries.contiguous(), memory.contiguous(), mask.to(torch.bool).contiguous()
    grad_values = grad_values.contiguous() if grad_values is not None else torch.zeros_like(queries)
    grad_weights = grad_weights.contiguous() if grad_weights is not None else None
    scale = scale.contiguous() if scale is not None else None
    batch, num_queries, dim = queries.shape
    slots = memory.shape[1]
    outputs = (torch.empty_like(queries), torch.empty_like(memory), memory.new_zeros(()))
    library.attention_backward(
        batch, num_queries, slots, dim, int(scale is not None), _ptr(scale), _ptr(queries), _ptr(memory), _ptr(mask),
        *map(_ptr, (weights, query_units, query_norms, keys, key_norms, grad_values, grad_weights)),
        *map(_ptr, outputs),
    )  # fmt: skip
    return outputs


def _mode2_attention_backward_fake(grad_values, grad_weights, queries, memory, mask, scale, weights, query_units,
                                   query_norms, keys, key_norms):  # fmt: skip
    return torch.empty_like(queries), torch.empty_like(memory), memory.new_empty(())


def _mode2_setup_context(ctx, inputs, output):
    queries, memory, mask, scale = inputs
    _, weights, *saved = output
    ctx.has_scale = scale is not None
    ctx.save_for_backward(queries, memory, mask, scale, weights, *saved)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*saved)


def _mode2_backward_with(backward_op, ctx, grad_values, grad_weights):
    if grad_values is None and grad_weights is None:
        return None, None, None, None
    d_queries, d_memory, d_scale = backward_op(grad_values, grad_weights, *ctx.saved_tensors)
    return d_queries, d_memory, None, d_scale if ctx.has_scale else None


def _mode2_backward(ctx, grad_values, grad_weights, *_):
    return _mode2_backward_with(torch.ops.panm_hf.mode2_attention_backward, ctx, grad_values, grad_weights)


def _mode2_triton_backward(ctx, grad_values, grad_weights, *_):
    return _mode2_backward_with(torch.ops.panm_hf.mode2_attention_triton_backward, ctx, grad_values, grad_weights)


def masked_pool(memory: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """`(memory * mask[..., None]).sum(1)`, divided by `mask.sum(1).clamp(min=1)` if `mean`, in one kernel.

    Args:
        memory: `(batch, slots, dim)`.  mask: `(batch, slots)` bool.  mean: mean (else sum) of the real slots.

    Returns:
        `(batch, dim)`.
    """
    library = load_library(DTYPES[memory.dtype])
    memory, mask = memory.contiguous(), mask.to(torch.bool).contiguous()
    batch, slots, dim = memory.shape
    out = memory.new_empty(batch, dim)
    library.pool_forward(batch, slots, dim, int(mean), _ptr(memory), _ptr(mask), _ptr(out))
    return out


def _masked_pool_fake(memory, mask, mean):
    return memory.new_empty(memory.shape[0], memory.shape[2])


def masked_pool_backward(grad: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """Gradient of `masked_pool` w.r.t. `memory`: `(batch, dim)` -> `(batch, slots, dim)`."""
    library = load_library(DTYPES[grad.dtype])
    grad, mask = grad.contiguous(), mask.to(torch.bool).contiguous()
    (batch, dim), slots = grad.shape, mask.shape[1]
    d_memory = grad.new_empty(batch, slots, dim)
    library.pool_backward(batch, slots, dim, int(mean), _ptr(mask), _ptr(grad), _ptr(d_memory))
    return d_memory


def _masked_pool_backward_fake(grad, mask, mean):
    return grad.new_empty(grad.shape[0], mask.shape[1], grad.shape[1])


def _pool_setup_context(ctx, inputs, output):
    _, mask, mean = inputs
    ctx.mean = mean
    ctx.save_for_backward(mask)


def _pool_backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    return torch.ops.panm_hf.masked_pool_backward(grad, mask, ctx.mean), None, None


def _pool_triton_backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    return torch.ops.panm_hf.masked_pool_triton_backward(grad, mask, ctx.mean), None, None


def _registered(name: str = "pointer_recurrence") -> bool:
    # A trust_remote_code copy of these modules may be imported beside panm_hf: register the ops once.
    try:
        getattr(torch.ops.panm_hf, name)
    except (AttributeError, RuntimeError):
        return False
    return True


if not _registered():
    for _name, _impl, _fake in (
        ("pointer_recurrence", pointer_recurrence, _pointer_recurrence_fake),
        ("pointer_recurrence_backward", pointer_recurrence_backward, _pointer_recurrence_backward_fake),
        ("gru_recurrence", gru_recurrence, _gru_recurrence_fake),
        ("gru_recurrence_backward", gru_recurrence_backward, _gru_recurrence_backward_fake),
        ("normalize_rows", normalize_rows, _normalize_rows_fake),
        ("normalize_rows_backward", normalize_rows_backward, _normalize_rows_backward_fake),
        ("mode2_attention", mode2_attention, _mode2_attention_fake),
        ("mode2_attention_backward", mode2_attention_backward, _mode2_attention_backward_fake),
        ("masked_pool", masked_pool, _masked_pool_fake),
        ("masked_pool_backward", masked_pool_backward, _masked_pool_backward_fake),
    ):
        torch.library.custom_op(f"panm_hf::{_name}", _impl, mutates_args=(), device_types="cpu").register_fake(_fake)
    torch.library.register_autograd("panm_hf::pointer_recurrence", _backward, setup_context=_setup_context)
    torch.library.register_autograd("panm_hf::gru_recurrence", _gru_backward, setup_context=_gru_setup_context)
    torch.library.register_autograd(
        "panm_hf::normalize_rows", _normalize_backward, setup_context=_normalize_setup_context
    )
    torch.library.register_autograd("panm_hf::mode2_attention", _mode2_backward, setup_context=_mode2_setup_context)
    torch.library.register_autograd("panm_hf::masked_pool", _pool_backward, setup_context=_pool_setup_context)
