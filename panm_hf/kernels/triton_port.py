"""The Pointer-Unit recurrence as Triton kernels: the C kernel's algorithm for GPUs.

One program per (sample, unit) row runs all decoding steps, forward (`pointer_forward_triton`) and backward
(`pointer_backward_triton`), with the same saved states and outputs as the C kernel (`loader.py`), so the
same custom ops can dispatch to it on CUDA (`recurrence_kernel="auto"` or `"fused"`), and
`recurrence_kernel="triton"` runs it on any device (on CPU under `TRITON_INTERPRET=1`).
Checked against the C kernel under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors; the test
suite) and against the eager loop on a GPU (`tests/test_cuda.py`, run by hand where one is lent). It
is not imported unless Triton is installed.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes

launches = 0  # Triton kernel launches in this process: benchmarks/overhead.py counts each as one op


def _launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """Launch `kernel` over `grid`: the port's one launch site, counted in `launches`. Its aten ops are
    hidden from dispatch modes (an op counter): on CUDA a launch dispatches none, and under Triton's
    interpreter the ones it runs copy the arguments through NumPy and are not the kernel's."""
    global launches
    launches += 1
    with _disable_current_modes():
        kernel[grid](*args, **kwargs)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _gru_update(p, h, hs_row, t, wi, bi, wh, bh, gate_row, H, offs_h, offs_nb, mh, wmask, BLOCK_K: tl.constexpr):
    """One row's GRU step (h = h_t, also at `hs_row + t H` to be read back in blocks): stores the gates
    r | z | n | gh_n at `gate_row` and h_{t+1} at `hs_row + (t + 1) H`, and returns h_{t+1}."""
    G = 3 * H
    gi_r = tl.sum(p[:, None] * tl.load(wi + offs_nb[:, None] * G + offs_h[None, :], mask=wmask, other=0.0), 0)
    gi_z = tl.sum(p[:, None] * tl.load(wi + offs_nb[:, None] * G + H + offs_h[None, :], mask=wmask, other=0.0), 0)
    gi_n = tl.sum(p[:, None] * tl.load(wi + offs_nb[:, None] * G + 2 * H + offs_h[None, :], mask=wmask, other=0.0),
                  0)  # fmt: skip
    gh_r = tl.load(bh + offs_h, mask=mh, other=0.0)
    gh_z = tl.load(bh + H + offs_h, mask=mh, other=0.0)
    gh_n = tl.load(bh + 2 * H + offs_h, mask=mh, other=0.0)
    for k0 in range(0, H, BLOCK_K):  # h W_h, BLOCK_K rows of W_h at a time
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < H
        hk = tl.load(hs_row + t * H + offs_k, mask=mk, other=0.0)
        block = wh + offs_k[:, None] * G + offs_h[None, :]
        bmask = mk[:, None] & mh[None, :]
        gh_r += tl.sum(hk[:, None] * tl.load(block, mask=bmask, other=0.0), 0)
        gh_z += tl.sum(hk[:, None] * tl.load(block + H, mask=bmask, other=0.0), 0)
        gh_n += tl.sum(hk[:, None] * tl.load(block + 2 * H, mask=bmask, other=0.0), 0)
    r = tl.sigmoid(gi_r + tl.load(bi + offs_h, mask=mh, other=0.0) + gh_r)
    z = tl.sigmoid(gi_z + tl.load(bi + H + offs_h, mask=mh, other=0.0) + gh_z)
    n = _tanh(gi_n + tl.load(bi + 2 * H + offs_h, mask=mh, other=0.0) + r * gh_n)
    h = (1.0 - z) * n + z * h
    tl.store(gate_row + offs_h, r, mask=mh)
    tl.store(gate_row + H + offs_h, z, mask=mh)
    tl.store(gate_row + 2 * H + offs_h, n, mask=mh)
    tl.store(gate_row + 3 * H + offs_h, gh_n, mask=mh)
    tl.store(hs_row + (t + 1) * H + offs_h, h, mask=mh)
    tl.debug_barrier()  # the next step reads h back in blocks
    return h


@triton.jit
def _address_attention(h, key, bias, ms, tau, COSINE: tl.constexpr):
    """One row's address attention: `(|h|, P)`, P the softmax of `q . K[s]` plus the mask bias over the slots."""
    norm = tl.sqrt(tl.sum(h * h, 0))
    q = h * (tau / tl.maximum(norm, 1e-12)) if COSINE else h
    scores = tl.where(ms, tl.sum(key * q[None, :], 1) + bias, float("-inf"))
    e = tl.exp(scores - tl.max(scores, 0))
    return norm, e / tl.sum(e, 0)


@triton.jit
def _pointer_forward_kernel(
    p0, h0, keys, ks_b, ks_u, bank, mask, w_i, b_i, w_h, b_h, tau_ptr,
    weights, p_final, h_final, hs, ps, gates, norms, probs,
    U, T, S, NB, H,
    COSINE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    b, u = row // U, row % U
    G = 3 * H
    offs_h, offs_s, offs_nb = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB)
    mh, ms, mnb = offs_h < H, offs_s < S, offs_nb < NB
    h = tl.load(h0 + row * H + offs_h, mask=mh, other=0.0)
    p = tl.load(p0 + row * NB + offs_nb, mask=mnb, other=0.0)
    hs_row, ps_row = hs + row * (T + 1) * H, ps + row * (T + 1) * NB
    tl.store(hs_row + offs_h, h, mask=mh)
    tl.store(ps_row + offs_nb, p, mask=mnb)
    key = tl.load(keys + b * ks_b + u * ks_u + offs_s[:, None] * H + offs_h[None, :],
                  mask=ms[:, None] & mh[None, :], other=0.0)  # (slots, hidden)  # fmt: skip
    addr = tl.load(bank + b * S * NB + offs_s[:, None] * NB + offs_nb[None, :],
                   mask=ms[:, None] & mnb[None, :], other=0.0)  # (slots, bits)  # fmt: skip
    real = tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0
    bias = tl.where(real, 0.0, -65504.0)
    tau = tl.load(tau_ptr) if COSINE else 1.0
    wi, bi, wh, bh = w_i + u * NB * G, b_i + u * G, w_h + u * H * G, b_h + u * G
    wmask = mnb[:, None] & mh[None, :]
    for t in range(T):
        h = _gru_update(p, h, hs_row, t, wi, bi, wh, bh, gates + (row * T + t) * 4 * H, H, offs_h, offs_nb, mh, wmask,
                        BLOCK_K)  # fmt: skip
        norm, prob = _address_attention(h, key, bias, ms, tau, COSINE)
        tl.store(norms + row * T + t, norm)
        tl.store(probs + (row * T + t) * S + offs_s, prob, mask=ms)
        w = tl.where(real, prob, 0.0)
        tl.store(weights + ((b * T + t) * U + u) * S + offs_s, w, mask=ms)
        p = tl.sum(w[:, None] * addr, 0)
        tl.store(ps_row + (t + 1) * NB + offs_nb, p, mask=mnb)
    tl.store(h_final + row * H + offs_h, h, mask=mh)
    tl.store(p_final + row * NB + offs_nb, p, mask=mnb)


@triton.jit
def _store_weight_factors(dgi_rows, dgh_rows, h_rows, p_rows, ps_row, dar, daz, dan, r, h_prev,
                          u, b, t, B, T, H, NB, offs_h, offs_nb, mh, mnb):  # fmt: skip
    """The backward's per-(row, step) factors of the GRU weights' gradients (one GEMM each afterwards)."""
    out = (u * B * T + b * T + t) * 3 * H  # row (b, t) of unit u in the (units, batch*steps, 3 hidden) factors
    tl.store(dgi_rows + out + offs_h, dar, mask=mh)
    tl.store(dgi_rows + out + H + offs_h, daz, mask=mh)
    tl.store(dgi_rows + out + 2 * H + offs_h, dan, mask=mh)
    tl.store(dgh_rows + out + offs_h, dar, mask=mh)
    tl.store(dgh_rows + out + H + offs_h, daz, mask=mh)
    tl.store(dgh_rows + out + 2 * H + offs_h, dan * r, mask=mh)
    tl.store(h_rows + (u * H + offs_h) * (B * T) + b * T + t, h_prev, mask=mh)  # (U, H, B T)
    p_prev = tl.load(ps_row + t * NB + offs_nb, mask=mnb, other=0.0)
    tl.store(p_rows + (u * NB + offs_nb) * (B * T) + b * T + t, p_prev, mask=mnb)  # (U, NB, B T)


@triton.jit
def _store_w_h_product(wh, scratch, dar, daz, dgh_n, H, G, offs_h, mh, BLOCK_K: tl.constexpr):
    """`W_h dgh` into `scratch`, BLOCK_K entries at a time (the backward's dh_prev = z dh + W_h dgh)."""
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < H
        block = wh + offs_k[:, None] * G + offs_h[None, :]
        bmask = mk[:, None] & mh[None, :]
        part = (tl.sum(tl.load(block, mask=bmask, other=0.0) * dar[None, :], 1)
                + tl.sum(tl.load(block + H, mask=bmask, other=0.0) * daz[None, :], 1)
                + tl.sum(tl.load(block + 2 * H, mask=bmask, other=0.0) * dgh_n[None, :], 1))  # fmt: skip
        tl.store(scratch + offs_k, part, mask=mk)


@triton.jit
def _attention_backward(dP, prob, key, hn, norm, tau, dh, COSINE: tl.constexpr):
    """Backward of `_address_attention` for one row from dP = dL/dP: `(dL/dK, dL/dtau, dh + dL/dh')`."""
    ds = prob * (dP - tl.sum(prob * dP, 0))  # softmax backward
    denom = tl.maximum(norm, 1e-12)
    q = hn * (tau / denom) if COSINE else hn
    dq = tl.sum(ds[:, None] * key, 0)
    d_key = ds[:, None] * q[None, :]
    if COSINE:  # q = tau h / max(|h|, eps)
        d_tau = tl.sum(dq * hn, 0) / denom
        du = tau * dq
        dh += tl.where(norm > 1e-12, (du - hn / denom * (tau * d_tau)) / norm, du / 1e-12)
    else:
        d_tau = 0.0 * norm
        dh += dq
    return d_key, d_tau, dh


@triton.jit
def _gru_backward(dh, row, u, b, t, B, T, H, NB, hs_row, ps_row, gates, wi, wh, dgi_rows, dgh_rows, h_rows, p_rows,
                  dh_scratch, offs_h, offs_nb, mh, mnb, BLOCK_K: tl.constexpr):  # fmt: skip
    """Backward of `_gru_update` for one row from dh = dL/dh_{t+1}: stores the weight factors, returns
    `(dL/dh_t, dL/dp_t)`."""
    G = 3 * H
    gate_row = gates + (row * T + t) * 4 * H
    r = tl.load(gate_row + offs_h, mask=mh, other=0.0)
    z = tl.load(gate_row + H + offs_h, mask=mh, other=0.0)
    n = tl.load(gate_row + 2 * H + offs_h, mask=mh, other=0.0)
    ghn = tl.load(gate_row + 3 * H + offs_h, mask=mh, other=0.0)
    h_prev = tl.load(hs_row + t * H + offs_h, mask=mh, other=0.0)
    dan = dh * (1.0 - z) * (1.0 - n * n)
    daz = dh * (h_prev - n) * z * (1.0 - z)
    dar = dan * ghn * r * (1.0 - r)
    _store_weight_factors(dgi_rows, dgh_rows, h_rows, p_rows, ps_row, dar, daz, dan, r, h_prev,
                          u, b, t, B, T, H, NB, offs_h, offs_nb, mh, mnb)  # fmt: skip
    wmask = mnb[:, None] & mh[None, :]
    block_i = wi + offs_nb[:, None] * G + offs_h[None, :]
    dp = (tl.sum(tl.load(block_i, mask=wmask, other=0.0) * dar[None, :], 1)
          + tl.sum(tl.load(block_i + H, mask=wmask, other=0.0) * daz[None, :], 1)
          + tl.sum(tl.load(block_i + 2 * H, mask=wmask, other=0.0) * dan[None, :], 1))  # fmt: skip
    _store_w_h_product(wh, dh_scratch + row * H, dar, daz, dan * r, H, G, offs_h, mh, BLOCK_K)
    tl.debug_barrier()
    dh = dh * z + tl.load(dh_scratch + row * H + offs_h, mask=mh, other=0.0)
    tl.debug_barrier()
    return dh, dp


@triton.jit
def _pointer_backward_kernel(
    keys, ks_b, ks_u, bank, mask, w_i, w_h, tau_ptr, hs, ps, gates, norms, probs,
    g_weights, g_p_final, g_h_final,
    d_p0, d_h0, d_keys, d_bank_rows, d_tau_rows, h_rows, p_rows, dgh_rows, dgi_rows,
    U, B, T, S, NB, H,
    COSINE: tl.constexpr, HAS_G_WEIGHTS: tl.constexpr, HAS_G_P: tl.constexpr, HAS_G_H: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`d_h0` doubles as the scratch of `W_h dgh` (each program's own row; the result is stored after the loop).
    An absent output gradient (HAS_G_* False) reads as zeros, with no zeros tensor allocated."""
    row = tl.program_id(0)
    b, u = row // U, row % U
    G = 3 * H
    offs_h, offs_s, offs_nb = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB)
    mh, ms, mnb = offs_h < H, offs_s < S, offs_nb < NB
    key = tl.load(keys + b * ks_b + u * ks_u + offs_s[:, None] * H + offs_h[None, :],
                  mask=ms[:, None] & mh[None, :], other=0.0)  # fmt: skip
    addr = tl.load(bank + b * S * NB + offs_s[:, None] * NB + offs_nb[None, :],
                   mask=ms[:, None] & mnb[None, :], other=0.0)  # fmt: skip
    real = tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0
    tau = tl.load(tau_ptr) if COSINE else 1.0
    dh, dp = tl.zeros((BLOCK_H,), dtype=key.dtype), tl.zeros((BLOCK_NB,), dtype=key.dtype)
    if HAS_G_H:
        dh += tl.load(g_h_final + row * H + offs_h, mask=mh, other=0.0)
    if HAS_G_P:
        dp += tl.load(g_p_final + row * NB + offs_nb, mask=mnb, other=0.0)
    d_key = tl.zeros((BLOCK_S, BLOCK_H), dtype=key.dtype)
    d_addr = tl.zeros((BLOCK_S, BLOCK_NB), dtype=key.dtype)
    d_tau = tl.sum(tl.zeros((BLOCK_H,), dtype=key.dtype), 0)
    hs_row, ps_row = hs + row * (T + 1) * H, ps + row * (T + 1) * NB
    wi, wh = w_i + u * NB * G, w_h + u * H * G
    for step in range(T):
        t = T - 1 - step
        prob = tl.load(probs + (row * T + t) * S + offs_s, mask=ms, other=0.0)
        w = tl.where(real, prob, 0.0)
        d_addr += w[:, None] * dp[None, :]  # through p_t = sum_s w[s] A[s]
        dw = tl.sum(addr * dp[None, :], 1)
        if HAS_G_WEIGHTS:
            dw += tl.load(g_weights + ((b * T + t) * U + u) * S + offs_s, mask=ms, other=0.0)
        hn = tl.load(hs_row + (t + 1) * H + offs_h, mask=mh, other=0.0)
        norm = tl.load(norms + row * T + t)
        step_key, step_tau, dh = _attention_backward(tl.where(real, dw, 0.0), prob, key, hn, norm, tau, dh, COSINE)
        d_key += step_key
        d_tau += step_tau
        dh, dp = _gru_backward(dh, row, u, b, t, B, T, H, NB, hs_row, ps_row, gates, wi, wh, dgi_rows, dgh_rows,
                               h_rows, p_rows, d_h0, offs_h, offs_nb, mh, mnb, BLOCK_K)  # fmt: skip
    tl.store(d_h0 + row * H + offs_h, dh, mask=mh)
    tl.store(d_p0 + row * NB + offs_nb, dp, mask=mnb)
    tl.store(d_keys + row * S * H + offs_s[:, None] * H + offs_h[None, :], d_key, mask=ms[:, None] & mh[None, :])
    tl.store(d_bank_rows + row * S * NB + offs_s[:, None] * NB + offs_nb[None, :], d_addr,
             mask=ms[:, None] & mnb[None, :])  # fmt: skip
    tl.store(d_tau_rows + row, d_tau)


def _blocks(size: int, slots: int, bits: int) -> dict:
    block_h = triton.next_power_of_2(size)
    return dict(BLOCK_H=block_h, BLOCK_S=triton.next_power_of_2(slots), BLOCK_NB=triton.next_power_of_2(bits),
                BLOCK_K=min(block_h, 32))  # fmt: skip


def pointer_forward_triton(pointers, hidden, keys, bank, mask, input_weight, input_bias, hidden_weight, hidden_bias,
                           inverse_temperature, num_steps):  # fmt: skip
    """Same arguments and outputs as `loader.pointer_recurrence`."""
    batch, units, slots, size = keys.shape
    bits = bank.shape[-1]
    if keys.stride(3) != 1 or keys.stride(2) != size:
        keys = keys.contiguous()
    args = [t.contiguous() for t in (pointers, hidden)]
    params = [t.contiguous() for t in (bank, mask, input_weight, input_bias, hidden_weight,
                                       hidden_bias)]  # fmt: skip
    cosine = inverse_temperature is not None
    tau = inverse_temperature if cosine else keys  # the scale's 0-d tensor (unread for dot scoring)
    new = keys.new_empty
    outputs = (new(batch, num_steps, units, slots), new(batch, units, bits), new(batch, units, size),
               new(batch, units, num_steps + 1, size), new(batch, units, num_steps + 1, bits),
               new(batch, units, num_steps, 4 * size), new(batch, units, num_steps),
               new(batch, units, num_steps, slots))  # fmt: skip
    _launch(
        _pointer_forward_kernel, (batch * units,), *args, keys, keys.stride(0), keys.stride(1), *params, tau, *outputs,
        units, num_steps, slots, bits, size, COSINE=cosine, **_blocks(size, slots, bits),
    )  # fmt: skip
    return outputs


def pointer_backward_triton(grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight, hidden_weight,
                            inverse_temperature, hidden_states, pointer_states, gates, norms, probs):  # fmt: skip
    """Same arguments and outputs as `loader.pointer_recurrence_backward`. The kernel writes
    per-row pieces; the bank, bias and temperature gradients are their sums over rows (three reductions)."""
    batch, units, slots, size = keys.shape
    bits, steps = bank.shape[-1], probs.shape[2]
    if keys.stride(3) != 1 or keys.stride(2) != size:
        keys = keys.contiguous()
    present = [g is not None for g in (grad_weights, grad_pointers, grad_hidden)]
    grads = [g.contiguous() if g is not None else keys for g in (grad_weights, grad_pointers, grad_hidden)]
    cosine = inverse_temperature is not None
    tau = inverse_temperature if cosine else keys  # the scale's 0-d tensor (unread for dot scoring)
    new, rows = keys.new_empty, batch * steps
    d_p0, d_h0, d_keys = new(batch, units, bits), new(batch, units, size), new(batch, units, slots, size)
    d_bank_rows, d_tau_rows = new(batch, units, slots, bits), new(batch * units)
    factors = (new(units, size, rows), new(units, bits, rows), new(units, rows, 3 * size), new(units, rows, 3 * size))
    _launch(
        _pointer_backward_kernel, (batch * units,),
        keys, keys.stride(0), keys.stride(1), bank.contiguous(), mask.contiguous(),
        input_weight.contiguous(), hidden_weight.contiguous(), tau, hidden_states, pointer_states, gates, norms,
        probs, *grads, d_p0, d_h0, d_keys, d_bank_rows, d_tau_rows, *factors,
        units, batch, steps, slots, bits, size, COSINE=cosine, HAS_G_WEIGHTS=present[0], HAS_G_P=present[1],
        HAS_G_H=present[2], **_blocks(size, slots, bits),
    )  # fmt: skip
    h_rows, p_rows, dgh, dgi = factors
    return (d_p0, d_h0, d_keys, d_bank_rows.sum(1), dgi.sum(1), dgh.sum(1), d_tau_rows.sum(), h_rows, p_rows, dgh, dgi)
