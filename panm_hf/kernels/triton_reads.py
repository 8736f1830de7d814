"""PANM's per-call read ops as Triton kernels: the C kernels' algorithms (`source.py`) for GPUs.

Three ops, each one launch forward and one backward, with the same arguments and outputs as their C
custom ops (`loader.py`), so that `register_triton` can make them the CUDA kernels of those ops and
`recurrence_kernel="triton"` can run them on any device (on CPU under `TRITON_INTERPRET=1`):

- `normalize_rows`: cosine scoring's `scale * normalize(x)` (`BLOCK_R` rows per program), optionally writing
  the Pointer Units' unit-major address keys batch-major;
- `mode2_attention`: the Mode-2 read after its query MLP, and the decoder content read (one program per
  sample: the keys are normalised once and `dM` is summed over the queries without atomics);
- `masked_pool`: `h^c_0`'s masked mean or sum of `M` (one program per sample, `BLOCK_S` slots at a time).

Reductions across programs (the scale's gradient) are written per program and summed by the wrapper, so
the results do not depend on the launch order. The slot mask is read as it comes (bool, or any integer dtype:
non-zero is a real slot), with no conversion op. Checked against the C kernels under Triton's interpreter
(`tests/test_triton_reads.py`); no GPU has run them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .loader import _normalize_layout
from .triton_port import _launch

EPS = tl.constexpr(1e-12)  # the C kernels' and torch's normalize eps
BLOCK_R = 16  # rows per normalize program


@triton.jit
def _out_rows(rows, A, Bt, S, SWAP: tl.constexpr):
    """Row (a, b, s) of x is row (b, a, s) of y when SWAP (unit-major keys written batch-major)."""
    if SWAP:
        return ((rows // S) % Bt * A + rows // (Bt * S)) * S + rows % S
    return rows


@triton.jit
def _normalize_forward_kernel(x, scale, y, norms, R, A, Bt, S, D, HAS_SCALE: tl.constexpr, SWAP: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mr, md = rows < R, offs_d < D
    tile = mr[:, None] & md[None, :]
    xr = tl.load(x + rows[:, None] * D + offs_d[None, :], mask=tile, other=0.0)  # (rows, dim)
    n = tl.sqrt(tl.sum(xr * xr, 1))
    s = tl.load(scale) if HAS_SCALE else 1.0
    out = _out_rows(rows, A, Bt, S, SWAP)
    tl.store(y + out[:, None] * D + offs_d[None, :], xr / tl.maximum(n, EPS)[:, None] * s, mask=tile)
    tl.store(norms + rows, n, mask=mr)


@triton.jit
def _normalize_backward_kernel(x, scale, norms, dy, dx, d_scale_parts, R, A, Bt, S, D, HAS_SCALE: tl.constexpr,
                               SWAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    program = tl.program_id(0)
    rows = program * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mr, md = rows < R, offs_d < D
    tile = mr[:, None] & md[None, :]
    xr = tl.load(x + rows[:, None] * D + offs_d[None, :], mask=tile, other=0.0)
    out = _out_rows(rows, A, Bt, S, SWAP)
    g = tl.load(dy + out[:, None] * D + offs_d[None, :], mask=tile, other=0.0)
    n = tl.load(norms + rows, mask=mr, other=1.0)
    s = tl.load(scale) if HAS_SCALE else 1.0
    d = tl.maximum(n, EPS)
    xh = xr / d[:, None]
    xg = tl.sum(xh * g * s, 1)
    tl.store(d_scale_parts + program, tl.sum(tl.sum(xh * g, 1), 0))
    grad = tl.where((n >= EPS)[:, None], (g * s - xh * xg[:, None]) / d[:, None], g * s / EPS)
    tl.store(dx + rows[:, None] * D + offs_d[None, :], grad, mask=tile)


def normalize_rows_triton(x: Tensor, scale: Tensor | None, batch: int = 0) -> tuple[Tensor, Tensor]:
    """Same arguments and outputs as `loader.normalize_rows`."""
    x = x.contiguous()
    (units, rows_b, slots, dim), _ = _normalize_layout(x, batch)
    shape = (batch, units, slots, dim) if batch else x.shape
    y, norms = x.new_empty(shape), x.new_empty(x.shape[:-1])
    rows = units * rows_b * slots
    if rows * dim:
        _launch(
            _normalize_forward_kernel, (triton.cdiv(rows, BLOCK_R),), x, scale if scale is not None else x, y, norms,
            rows, units, rows_b, slots, dim, HAS_SCALE=scale is not None, SWAP=bool(batch), BLOCK_R=BLOCK_R,
            BLOCK_D=triton.next_power_of_2(dim),
        )  # fmt: skip
    return y, norms


def normalize_rows_backward_triton(
    grad: Tensor, x: Tensor, scale: Tensor | None, norms: Tensor, batch: int
) -> tuple[Tensor, Tensor]:
    """Same arguments and outputs as `loader.normalize_rows_backward`."""
    x, grad = x.contiguous(), grad.contiguous()
    (units, rows_b, slots, dim), _ = _normalize_layout(x, batch)
    rows = units * rows_b * slots
    if not rows * dim:
        return torch.zeros_like(x), x.new_zeros(())
    programs = triton.cdiv(rows, BLOCK_R)
    d_x, parts = torch.empty_like(x), x.new_empty(programs)
    _launch(
        _normalize_backward_kernel, (programs,), x, scale if scale is not None else x, norms, grad, d_x, parts,
        rows, units, rows_b, slots, dim, HAS_SCALE=scale is not None, SWAP=bool(batch), BLOCK_R=BLOCK_R,
        BLOCK_D=triton.next_power_of_2(dim),
    )  # fmt: skip
    return d_x, parts.sum()


@triton.jit
def _mode2_forward_kernel(q, mem, mask, scale, values, weights, q_unit, q_norms, k_unit, k_norms, Q, S, D,
                          COSINE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    ms, md = offs_s < S, offs_d < D
    tile = ms[:, None] & md[None, :]
    slot_rows = (b * S + offs_s)[:, None] * D + offs_d[None, :]
    m = tl.load(mem + slot_rows, mask=tile, other=0.0)  # (slots, dim): keys and values
    real = (tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0) & ms
    kn = tl.sqrt(tl.sum(m * m, 1))
    if COSINE:
        key = m / tl.maximum(kn, EPS)[:, None]
    else:
        key = m / tl.sqrt(tl.full((), D, m.dtype))
    tl.store(k_unit + slot_rows, key, mask=tile)
    tl.store(k_norms + b * S + offs_s, kn, mask=ms)
    tau = tl.load(scale) if COSINE else 1.0
    any_real = tl.max(real.to(tl.int32), 0) > 0
    for i in range(Q):
        row = b * Q + i
        x = tl.load(q + row * D + offs_d, mask=md, other=0.0)
        n = tl.sqrt(tl.sum(x * x, 0))
        u = x / tl.maximum(n, EPS)
        qn = u * tau if COSINE else x
        scores = tl.where(real, tl.sum(key * qn[None, :], 1), float("-inf"))
        top = tl.where(any_real, tl.max(scores, 0), 0.0)
        e = tl.where(real, tl.exp(scores - top), 0.0)
        total = tl.sum(e, 0)
        w = e / tl.where(total > 0, total, 1.0)  # a row with no real slot reads nothing (w = 0, v = 0)
        tl.store(q_unit + row * D + offs_d, u, mask=md)
        tl.store(q_norms + row, n)
        tl.store(weights + row * S + offs_s, w, mask=ms)
        tl.store(values + row * D + offs_d, tl.sum(w[:, None] * m, 0), mask=md)


@triton.jit
def _mode2_backward_kernel(q, mem, mask, scale, weights, q_unit, q_norms, k_unit, k_norms, d_values, d_weights,
                           d_q, d_mem, d_tau_parts, Q, S, D, COSINE: tl.constexpr, HAS_DW: tl.constexpr,
                           BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    ms, md = offs_s < S, offs_d < D
    tile = ms[:, None] & md[None, :]
    slot_rows = (b * S + offs_s)[:, None] * D + offs_d[None, :]
    m = tl.load(mem + slot_rows, mask=tile, other=0.0)
    key = tl.load(k_unit + slot_rows, mask=tile, other=0.0)
    real = (tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0) & ms
    tau = tl.load(scale) if COSINE else 1.0
    dm = tl.zeros((BLOCK_S, BLOCK_D), dtype=m.dtype)
    dk = tl.zeros((BLOCK_S, BLOCK_D), dtype=m.dtype)
    d_tau = tl.sum(tl.zeros((BLOCK_D,), dtype=m.dtype), 0)
    for i in range(Q):
        row = b * Q + i
        w = tl.load(weights + row * S + offs_s, mask=ms, other=0.0)
        dv = tl.load(d_values + row * D + offs_d, mask=md, other=0.0)
        ds = tl.sum(m * dv[None, :], 1)
        if HAS_DW:
            ds += tl.load(d_weights + row * S + offs_s, mask=ms, other=0.0)
        ds = tl.where(real, ds, 0.0)
        g = tl.where(real, w * (ds - tl.sum(w * ds, 0)), 0.0)  # softmax backward
        dm += w[:, None] * dv[None, :]
        dqn = tl.sum(g[:, None] * key, 0)
        if COSINE:
            u = tl.load(q_unit + row * D + offs_d, mask=md, other=0.0)
            n = tl.load(q_norms + row)
            dk += g[:, None] * (u * tau)[None, :]
            d_tau += tl.sum(dqn * u, 0)
            ug = tl.sum(u * dqn * tau, 0)
            dx = tl.where(n >= EPS, (dqn * tau - u * ug) / tl.maximum(n, EPS), dqn * tau / EPS)
        else:
            dk += g[:, None] * tl.load(q + row * D + offs_d, mask=md, other=0.0)[None, :]
            dx = dqn
        tl.store(d_q + row * D + offs_d, dx, mask=md)
    if COSINE:  # through K[s] = M[s] / max(|M[s]|, eps)
        kn = tl.load(k_norms + b * S + offs_s, mask=ms, other=1.0)
        kg = tl.sum(key * dk, 1)
        dm += tl.where((kn >= EPS)[:, None], (dk - key * kg[:, None]) / tl.maximum(kn, EPS)[:, None], dk / EPS)
    else:
        dm += dk / tl.sqrt(tl.full((), D, m.dtype))
    tl.store(d_mem + slot_rows, dm, mask=tile)
    tl.store(d_tau_parts + b, d_tau)


def _mode2_blocks(slots: int, dim: int) -> dict:
    return dict(BLOCK_S=triton.next_power_of_2(max(slots, 1)), BLOCK_D=triton.next_power_of_2(max(dim, 1)))


def mode2_attention_triton(
    queries: Tensor, memory: Tensor, mask: Tensor, scale: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Same arguments and outputs as `loader.mode2_attention`."""
    queries, memory, mask = queries.contiguous(), memory.contiguous(), mask.contiguous()
    batch, num_queries, dim = queries.shape
    slots = memory.shape[1]
    new = memory.new_empty
    outputs = (new(batch, num_queries, dim), new(batch, num_queries, slots), new(batch, num_queries, dim),
               new(batch, num_queries), new(batch, slots, dim), new(batch, slots))  # fmt: skip
    if batch:
        _launch(
            _mode2_forward_kernel, (batch,), queries, memory, mask, scale if scale is not None else memory, *outputs,
            num_queries, slots, dim, COSINE=scale is not None, **_mode2_blocks(slots, dim),
        )  # fmt: skip
    return outputs


def mode2_attention_backward_triton(
    grad_values: Tensor | None,
    grad_weights: Tensor | None,
    queries: Tensor,
    memory: Tensor,
    mask: Tensor,
    scale: Tensor | None,
    weights: Tensor,
    query_units: Tensor,
    query_norms: Tensor,
    keys: Tensor,
    key_norms: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Same arguments and outputs as `loader.mode2_attention_backward`."""
    queries, memory, mask = queries.contiguous(), memory.contiguous(), mask.contiguous()
    grad_values = grad_values.contiguous() if grad_values is not None else torch.zeros_like(queries)
    batch, num_queries, dim = queries.shape
    slots = memory.shape[1]
    d_queries, d_memory, parts = torch.empty_like(queries), torch.empty_like(memory), memory.new_empty(batch)
    if batch:
        _launch(
            _mode2_backward_kernel, (batch,), queries, memory, mask, scale if scale is not None else memory, weights,
            query_units, query_norms, keys, key_norms, grad_values,
            grad_weights.contiguous() if grad_weights is not None else weights, d_queries, d_memory, parts,
            num_queries, slots, dim, COSINE=scale is not None, HAS_DW=grad_weights is not None,
            **_mode2_blocks(slots, dim),
        )  # fmt: skip
    return d_queries, d_memory, parts.sum()


@triton.jit
def _pool_forward_kernel(mem, mask, out, S, D, MEAN: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    md = offs_d < D
    total = tl.zeros((BLOCK_D,), dtype=out.dtype.element_ty)
    count = tl.sum(tl.zeros((BLOCK_S,), dtype=tl.float32), 0)
    for s0 in range(0, S, BLOCK_S):  # BLOCK_S slots at a time
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ms = offs_s < S
        real = (tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0) & ms
        m = tl.load(mem + (b * S + offs_s)[:, None] * D + offs_d[None, :], mask=real[:, None] & md[None, :], other=0.0)
        total += tl.sum(m, 0)
        count += tl.sum(real.to(tl.float32), 0)
    if MEAN:
        total = total / tl.maximum(count, 1.0)
    tl.store(out + b * D + offs_d, total, mask=md)


@triton.jit
def _pool_backward_kernel(mask, d_out, d_mem, S, D, MEAN: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_D: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    md = offs_d < D
    g = tl.load(d_out + b * D + offs_d, mask=md, other=0.0)
    if MEAN:
        count = tl.sum(tl.zeros((BLOCK_S,), dtype=tl.float32), 0)
        for s0 in range(0, S, BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            ms = offs_s < S
            count += tl.sum(((tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0) & ms).to(tl.float32), 0)
        g = g / tl.maximum(count, 1.0)
    for s0 in range(0, S, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ms = offs_s < S
        real = (tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0) & ms
        tl.store(d_mem + (b * S + offs_s)[:, None] * D + offs_d[None, :], tl.where(real[:, None], g[None, :], 0.0),
                 mask=ms[:, None] & md[None, :])  # fmt: skip


def _pool_blocks(dim: int) -> dict:
    return dict(BLOCK_S=32, BLOCK_D=triton.next_power_of_2(max(dim, 1)))


def masked_pool_triton(memory: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """Same arguments and output as `loader.masked_pool`."""
    memory, mask = memory.contiguous(), mask.contiguous()
    batch, slots, dim = memory.shape
    out = memory.new_empty(batch, dim)
    if batch * dim:
        _launch(_pool_forward_kernel, (batch,), memory, mask, out, slots, dim, MEAN=mean, **_pool_blocks(dim))
    return out


def masked_pool_backward_triton(grad: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """Same arguments and output as `loader.masked_pool_backward`."""
    grad, mask = grad.contiguous(), mask.contiguous()
    (batch, dim), slots = grad.shape, mask.shape[1]
    d_memory = grad.new_empty(batch, slots, dim)
    if batch * dim * slots:
        _launch(_pool_backward_kernel, (batch,), mask, grad, d_memory, slots, dim, MEAN=mean, **_pool_blocks(dim))
    return d_memory


# each op's (forward, backward) port, as `loader.register_triton` registers them
PORTS = {
    "normalize_rows": (normalize_rows_triton, normalize_rows_backward_triton),
    "mode2_attention": (mode2_attention_triton, mode2_attention_backward_triton),
    "masked_pool": (masked_pool_triton, masked_pool_backward_triton),
}
