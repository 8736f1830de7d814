"""The shift Pointer-Unit recurrence (`pointer_update="shift"`) as Triton kernels: the C kernel's algorithm for GPUs.

One program per (sample, unit) row runs all decoding steps, forward (`shift_forward_triton`) and backward
(`shift_backward_triton`), with the same outputs and saved states as the C kernel (`shift_recurrence.py`); the GRU
update and the address attention are `triton_port`'s, shared with the `"attention"` port. Per step, after the
attention `P`: the moves' softmax `c` from `h^a_t`, the mixture of `w_{t-1}` moved by each step `K..-K` (read back
from memory at the moved offsets: `w_0`, then the previous step's output) with `P`, and the sharpening. Checked
against the C kernel under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors; the `triton` test stage).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_port import _address_attention, _attention_backward, _blocks, _gru_backward, _gru_update, _launch


@triton.jit
def _softplus(x):
    """`log(1 + e^x)`, `x` past torch's threshold 20; `log1p`'s accuracy for small `e^x` (Goldberg's formula)."""
    e = tl.exp(tl.minimum(x, 20.0))
    one = 1.0 + e
    return tl.where(x > 20.0, x, tl.where(one == 1.0, e, tl.log(one) * e / (one - 1.0)))


@triton.jit
def _moved(first_row, prev_row, t, src, S, mask_row, MASKED: tl.constexpr):
    """`w_{t-1}[src]`, 0 outside `[0, S)`: `w_0` at step 0, else the previous step's weights (its sharpened softmax,
    masked here, when MASKED)."""
    inside = (src >= 0) & (src < S)
    first = inside & (src * 0 + t == 0)  # t as a vector: a scalar test does not combine with a mask everywhere
    later = inside & (src * 0 + t > 0)
    if MASKED:
        later = later & (tl.load(mask_row + src, mask=inside, other=0) != 0)
    return tl.load(first_row + src, mask=first, other=0.0) + tl.load(prev_row + src, mask=later, other=0.0)


@triton.jit
def _pick(values, offs_m, i):
    """`values[i]` of a vector over the moves."""
    return tl.sum(tl.where(offs_m == i, values, 0.0), 0)


@triton.jit
def _shift_update(h, prob, head, head_bias, gamma, first_row, prev_row, t, S, mask_row, bias, ms, offs_s, offs_m, mm,
                  tiny, REACH: tl.constexpr):  # fmt: skip
    """One row's shift update: `(c, mixed, Q)`, the moves' softmax, the mixture and its sharpened softmax."""
    M = 2 * REACH + 2
    logits = tl.where(mm, tl.sum(h[:, None] * head, 0) + head_bias, float("-inf"))
    e = tl.exp(logits - tl.max(logits, 0))
    c = e / tl.sum(e, 0)
    mixed = _pick(c, offs_m, M - 1) * prob
    for i in tl.static_range(2 * REACH + 1):  # step K - i
        mixed += _pick(c, offs_m, i) * _moved(first_row, prev_row, t, offs_s - (REACH - i), S, mask_row, False)
    z = tl.where(ms, bias + gamma * tl.log(tl.maximum(mixed, tiny)), float("-inf"))
    e = tl.exp(z - tl.max(z, 0))
    return c, mixed, e / tl.sum(e, 0)


@triton.jit
def _shift_forward_kernel(
    p0, h0, keys, ks_b, ks_u, bank, mask, w_i, b_i, w_h, b_h, tau_ptr, w0, head_w, head_b, sharpening,
    weights, p_final, h_final, hs, ps, gates, norms, probs, moves, mixed, sharp,
    U, T, S, NB, H,
    COSINE: tl.constexpr, REACH: tl.constexpr, IS_DOUBLE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    b, u = row // U, row % U
    G, M = 3 * H, 2 * REACH + 2
    offs_h, offs_s, offs_nb, offs_m = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB), \
        tl.arange(0, BLOCK_M)  # fmt: skip
    mh, ms, mnb, mm = offs_h < H, offs_s < S, offs_nb < NB, offs_m < M
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
    head = tl.load(head_w + u * H * M + offs_h[:, None] * M + offs_m[None, :], mask=mh[:, None] & mm[None, :],
                   other=0.0)  # (hidden, moves)  # fmt: skip
    head_bias = tl.load(head_b + u * M + offs_m, mask=mm, other=0.0)
    gamma = 1.0 + _softplus(tl.load(sharpening + u))
    tiny = 2.2250738585072014e-308 if IS_DOUBLE else 1.1754943508222875e-38  # torch.finfo(dtype).tiny
    wi, bi, wh, bh = w_i + u * NB * G, b_i + u * G, w_h + u * H * G, b_h + u * G
    wmask = mnb[:, None] & mh[None, :]
    for t in range(T):
        step = row * T + t
        h = _gru_update(p, h, hs_row, t, wi, bi, wh, bh, gates + step * 4 * H, H, offs_h, offs_nb, mh, wmask, BLOCK_K)
        norm, prob = _address_attention(h, key, bias, ms, tau, COSINE)
        tl.store(norms + step, norm)
        tl.store(probs + step * S + offs_s, prob, mask=ms)
        out_row = weights + ((b * T + t) * U + u) * S
        c, mix, q = _shift_update(h, prob, head, head_bias, gamma, w0 + row * S, out_row - U * S, t, S, mask + b * S,
                                  bias, ms, offs_s, offs_m, mm, tiny, REACH)  # fmt: skip
        tl.store(moves + step * M + offs_m, c, mask=mm)
        tl.store(mixed + step * S + offs_s, mix, mask=ms)
        tl.store(sharp + step * S + offs_s, q, mask=ms)
        w = tl.where(real, q, 0.0)
        tl.store(out_row + offs_s, w, mask=ms)
        tl.debug_barrier()  # the next step reads w back at moved offsets
        p = tl.sum(w[:, None] * addr, 0)
        tl.store(ps_row + (t + 1) * NB + offs_nb, p, mask=mnb)
    tl.store(h_final + row * H + offs_h, h, mask=mh)
    tl.store(p_final + row * NB + offs_nb, p, mask=mnb)


@triton.jit
def _shift_update_backward(dw, q, c, mix, prob, gamma, first_row, prev_row, t, S, mask_row, real, ms, offs_s, offs_m,
                           dz_row, tiny, REACH: tl.constexpr):  # fmt: skip
    """Backward of `_shift_update` for one row from dw = dL/dw (w = Q mask): `(dL/dP, dL/dw_{t-1}, dL/dlogits,
    dL/dgamma)`; dL/dmixed goes through `dz_row` (memory) to be read at moved offsets."""
    M = 2 * REACH + 2
    dq = tl.where(real, dw, 0.0)
    d = q * (dq - tl.sum(q * dq, 0))  # softmax backward, then z = gamma log max(mixed, tiny)
    kept = tl.maximum(mix, tiny)
    d_gamma = tl.sum(tl.where(ms, d * tl.log(kept), 0.0), 0)
    dz = tl.where(mix >= tiny, gamma * d / kept, 0.0)  # the clamp passes no gradient below tiny
    dc = tl.where(offs_m == M - 1, tl.sum(dz * prob, 0), 0.0)
    tl.debug_barrier()  # the previous step's reads of dz_row are done
    tl.store(dz_row + offs_s, dz, mask=ms)
    tl.debug_barrier()
    dv = tl.zeros_like(dz)
    for i in tl.static_range(2 * REACH + 1):  # mixed[s] += c_i w_{t-1}[s - (K - i)]
        v = _moved(first_row, prev_row, t, offs_s - (REACH - i), S, mask_row, True)
        dc = tl.where(offs_m == i, tl.sum(dz * v, 0), dc)
        to = offs_s + (REACH - i)
        dv += _pick(c, offs_m, i) * tl.load(dz_row + to, mask=ms & (to >= 0) & (to < S), other=0.0)
    d_logits = c * (dc - tl.sum(c * dc, 0))
    return _pick(c, offs_m, M - 1) * dz, dv, d_logits, d_gamma


@triton.jit
def _shift_backward_kernel(
    keys, ks_b, ks_u, bank, mask, w_i, w_h, tau_ptr, hs, ps, gates, norms, probs, w0, head_w, sharpening, moves,
    mixed, sharp, g_weights, g_p_final, g_h_final,
    d_p0, d_h0, d_keys, d_bank_rows, d_tau_rows, h_rows, p_rows, dgh_rows, dgi_rows,
    d_w0, d_head_w_rows, d_head_b_rows, d_sharpening_rows,
    U, B, T, S, NB, H,
    COSINE: tl.constexpr, REACH: tl.constexpr, IS_DOUBLE: tl.constexpr, HAS_G_WEIGHTS: tl.constexpr,
    HAS_G_P: tl.constexpr, HAS_G_H: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    b, u = row // U, row % U
    G, M = 3 * H, 2 * REACH + 2
    offs_h, offs_s, offs_nb, offs_m = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB), \
        tl.arange(0, BLOCK_M)  # fmt: skip
    mh, ms, mnb, mm = offs_h < H, offs_s < S, offs_nb < NB, offs_m < M
    key = tl.load(keys + b * ks_b + u * ks_u + offs_s[:, None] * H + offs_h[None, :],
                  mask=ms[:, None] & mh[None, :], other=0.0)  # fmt: skip
    addr = tl.load(bank + b * S * NB + offs_s[:, None] * NB + offs_nb[None, :],
                   mask=ms[:, None] & mnb[None, :], other=0.0)  # fmt: skip
    real = tl.load(mask + b * S + offs_s, mask=ms, other=0) != 0
    tau = tl.load(tau_ptr) if COSINE else 1.0
    head = tl.load(head_w + u * H * M + offs_h[:, None] * M + offs_m[None, :], mask=mh[:, None] & mm[None, :],
                   other=0.0)  # (hidden, moves)  # fmt: skip
    sharpening_u = tl.load(sharpening + u)
    gamma = 1.0 + _softplus(sharpening_u)
    tiny = 2.2250738585072014e-308 if IS_DOUBLE else 1.1754943508222875e-38
    dh, dp = tl.zeros((BLOCK_H,), dtype=key.dtype), tl.zeros((BLOCK_NB,), dtype=key.dtype)
    if HAS_G_H:
        dh += tl.load(g_h_final + row * H + offs_h, mask=mh, other=0.0)
    if HAS_G_P:
        dp += tl.load(g_p_final + row * NB + offs_nb, mask=mnb, other=0.0)
    dv = tl.zeros((BLOCK_S,), dtype=key.dtype)  # dL/dw_t through step t + 1's moves
    d_key = tl.zeros((BLOCK_S, BLOCK_H), dtype=key.dtype)
    d_addr = tl.zeros((BLOCK_S, BLOCK_NB), dtype=key.dtype)
    d_head = tl.zeros((BLOCK_H, BLOCK_M), dtype=key.dtype)
    d_head_bias = tl.zeros((BLOCK_M,), dtype=key.dtype)
    d_tau = tl.sum(tl.zeros((BLOCK_H,), dtype=key.dtype), 0)
    d_gamma = tl.sum(tl.zeros((BLOCK_H,), dtype=key.dtype), 0)
    hs_row, ps_row = hs + row * (T + 1) * H, ps + row * (T + 1) * NB
    wi, wh = w_i + u * NB * G, w_h + u * H * G
    for back in range(T):
        t = T - 1 - back
        step = row * T + t
        prob = tl.load(probs + step * S + offs_s, mask=ms, other=0.0)
        q = tl.load(sharp + step * S + offs_s, mask=ms, other=0.0)
        d_addr += tl.where(real, q, 0.0)[:, None] * dp[None, :]  # through p_t = sum_s w[s] A[s]
        dw = tl.sum(addr * dp[None, :], 1)
        if HAS_G_WEIGHTS:
            dw += tl.load(g_weights + ((b * T + t) * U + u) * S + offs_s, mask=ms, other=0.0)
        c = tl.load(moves + step * M + offs_m, mask=mm, other=0.0)
        mix = tl.load(mixed + step * S + offs_s, mask=ms, other=1.0)
        dP, dv, d_logits, step_gamma = _shift_update_backward(
            dw + dv, q, c, mix, prob, gamma, w0 + row * S, sharp + (step - 1) * S, t, S, mask + b * S, real, ms,
            offs_s, offs_m, d_w0 + row * S, tiny, REACH,
        )  # fmt: skip
        hn = tl.load(hs_row + (t + 1) * H + offs_h, mask=mh, other=0.0)
        d_gamma += step_gamma
        d_head_bias += d_logits
        d_head += hn[:, None] * d_logits[None, :]
        dh += tl.sum(head * d_logits[None, :], 1)  # through the moves' logits h' W_m + b_m
        step_key, step_tau, dh = _attention_backward(dP, prob, key, hn, tl.load(norms + step), tau, dh, COSINE)
        d_key += step_key
        d_tau += step_tau
        dh, dp = _gru_backward(dh, row, u, b, t, B, T, H, NB, hs_row, ps_row, gates, wi, wh, dgi_rows, dgh_rows,
                               h_rows, p_rows, d_h0, offs_h, offs_nb, mh, mnb, BLOCK_K)  # fmt: skip
    tl.store(d_h0 + row * H + offs_h, dh, mask=mh)
    tl.store(d_p0 + row * NB + offs_nb, dp, mask=mnb)
    tl.store(d_w0 + row * S + offs_s, dv, mask=ms)
    tl.store(d_keys + row * S * H + offs_s[:, None] * H + offs_h[None, :], d_key, mask=ms[:, None] & mh[None, :])
    tl.store(d_bank_rows + row * S * NB + offs_s[:, None] * NB + offs_nb[None, :], d_addr,
             mask=ms[:, None] & mnb[None, :])  # fmt: skip
    tl.store(d_head_w_rows + row * H * M + offs_h[:, None] * M + offs_m[None, :], d_head,
             mask=mh[:, None] & mm[None, :])  # fmt: skip
    tl.store(d_head_b_rows + row * M + offs_m, d_head_bias, mask=mm)
    tl.store(d_tau_rows + row, d_tau)
    slope = tl.where(sharpening_u > 20.0, 1.0, tl.sigmoid(sharpening_u))  # gamma = 1 + softplus(x)
    tl.store(d_sharpening_rows + row, d_gamma * slope)


def _constants(keys: torch.Tensor, bank: torch.Tensor, head_weight: torch.Tensor, inverse_temperature) -> dict:
    size, slots, bits, moves = keys.shape[-1], keys.shape[2], bank.shape[-1], head_weight.shape[-1]
    return dict(COSINE=inverse_temperature is not None, REACH=(moves - 2) // 2, IS_DOUBLE=keys.dtype == torch.float64,
                BLOCK_M=triton.next_power_of_2(moves), **_blocks(size, slots, bits))  # fmt: skip


def shift_forward_triton(pointers, hidden, keys, bank, mask, input_weight, input_bias, hidden_weight, hidden_bias,
                         inverse_temperature, previous_weights, head_weight, head_bias, sharpening,
                         num_steps):  # fmt: skip
    """Same arguments and outputs as `shift_recurrence.shift_recurrence`."""
    batch, units, slots, size = keys.shape
    bits, moves = bank.shape[-1], head_weight.shape[-1]
    if keys.stride(3) != 1 or keys.stride(2) != size:
        keys = keys.contiguous()
    inputs = [t.contiguous() for t in (pointers, hidden)]
    params = [t.contiguous() for t in (bank, mask, input_weight, input_bias, hidden_weight,
                                       hidden_bias)]  # fmt: skip
    tau = inverse_temperature if inverse_temperature is not None else keys  # unread for dot scoring
    shift = [t.contiguous() for t in (previous_weights, head_weight, head_bias, sharpening)]
    new = keys.new_empty
    outputs = (new(batch, num_steps, units, slots), new(batch, units, bits), new(batch, units, size),
               new(batch, units, num_steps + 1, size), new(batch, units, num_steps + 1, bits),
               new(batch, units, num_steps, 4 * size), new(batch, units, num_steps),
               new(batch, units, num_steps, slots), new(batch, units, num_steps, moves),
               new(batch, units, num_steps, slots), new(batch, units, num_steps, slots))  # fmt: skip
    _launch(
        _shift_forward_kernel, (batch * units,), *inputs, keys, keys.stride(0), keys.stride(1), *params, tau, *shift,
        *outputs, units, num_steps, slots, bits, size, **_constants(keys, bank, head_weight, inverse_temperature),
    )  # fmt: skip
    return outputs


def shift_backward_triton(grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight, hidden_weight,
                          inverse_temperature, previous_weights, head_weight, sharpening, hidden_states,
                          pointer_states, gates, norms, probs, moves, mixed, sharpened):  # fmt: skip
    """Same arguments and outputs as `shift_recurrence.shift_recurrence_backward`. The kernel writes per-row pieces;
    the bank, bias, temperature, head and sharpening gradients are their sums over rows. `d_h0` and `d_w0` double as
    the kernel's scratch rows (each program's own; stored after its loop); an absent output gradient reads as
    zeros (HAS_G_*), with no zeros tensor allocated."""
    batch, units, slots, size = keys.shape
    bits, steps, width = bank.shape[-1], probs.shape[2], head_weight.shape[-1]
    if keys.stride(3) != 1 or keys.stride(2) != size:
        keys = keys.contiguous()
    present = [g is not None for g in (grad_weights, grad_pointers, grad_hidden)]
    grads = [g.contiguous() if g is not None else keys for g in (grad_weights, grad_pointers, grad_hidden)]
    tau = inverse_temperature if inverse_temperature is not None else keys  # unread for dot scoring
    new, rows = keys.new_empty, batch * steps
    d_p0, d_h0, d_keys = new(batch, units, bits), new(batch, units, size), new(batch, units, slots, size)
    d_bank_rows, d_tau_rows = new(batch, units, slots, bits), new(batch * units)
    factors = (new(units, size, rows), new(units, bits, rows), new(units, rows, 3 * size), new(units, rows, 3 * size))
    d_w0, d_head_rows = new(batch, units, slots), new(batch, units, size, width)
    d_head_bias_rows, d_sharpening_rows = new(batch, units, width), new(batch, units)
    shift = [t.contiguous() for t in (previous_weights, head_weight, sharpening)]
    _launch(
        _shift_backward_kernel, (batch * units,),
        keys, keys.stride(0), keys.stride(1), bank.contiguous(), mask.contiguous(),
        input_weight.contiguous(), hidden_weight.contiguous(), tau, hidden_states, pointer_states, gates, norms,
        probs, *shift, moves, mixed, sharpened, *grads, d_p0, d_h0, d_keys, d_bank_rows, d_tau_rows, *factors,
        d_w0, d_head_rows, d_head_bias_rows, d_sharpening_rows,
        units, batch, steps, slots, bits, size, HAS_G_WEIGHTS=present[0], HAS_G_P=present[1], HAS_G_H=present[2],
        **_constants(keys, bank, head_weight, inverse_temperature),
    )  # fmt: skip
    h_rows, p_rows, dgh, dgi = factors
    return (d_p0, d_h0, d_keys, d_bank_rows.sum(1), dgi.sum(1), dgh.sum(1), d_tau_rows.sum(), h_rows, p_rows, dgh, dgi,
            d_w0, d_head_rows.sum(0), d_head_bias_rows.sum(0), d_sharpening_rows.sum(0))  # fmt: skip
