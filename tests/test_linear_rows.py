"""`panm_hf.kernels.linear_rows`: PANM's linears with a hand-written backward equal `nn.Linear`, and step aside for
anything that must see the module's call (hooks, subclasses such as PEFT's, autocast, no grad)."""

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from panm_hf.kernels.linear_rows import linear, linear_rows, mlp


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _values_and_grads(run, layers, rows):
    rows = rows.clone().requires_grad_()
    out = run(layers, rows)
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad((out * projection).sum(), [rows, *layers.parameters()])
    return [out, *grads]


def test_mlp_and_linear_equal_the_modules_in_values_and_every_gradient():
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).double()
    rows = torch.randn(4, 5, dtype=torch.float64)
    ours, theirs = _values_and_grads(mlp, layers, rows), _values_and_grads(lambda m, x: m(x), layers, rows)
    assert len(ours) == 6
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    weight, bias = layers[0].weight.detach().requires_grad_(), layers[0].bias.detach().requires_grad_()
    x = rows.clone().requires_grad_()
    assert torch.autograd.gradcheck(linear_rows, (x, weight, bias))
    assert torch.autograd.gradgradcheck(linear_rows, (x, weight, bias))  # the backward is differentiable
    assert torch.autograd.gradcheck(linear_rows, (x, weight, None))


def test_a_training_step_dispatches_fewer_ops_than_autograds_linear():
    layers = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    rows = torch.randn(4, 5)
    counts = []
    for run in (mlp, lambda m, x: m(x)):
        with _Ops() as ops:
            run(layers, rows).sum().backward()
        counts.append(ops.count)
    assert counts[0] <= counts[1] - 6, counts  # no transposes back, no bias view: 3 ops fewer per linear


def test_hooks_subclasses_autocast_and_no_grad_keep_the_module_call():
    layer = nn.Linear(4, 2)
    rows = torch.randn(3, 4)
    seen = []
    handle = layer.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    linear(layer, rows)
    handle.remove()
    assert seen == [torch.Size([3, 2])]  # a hook (PEFT, FSDP, a user's) still runs

    class Scaled(nn.Linear):  # as a PEFT LoRA layer or a quantized linear: its own forward must run
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = Scaled(4, 2)
    torch.testing.assert_close(linear(scaled, rows), 2 * nn.functional.linear(rows, scaled.weight, scaled.bias))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(layer, rows).dtype == torch.bfloat16  # autocast's cast, as the module gives it
    with torch.no_grad():
        assert linear(layer, rows).grad_fn is None
    assert type(linear(layer, rows).grad_fn).__name__.startswith("_LinearRows")
    dropout_mlp = nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.ReLU(), nn.Dropout(1.0)), nn.Linear(6, 2))
    out = mlp(dropout_mlp.train(), rows)  # the activation module runs as it is: dropout 1.0 zeroes the hidden rows
    torch.testing.assert_close(out, dropout_mlp[2].bias.expand(3, 2))
