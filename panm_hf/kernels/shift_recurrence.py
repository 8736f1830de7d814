"""The Pointer-Unit loop with `pointer_update="shift"` as one fused op forward and one backward.

`PointerUnits.forward` with shift pointer arithmetic (`panm_hf.pointer_arithmetic`) runs, per step, the paper's
GRU update and address attention, then the moves' head (`2K + 2` logits on `h^a_t`), the mixture of the previous
address attention moved by each step `K..-K` with the attention, and the sharpening. `panm_hf::shift_recurrence`
runs all steps in one C kernel (`shift_forward` in `source.py`, which shares the GRU and attention code of the
`"attention"` kernel) and `panm_hf::shift_recurrence_backward` their backward in another; both are `torch.library`
custom ops with fake kernels, wired with `register_autograd`. On CUDA (and under `recurrence_kernel="triton"`)
they dispatch to the Triton port (`triton_shift.py`), registered by `loader.register_triton`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .loader import _registered, run_recurrence, run_recurrence_backward


def shift_recurrence(
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
    previous_weights: Tensor,
    head_weight: Tensor,
    head_bias: Tensor,
    sharpening: Tensor,
    num_steps: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """All `num_steps` shift Pointer-Unit updates in one kernel.

    Args:
        pointers ... num_steps: as `loader.pointer_recurrence`.
        previous_weights: `(batch, units, slots)` `w_0`, the address attention before the first step.
        head_weight, head_bias: the moves' head (`ArithmeticHead`), `(units, hidden, 2K + 2)`, `(units, 2K + 2)`.
        sharpening: `(units,)`; `gamma = 1 + softplus(sharpening)`.

    Returns:
        `pointer_recurrence`'s eight outputs (weights, final pointers and hidden, then the saved states), then, for
        the backward, the moves' probabilities `(batch, units, steps, 2K + 2)`, the mixtures and their sharpened
        softmax `(batch, units, steps, slots)` each.
    """
    batch, units, slots, _ = keys.shape
    moves = head_weight.shape[-1]
    gru = (input_weight, input_bias, hidden_weight, hidden_bias)
    extra_inputs = ((moves - 2) // 2, previous_weights, head_weight, head_bias, sharpening)
    saved = (batch, units, num_steps)
    extra_shapes = ((*saved, moves), (*saved, slots), (*saved, slots))  # moves' softmax, mixtures, sharpened
    return run_recurrence(
        "shift_forward", pointers, hidden, keys, bank, mask, gru, inverse_temperature, num_steps, extra_inputs,
        extra_shapes,
    )  # fmt: skip


def _shift_recurrence_fake(pointers, hidden, keys, bank, mask, input_weight, input_bias, hidden_weight, hidden_bias,
                           inverse_temperature, previous_weights, head_weight, head_bias, sharpening,
                           num_steps):  # fmt: skip
    batch, units, slots, size = keys.shape
    bits, moves = bank.shape[-1], head_weight.shape[-1]
    new = keys.new_empty
    return (new(batch, num_steps, units, slots), new(batch, units, bits), new(batch, units, size),
            new(batch, units, num_steps + 1, size), new(batch, units, num_steps + 1, bits),
            new(batch, units, num_steps, 4 * size), new(batch, units, num_steps),
            new(batch, units, num_steps, slots), new(batch, units, num_steps, moves),
            new(batch, units, num_steps, slots), new(batch, units, num_steps, slots))  # fmt: skip


def shift_recurrence_backward(
    grad_weights: Tensor | None,
    grad_pointers: Tensor | None,
    grad_hidden: Tensor | None,
    keys: Tensor,
    bank: Tensor,
    mask: Tensor,
    input_weight: Tensor,
    hidden_weight: Tensor,
    inverse_temperature: Tensor | None,
    previous_weights: Tensor,
    head_weight: Tensor,
    sharpening: Tensor,
    hidden_states: Tensor,
    pointer_states: Tensor,
    gates: Tensor,
    norms: Tensor,
    probs: Tensor,
    moves: Tensor,
    mixed: Tensor,
    sharpened: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
           Tensor, Tensor]:
    """The whole shift recurrence's backward in one kernel: `pointer_recurrence_backward`'s eleven outputs, then the
    gradients of `previous_weights` `(batch, units, slots)`, the head's weight and bias, and `sharpening`."""
    batch, units, slots, size = keys.shape
    reach = (head_weight.shape[-1] - 2) // 2
    extra_inputs = (reach, previous_weights, head_weight, sharpening, moves, mixed, sharpened)
    extra_shapes = ((batch, units, slots), tuple(head_weight.shape), (units, head_weight.shape[-1]), (units,))
    return run_recurrence_backward(
        "shift_backward", (grad_weights, grad_pointers, grad_hidden), keys, bank, mask, input_weight, hidden_weight,
        inverse_temperature, (hidden_states, pointer_states, gates, norms, probs), extra_inputs, extra_shapes,
    )  # fmt: skip


def _shift_recurrence_backward_fake(grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight,
                                    hidden_weight, inverse_temperature, previous_weights, head_weight, sharpening,
                                    hidden_states, pointer_states, gates, norms, probs, moves, mixed,
                                    sharpened):  # fmt: skip
    batch, units, slots, size = keys.shape
    bits, rows = bank.shape[-1], batch * probs.shape[2]
    new = keys.new_empty
    return (new(batch, units, bits), new(batch, units, size), new(batch, units, slots, size), new(bank.shape),
            new(units, 3 * size), new(units, 3 * size), new(()), new(units, size, rows), new(units, bits, rows),
            new(units, rows, 3 * size), new(units, rows, 3 * size), new(batch, units, slots), new(head_weight.shape),
            new(units, head_weight.shape[-1]), new(units))  # fmt: skip


def _setup_context(ctx, inputs, output):
    (_, _, keys, bank, mask, input_weight, _, hidden_weight, _, inverse_temperature, previous_weights, head_weight, _,
     sharpening, _) = inputs  # fmt: skip
    ctx.save_for_backward(keys, bank, mask, input_weight, hidden_weight, inverse_temperature, previous_weights,
                          head_weight, sharpening, *output[3:])  # fmt: skip
    ctx.set_materialize_grads(False)  # unused outputs pass None, not zero tensors built here
    ctx.mark_non_differentiable(*output[3:])


def shift_backward(backward_op, ctx, grad_weights, grad_pointers, grad_hidden):
    """The autograd backward of the shift op (`backward_op`: the C or the Triton backward): gradients of its 15
    inputs, the GRU weights' as one `bmm` each of the factors the kernel writes."""
    keys, bank, mask, input_weight, hidden_weight, inverse_temperature, *saved = ctx.saved_tensors
    grads = backward_op(grad_weights, grad_pointers, grad_hidden, keys, bank, mask, input_weight, hidden_weight,
                        inverse_temperature, *saved)  # fmt: skip
    d_pointers, d_hidden, d_keys, d_bank, d_input_bias, d_hidden_bias, d_tau, h_rows, p_rows, dgh, dgi = grads[:11]
    d_previous, d_head_weight, d_head_bias, d_sharpening = grads[11:]
    d_hidden_weight = torch.bmm(h_rows, dgh)  # (units, hidden, 3 hidden)
    d_input_weight = torch.bmm(p_rows, dgi)  # (units, bits, 3 hidden)
    d_tau = d_tau if inverse_temperature is not None else None
    return (d_pointers, d_hidden, d_keys, d_bank, None, d_input_weight, d_input_bias, d_hidden_weight, d_hidden_bias,
            d_tau, d_previous, d_head_weight, d_head_bias, d_sharpening, None)  # fmt: skip


def _backward(ctx, grad_weights, grad_pointers, grad_hidden, *_):
    return shift_backward(torch.ops.panm_hf.shift_recurrence_backward, ctx, grad_weights, grad_pointers, grad_hidden)


def _triton_backward(ctx, grad_weights, grad_pointers, grad_hidden, *_):
    backward_op = torch.ops.panm_hf.shift_recurrence_triton_backward
    return shift_backward(backward_op, ctx, grad_weights, grad_pointers, grad_hidden)


TRITON_AUTOGRAD = (_triton_backward, _setup_context)  # `panm_hf::shift_recurrence_triton`'s (loader.register_triton)


if not _registered("shift_recurrence"):
    for _name, _impl, _fake in (
        ("shift_recurrence", shift_recurrence, _shift_recurrence_fake),
        ("shift_recurrence_backward", shift_recurrence_backward, _shift_recurrence_backward_fake),
    ):
        torch.library.custom_op(f"panm_hf::{_name}", _impl, mutates_args=(), device_types="cpu").register_fake(_fake)
    torch.library.register_autograd("panm_hf::shift_recurrence", _backward, setup_context=_setup_context)
