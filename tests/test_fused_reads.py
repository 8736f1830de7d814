"""The fused kernels outside the recurrences (cosine normalisation, the Mode-2 read, h^c_0's pooling) against
their plain-torch references, values and gradients, and the whole memory with either kernel setting."""

from __future__ import annotations

import pytest
import torch
from conftest import OpNames

from panm_hf import PanmMemory, PanmMemoryConfig
from panm_hf.attention import masked_softmax
from panm_hf.kernels import dispatch

REASON = dispatch.unavailable_reason(torch.float64, torch.device("cpu"))
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"fused kernel unavailable: {REASON}")
TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-9), torch.float32: dict(atol=2e-5, rtol=2e-4)}
DTYPES = [torch.float64, torch.float32]


def grads(outputs, inputs, seed=1):
    """Gradients of a random projection of `outputs` (a tuple) w.r.t. `inputs`."""
    generator = torch.Generator().manual_seed(seed)
    loss = sum((out * torch.randn(out.shape, generator=generator, dtype=out.dtype)).sum() for out in outputs)
    return torch.autograd.grad(loss, inputs, retain_graph=True)


def assert_all_close(actual, expected, dtype):
    for a, e in zip(actual, expected, strict=True):
        scale = e.abs().max().clamp(min=1.0)  # rows below eps have gradients ~1/eps: compare relative to the largest
        torch.testing.assert_close(a / scale, e / scale, **TOLERANCE[dtype])


def rows_with_edge_cases(*shape, dtype, seed=0):
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    x.view(-1, shape[-1])[0] = 0.0  # a zero row: normalize leaves it zero (norm clamped to eps)
    x.view(-1, shape[-1])[1] *= 1e-14  # a row below eps
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_scale", [True, False])
def test_normalize_rows_equals_normalize_times_scale(with_scale, dtype):
    x = rows_with_edge_cases(3, 4, 7, dtype=dtype).requires_grad_()
    scale = torch.tensor(15.0, dtype=dtype, requires_grad=True) if with_scale else None
    fused, _ = torch.ops.panm_hf.normalize_rows(x, scale)
    plain = torch.nn.functional.normalize(x, dim=-1) * (scale if with_scale else 1.0)
    inputs = (x, scale) if with_scale else (x,)
    torch.testing.assert_close(fused, plain, **TOLERANCE[dtype])
    assert_all_close(grads((fused,), inputs), grads((plain,), inputs), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_normalize_rows_can_write_unit_major_keys_batch_major(dtype):
    units, batch, slots = 2, 3, 5
    x = rows_with_edge_cases(units, batch * slots, 4, dtype=dtype).requires_grad_()
    fused, _ = torch.ops.panm_hf.normalize_rows(x, None, batch)
    plain = torch.nn.functional.normalize(x.unflatten(1, (batch, slots)).transpose(0, 1), dim=-1)
    assert fused.shape == (batch, units, slots, 4) and fused.is_contiguous()
    torch.testing.assert_close(fused, plain, **TOLERANCE[dtype])
    assert_all_close(grads((fused,), (x,)), grads((plain,), (x,)), dtype)


def mode2_reference(queries, memory, mask, scale):
    """Mode2Reader's plain path: scorer preparation, one bmm, masked softmax, one bmm."""
    if scale is not None:
        queries = torch.nn.functional.normalize(queries, dim=-1) * scale
        keys = torch.nn.functional.normalize(memory, dim=-1)
    else:
        keys = memory / memory.shape[-1] ** 0.5
    weights = masked_softmax(torch.bmm(queries, keys.transpose(1, 2)), mask[:, None, :])
    return torch.bmm(weights, memory), weights


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
def test_mode2_attention_equals_the_plain_read(scoring, dtype):
    queries = rows_with_edge_cases(4, 6, 7, dtype=dtype).requires_grad_()
    memory = rows_with_edge_cases(4, 5, 7, dtype=dtype, seed=2).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    scale = torch.tensor(15.0, dtype=dtype, requires_grad=True) if scoring == "cosine" else None
    values, weights, *_ = torch.ops.panm_hf.mode2_attention(queries, memory, mask, scale)
    plain_values, plain_weights = mode2_reference(queries, memory, mask, scale)
    torch.testing.assert_close(values, plain_values, **TOLERANCE[dtype])
    torch.testing.assert_close(weights, plain_weights, **TOLERANCE[dtype])
    assert weights[2].abs().sum() == 0 and values[2].abs().sum() == 0  # all-padding sample: zero reads
    inputs = (queries, memory) + ((scale,) if scale is not None else ())
    # through the values only (training) and through the values and the returned weights
    assert_all_close(grads((values,), inputs), grads((plain_values,), inputs), dtype)
    assert_all_close(grads((values, weights), inputs), grads((plain_values, plain_weights), inputs), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mean", [True, False])
def test_masked_pool_equals_the_plain_sum_or_mean(mean, dtype):
    memory = torch.randn(4, 5, 3, dtype=dtype, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    fused = torch.ops.panm_hf.masked_pool(memory, mask, mean)
    weights = mask.unsqueeze(-1).to(dtype)  # (batch, slots, 1)
    plain = (memory * weights).sum(dim=1)
    if mean:
        plain = plain / weights.sum(dim=1).clamp(min=1.0)
    torch.testing.assert_close(fused, plain, **TOLERANCE[dtype])
    assert_all_close(grads((fused,), (memory,)), grads((plain,), (memory,)), dtype)


def test_gradcheck_and_opcheck_of_the_read_ops_in_float64():
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()

    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    queries, memory, scale, keys = randn(2, 3, 4), randn(2, 5, 4), randn(()), randn(2, 6, 4)
    checks = [
        (torch.ops.panm_hf.normalize_rows.default, (keys, scale)),
        (torch.ops.panm_hf.normalize_rows.default, (keys, None, 2)),
        (torch.ops.panm_hf.mode2_attention.default, (queries, memory, mask, scale)),
        (torch.ops.panm_hf.mode2_attention.default, (queries, memory, mask, None)),
        (torch.ops.panm_hf.masked_pool.default, (memory, mask, True)),
    ]
    for op, args in checks:
        differentiable = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

        def call(*tensors, op=op, args=args):
            it = iter(tensors)
            full = [next(it) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
            out = op(*full)
            return out[:2] if op is torch.ops.panm_hf.mode2_attention.default else out[0] if isinstance(
                out, (tuple, list)) else out  # fmt: skip

        assert torch.autograd.gradcheck(call, differentiable), op
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def training_step(kernel, *, scoring, controller_init, dtype=torch.float64, count=False, device="cpu"):
    torch.manual_seed(0)
    config = PanmMemoryConfig(address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                              num_mode2_heads=2, scoring=scoring, controller_init=controller_init,
                              recurrence_kernel=kernel)  # fmt: skip
    memory = PanmMemory(config, memory_dim=6, decoder_input_size=0, output_size=4).to(device, dtype).train()
    states = torch.randn(4, 7, 6, dtype=dtype).to(device).requires_grad_()
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5, [0] * 7], device=device)  # an all-padding row
    counter = OpNames()
    with counter if count else torch.enable_grad():
        out = memory(states, num_steps=5, attention_mask=mask, base_address=torch.tensor([3, 60, 17, 9], device=device),
                     output_attentions=True)  # fmt: skip
    loss = out.hidden_states.square().sum()
    names = [n for n, _ in memory.named_parameters()]
    gradients = torch.autograd.grad(loss, [states, *memory.parameters()])
    return out, dict(zip(["memory_states", *names], gradients)), counter.names


@pytest.mark.parametrize("scoring, controller_init", [("cosine", "mean"), ("dot", "sum")])
def test_whole_memory_is_the_same_with_the_fused_reads(scoring, controller_init):
    """Without a decoder input (the LSTM case's shape), two Mode-2 heads, padding: outputs, both attentions and
    the gradients of the memory states and of every parameter."""
    eager, eager_grads, _ = training_step("eager", scoring=scoring, controller_init=controller_init)
    fused, fused_grads, _ = training_step("auto", scoring=scoring, controller_init=controller_init)
    for name in ("hidden_states", "address_attentions", "mode2_attentions"):
        torch.testing.assert_close(getattr(fused, name), getattr(eager, name), **TOLERANCE[torch.float64])
    assert fused.mode2_attentions.shape == (4, 5, 2, 7)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, **TOLERANCE[torch.float64], msg=name)


def test_eager_stays_the_plain_reference_and_auto_uses_the_kernels():
    _, _, eager = training_step("eager", scoring="cosine", controller_init="mean", count=True)
    _, _, fused = training_step("auto", scoring="cosine", controller_init="mean", count=True)
    assert not [name for name in eager if name.startswith("panm_hf.")]
    assert "aten.linalg_vector_norm.default" in eager and "aten._softmax.default" in eager
    for op in ("normalize_rows", "mode2_attention", "masked_pool", "pointer_recurrence", "gru_recurrence"):
        assert fused.count(f"panm_hf.{op}.default") == 1, op
    # the cosine normalisations and the Mode-2 softmax now run inside the kernels
    assert "aten.linalg_vector_norm.default" not in fused and "aten._softmax.default" not in fused
    assert len(fused) < len(eager) // 2


def content_read_step(kernel, *, scoring, keys, dtype=torch.float64):
    """A memory with the decoder content read (`content_read_keys=keys`), one Mode-2 head and an all-padding
    sample: `(output, gradients of the states, decoder states and every parameter, the ops it dispatched)`."""
    torch.manual_seed(0)
    config = PanmMemoryConfig(address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                              scoring=scoring, content_read="decoder", content_read_keys=keys,
                              recurrence_kernel=kernel)  # fmt: skip
    memory = PanmMemory(config, memory_dim=6, decoder_input_size=5, output_size=4).to(dtype).train()
    states = torch.randn(4, 7, 6, dtype=dtype, requires_grad=True)
    decoder = torch.randn(4, 5, 5, dtype=dtype, requires_grad=True)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5, [0] * 7])
    counter = OpNames()
    with counter:
        out = memory(states, decoder, attention_mask=mask, base_address=torch.tensor([3, 60, 17, 9]),
                     output_attentions=True)  # fmt: skip
    loss = out.hidden_states.square().sum() + (out.content_attentions * torch.arange(7.0, dtype=dtype)).sum()
    return out, torch.autograd.grad(loss, [states, decoder, *memory.parameters()]), counter.names


@pytest.mark.parametrize(
    "scoring, keys", [("cosine", "memory"), ("dot", "memory"), ("cosine", "end_distance"), ("dot", "end_distance_only")]
)
def test_decoder_content_read_runs_the_mode2_kernel_and_is_the_same(scoring, keys):
    """`content_read="decoder"` (a Mode-2-shaped read queried by `z_t`): the memory's outputs, the content attention
    and every gradient, eager against auto, with an all-padding sample; auto reads it with `mode2_attention`, with
    end-distance keys (`content_read_keys`) too: the kernel scores the keys, one matmul takes the values from `M`."""
    eager, eager_grads, _ = content_read_step("eager", scoring=scoring, keys=keys)
    fused, fused_grads, names = content_read_step("auto", scoring=scoring, keys=keys)
    for name in ("hidden_states", "content_attentions"):
        torch.testing.assert_close(getattr(fused, name), getattr(eager, name), **TOLERANCE[torch.float64])
    assert torch.equal(fused.content_attentions[3], torch.zeros(5, 7))  # the all-padding sample reads nothing
    assert names.count("panm_hf.mode2_attention.default") == 2  # the Mode-2 read and the content read
    for fused_grad, eager_grad in zip(fused_grads, eager_grads, strict=True):
        torch.testing.assert_close(fused_grad, eager_grad, **TOLERANCE[torch.float64])
