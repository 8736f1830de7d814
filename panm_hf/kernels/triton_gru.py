"""The Controller GRU's recurrence (`panm_hf::gru_recurrence`, `nn.GRU`'s equations) as Triton kernels.

One program per sample runs all steps, forward (`gru_forward_triton`) and backward (`gru_backward_triton`), with
the same outputs and saved gates as the C kernel (`gru_forward`/`gru_backward` in `source.py`): the input gates
`x W_ih^T + b_ih` of every step come in computed (one matmul), each step adds `h W_hh^T + b_hh`, reading `W_hh`
in blocks of BLOCK_K columns against `h_{t-1}` read back from memory. `recurrence_kernel="triton"` runs it on any
device (on CPU under `TRITON_INTERPRET=1`, checked there against the C kernel); CUDA's `"auto"` keeps cuDNN's GRU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_port import _launch, _tanh


@triton.jit
def _previous(h0_row, states_row, t, offs, valid, H):
    """`h_{t-1}[offs]`: `h_0` at step 0, else the previous step's state."""
    first = valid & (offs * 0 + t == 0)  # t as a vector: a scalar test does not combine with a mask everywhere
    later = valid & (offs * 0 + t > 0)
    return tl.load(h0_row + offs, mask=first, other=0.0) + tl.load(states_row + (t - 1) * H + offs, mask=later,
                                                                    other=0.0)  # fmt: skip


@triton.jit
def _gru_forward_kernel(gi, h0, w_hh, b_hh, states, last, gates, T, H, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    G = 3 * H
    offs_h = tl.arange(0, BLOCK_H)
    mh = offs_h < H
    h = tl.load(h0 + b * H + offs_h, mask=mh, other=0.0)
    states_row = states + b * T * H
    for t in range(T):
        gh_r = tl.load(b_hh + offs_h, mask=mh, other=0.0)
        gh_z = tl.load(b_hh + H + offs_h, mask=mh, other=0.0)
        gh_n = tl.load(b_hh + 2 * H + offs_h, mask=mh, other=0.0)
        for k0 in range(0, H, BLOCK_K):  # W_hh h, BLOCK_K columns of W_hh at a time
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mk = offs_k < H
            hk = _previous(h0 + b * H, states_row, t, offs_k, mk, H)
            block = w_hh + offs_h[:, None] * H + offs_k[None, :]  # rows j of the r gate, columns k
            bmask = mh[:, None] & mk[None, :]
            gh_r += tl.sum(tl.load(block, mask=bmask, other=0.0) * hk[None, :], 1)
            gh_z += tl.sum(tl.load(block + H * H, mask=bmask, other=0.0) * hk[None, :], 1)
            gh_n += tl.sum(tl.load(block + 2 * H * H, mask=bmask, other=0.0) * hk[None, :], 1)
        x = gi + (b * T + t) * G
        r = tl.sigmoid(tl.load(x + offs_h, mask=mh, other=0.0) + gh_r)
        z = tl.sigmoid(tl.load(x + H + offs_h, mask=mh, other=0.0) + gh_z)
        n = _tanh(tl.load(x + 2 * H + offs_h, mask=mh, other=0.0) + r * gh_n)
        h = (1.0 - z) * n + z * h
        gate_row = gates + (b * T + t) * 4 * H
        tl.store(gate_row + offs_h, r, mask=mh)
        tl.store(gate_row + H + offs_h, z, mask=mh)
        tl.store(gate_row + 2 * H + offs_h, n, mask=mh)
        tl.store(gate_row + 3 * H + offs_h, gh_n, mask=mh)
        tl.store(states_row + t * H + offs_h, h, mask=mh)
        tl.debug_barrier()  # the next step reads h back in blocks
    tl.store(last + b * H + offs_h, h, mask=mh)


@triton.jit
def _gru_backward_kernel(h0, w_hh, states, gates, g_states, gs_b, gs_t, g_last, d_gi, d_h0, d_b_hh_rows, h_rows,
                         dgh_rows, B, T, H, HAS_G_STATES: tl.constexpr, HAS_G_LAST: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """`d_h0` doubles as the scratch of `W_hh^T dgh` (each program's own row; the result is stored after the
    loop). An absent output gradient (HAS_G_* False) reads as zeros, with no zeros tensor allocated."""
    b = tl.program_id(0)
    G = 3 * H
    offs_h = tl.arange(0, BLOCK_H)
    mh = offs_h < H
    if HAS_G_LAST:
        dh = tl.load(g_last + b * H + offs_h, mask=mh, other=0.0)
    else:
        dh = tl.zeros((BLOCK_H,), dtype=d_h0.dtype.element_ty)
    d_bias_r = tl.zeros((BLOCK_H,), dtype=dh.dtype)
    d_bias_z = tl.zeros((BLOCK_H,), dtype=dh.dtype)
    d_bias_n = tl.zeros((BLOCK_H,), dtype=dh.dtype)
    states_row = states + b * T * H
    for back in range(T):
        t = T - 1 - back
        d = dh
        if HAS_G_STATES:
            d += tl.load(g_states + b * gs_b + t * gs_t + offs_h, mask=mh, other=0.0)
        gate_row = gates + (b * T + t) * 4 * H
        r = tl.load(gate_row + offs_h, mask=mh, other=0.0)
        z = tl.load(gate_row + H + offs_h, mask=mh, other=0.0)
        n = tl.load(gate_row + 2 * H + offs_h, mask=mh, other=0.0)
        ghn = tl.load(gate_row + 3 * H + offs_h, mask=mh, other=0.0)
        h_prev = _previous(h0 + b * H, states_row, t, offs_h, mh, H)
        dan = d * (1.0 - z) * (1.0 - n * n)
        daz = d * (h_prev - n) * z * (1.0 - z)
        dar = dan * ghn * r * (1.0 - r)
        x = d_gi + (b * T + t) * G
        tl.store(x + offs_h, dar, mask=mh)
        tl.store(x + H + offs_h, daz, mask=mh)
        tl.store(x + 2 * H + offs_h, dan, mask=mh)
        d_bias_r += dar
        d_bias_z += daz
        d_bias_n += dan * r
        column = b * T + t  # of the weight gradient's factors: h_rows (B T, H), dgh_rows (3H, B T)
        tl.store(h_rows + column * H + offs_h, h_prev, mask=mh)
        tl.store(dgh_rows + offs_h * (B * T) + column, dar, mask=mh)
        tl.store(dgh_rows + (H + offs_h) * (B * T) + column, daz, mask=mh)
        tl.store(dgh_rows + (2 * H + offs_h) * (B * T) + column, dan * r, mask=mh)
        for k0 in range(0, H, BLOCK_K):  # W_hh^T dgh into the scratch, BLOCK_K entries at a time
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mk = offs_k < H
            block = w_hh + offs_h[:, None] * H + offs_k[None, :]
            bmask = mh[:, None] & mk[None, :]
            part = (tl.sum(tl.load(block, mask=bmask, other=0.0) * dar[:, None], 0)
                    + tl.sum(tl.load(block + H * H, mask=bmask, other=0.0) * daz[:, None], 0)
                    + tl.sum(tl.load(block + 2 * H * H, mask=bmask, other=0.0) * (dan * r)[:, None], 0))  # fmt: skip
            tl.store(d_h0 + b * H + offs_k, part, mask=mk)
        tl.debug_barrier()
        dh = d * z + tl.load(d_h0 + b * H + offs_h, mask=mh, other=0.0)
        tl.debug_barrier()
    tl.store(d_h0 + b * H + offs_h, dh, mask=mh)
    tl.store(d_b_hh_rows + b * G + offs_h, d_bias_r, mask=mh)
    tl.store(d_b_hh_rows + b * G + H + offs_h, d_bias_z, mask=mh)
    tl.store(d_b_hh_rows + b * G + 2 * H + offs_h, d_bias_n, mask=mh)


def _blocks(size: int) -> dict:
    block_h = triton.next_power_of_2(size)
    return dict(BLOCK_H=block_h, BLOCK_K=min(block_h, 32))


def gru_forward_triton(input_gates, hidden, hidden_weight, hidden_bias):
    """Same arguments and outputs as `loader.gru_recurrence`."""
    batch, steps, size = hidden.shape[0], input_gates.shape[1], hidden.shape[1]
    inputs = [t.contiguous() for t in (input_gates, hidden, hidden_weight, hidden_bias)]
    new = hidden.new_empty
    outputs = (new(batch, steps, size), new(batch, size), new(batch, steps, 4 * size))
    _launch(_gru_forward_kernel, (batch,), *inputs, *outputs, steps, size, **_blocks(size))
    return outputs


def gru_backward_triton(grad_states, grad_last, hidden, hidden_weight, states, gates):
    """Same arguments and outputs as `loader.gru_recurrence_backward`; the bias gradient is the sum of per-sample
    pieces."""
    batch, steps, size = states.shape
    if grad_states is not None and grad_states.stride(2) != 1:  # rows of any stride (a slice of a cat's grad)
        grad_states = grad_states.contiguous()
    grad_last = grad_last.contiguous() if grad_last is not None else None
    new = hidden.new_empty
    d_input_gates, d_hidden, d_bias_rows = new(batch, steps, 3 * size), new(batch, size), new(batch, 3 * size)
    h_rows, dgh_rows = new(batch * steps, size), new(3 * size, batch * steps)
    gs = grad_states if grad_states is not None else states  # unread when absent
    _launch(
        _gru_backward_kernel, (batch,), hidden.contiguous(), hidden_weight.contiguous(), states, gates, gs,
        gs.stride(0), gs.stride(1), grad_last if grad_last is not None else hidden, d_input_gates, d_hidden,
        d_bias_rows, h_rows, dgh_rows, batch, steps, size, HAS_G_STATES=grad_states is not None,
        HAS_G_LAST=grad_last is not None, **_blocks(size),
    )  # fmt: skip
    return d_input_gates, d_hidden, d_bias_rows.sum(0), h_rows, dgh_rows
