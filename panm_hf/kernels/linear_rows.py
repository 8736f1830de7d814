"""`nn.Linear` on 2-D rows with a hand-written backward: the same math in fewer dispatched ops.

Autograd's linear (`t` then `addmm`) differentiates the transpose too: its backward transposes the saved `W^T`
back, transposes the input for the weight gradient, transposes that gradient back to `W`'s layout, and views
the bias gradient: about 9 ops per layer, where the math needs 6 (`g W`, `g^T x`, the bias's row sum, and
the two `AccumulateGrad`s). PANM's own linears (the Mode-2 query MLP, the Controller's `h^c_0` and `g^o`, the
GRU's input gates) run on a few rows each step, so on a GPU each op is a kernel launch that costs more than its
arithmetic (issue 35's proxy: ops per training step).

`linear(module, rows)` takes this path only for a plain `nn.Linear` without hooks, with grad enabled and no
autocast; any other module (a PEFT LoRA layer, a quantized linear, a hooked one) is called as it is, so nothing is
bypassed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module_hooks


class _LinearRows(torch.autograd.Function):
    """`x W^T + b` for `x` `(rows, in)`, `W` `(out, in)`, `b` `(out,)` or None. The backward is written in
    differentiable ops, so double backward works."""

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return nn.functional.linear(x, weight, bias)  # (rows, out)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        grad_x = grad.mm(weight) if need_x else None  # (rows, in)
        grad_weight = grad.t().mm(x) if need_weight else None  # (out, in): W's layout, no transpose back
        grad_bias = grad.sum(dim=0) if need_bias else None  # (out,)
        return grad_x, grad_weight, grad_bias


def _plain(module: nn.Module, kind: type) -> bool:
    """`module` is exactly a `kind` and no hook would see its call."""
    hooks = (module._forward_hooks, module._forward_pre_hooks, _module_hooks._global_forward_hooks,
             _module_hooks._global_forward_pre_hooks)  # fmt: skip
    return type(module) is kind and not any(hooks)


def linear_rows(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`nn.functional.linear(rows, weight, bias)` for 2-D `rows`, through `_LinearRows` when autograd records
    outside autocast (whose casts the hand-written backward would not mirror): `(rows, in)` -> `(rows, out)`."""
    if rows.dim() != 2 or not torch.is_grad_enabled() or torch.is_autocast_enabled(rows.device.type):
        return nn.functional.linear(rows, weight, bias)
    return _LinearRows.apply(rows, weight, bias)  # (rows, out)


def linear(module: nn.Module, rows: Tensor) -> Tensor:
    """`module(rows)`, through `linear_rows` when `module` is a plain, unhooked `nn.Linear` of the rows' dtype:
    `(rows, in)` -> `(rows, out)`."""
    if not _plain(module, nn.Linear) or rows.dtype != module.weight.dtype:
        return module(rows)
    return linear_rows(rows, module.weight, module.bias)  # (rows, out)


def mlp(layers: nn.Sequential, rows: Tensor) -> Tensor:
    """A `Sequential(Linear, activation, Linear)` on 2-D rows, each linear through `linear`: `(rows, in)` ->
    `(rows, out)`. Any other shape of `Sequential` is called as it is."""
    if not _plain(layers, nn.Sequential) or len(layers) != 3:
        return layers(rows)
    first, activation, last = layers
    return linear(last, activation(linear(first, rows)))  # (rows, out)
