"""On a GPU: the Triton kernels (what `recurrence_kernel="auto"` and `"triton"` run on CUDA) against the eager loops.

Skipped without CUDA (CI has none); run by hand where a GPU is lent: `python -m pytest tests/test_cuda.py`.
"""

from __future__ import annotations

import pytest
import torch
from test_benchmarks import load_overhead
from test_fused_reads import TOLERANCE as READ_TOLERANCE
from test_fused_reads import training_step
from test_fused_recurrence import SHAPES, units_and_inputs
from test_fused_shift import shift_units_and_inputs, values_and_grads

from panm_hf import PanmConfig, PanmForSeq2SeqLM, PanmMemory, PanmMemoryConfig
from panm_hf.kernels import dispatch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-9), torch.float32: dict(atol=2e-5, rtol=2e-4)}


@pytest.fixture(autouse=True)
def full_float32_references():
    """The eager references in true float32: cuDNN's RNNs (the eager Controller GRU) and matmuls otherwise may run
    in TF32 on Ampere and later, 1e-4-ish relative error that is the reference's, not the kernels' (an H100 showed
    it against the Triton GRU: 6e-5 absolute with TF32 allowed, within 2e-5 without)."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def outputs_and_grads(module, kernel, inputs):
    """The Pointer Units' outputs under `kernel`, and the gradients of a fixed projection of them."""
    module.recurrence_kernel = kernel
    module.zero_grad()
    leaves = {name: inputs[name].clone().requires_grad_() for name in ("pointers", "hidden", "address_bank")}
    keys = module.address_keys(leaves["address_bank"])
    outputs = module(
        leaves["pointers"], leaves["hidden"], leaves["address_bank"], keys, inputs["mask"], inputs["steps"]
    )
    generator = torch.Generator(device="cuda").manual_seed(1)
    loss = sum(
        (out * torch.randn(out.shape, generator=generator, device="cuda", dtype=out.dtype)).sum() for out in outputs
    )
    loss.backward()
    grads = [leaf.grad for leaf in leaves.values()] + [p.grad for p in module.parameters()]
    return [o.detach() for o in outputs], grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_pointer_units_equal_eager_on_cuda(shape, scoring, dtype):
    assert dispatch.unavailable_reason(dtype, torch.device("cuda")) is None  # "auto" takes the kernel
    module, inputs = units_and_inputs(*shape, dtype=dtype, scoring=scoring)
    module = module.cuda()
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    eager_out, eager_grads = outputs_and_grads(module, "eager", inputs)
    fused_out, fused_grads = outputs_and_grads(module, "auto", inputs)
    for eager, fused in zip(eager_out + eager_grads, fused_out + fused_grads, strict=True):
        torch.testing.assert_close(fused, eager, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_shift_pointer_units_equal_eager_on_cuda(shape, scoring, dtype):
    module, inputs = shift_units_and_inputs(*shape, dtype=dtype, scoring=scoring, reach=2 if shape[2] > 5 else 1)
    module = module.cuda()
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    eager_out, eager_grads = values_and_grads(module, "eager", inputs)
    fused_out, fused_grads = values_and_grads(module, "auto", inputs)
    for eager, fused in zip([*eager_out, *eager_grads.values()], [*fused_out, *fused_grads.values()], strict=True):
        torch.testing.assert_close(fused, eager, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_seq2seq_training_step_is_the_same_with_the_triton_kernel(backbone_config, dtype):
    models = {}
    for kernel in ("eager", "auto"):
        torch.manual_seed(0)
        config = PanmConfig(text_config=backbone_config.to_dict(), placement="replace", address_bits=6,
                            pointer_hidden_size=12, controller_hidden_size=12, mlp_hidden_size=10,
                            recurrence_kernel=kernel)  # fmt: skip
        models[kernel] = PanmForSeq2SeqLM(config).to("cuda", dtype).eval()  # eval: no dropout, base as given
    models["auto"].load_state_dict(models["eager"].state_dict())
    source = torch.randint(3, 99, (5, 9), device="cuda")
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    labels = torch.randint(3, 99, (5, 7), device="cuda")
    base = torch.tensor([0, 3, 17, 40, 63], device="cuda")
    results = {}
    for kernel, model in models.items():
        # cuDNN's GRU (the Controller, either way) has no backward in eval mode: PyTorch's own GRU here
        with torch.backends.cudnn.flags(enabled=False):
            out = model(input_ids=source, attention_mask=mask, labels=labels, base_address=base)
            out.loss.backward()
        results[kernel] = [out.logits.detach()] + [p.grad for p in model.parameters() if p.grad is not None]
    for eager, fused in zip(results["eager"], results["auto"], strict=True):
        torch.testing.assert_close(fused, eager, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scoring, init", [("cosine", "mean"), ("dot", "sum")])
def test_memory_training_step_is_the_same_with_the_read_ports(scoring, init, dtype):
    """`"auto"` on CUDA runs the reads' Triton ports (normalisation, Mode 2, pooling) and the Pointer-Unit port:
    a `PanmMemory` training step against `"eager"`, outputs, attentions and every gradient."""
    eager, eager_grads, _ = training_step("eager", scoring=scoring, controller_init=init, dtype=dtype, device="cuda")
    ours, our_grads, names = training_step("auto", scoring=scoring, controller_init=init, dtype=dtype, device="cuda",
                                           count=True)  # fmt: skip
    assert "panm_hf.mode2_attention_triton.default" in names and "panm_hf.masked_pool_triton.default" in names
    for name in ("hidden_states", "address_attentions", "mode2_attentions"):
        torch.testing.assert_close(getattr(ours, name), getattr(eager, name), **READ_TOLERANCE[dtype])
    for name, grad in eager_grads.items():
        torch.testing.assert_close(our_grads[name], grad, **READ_TOLERANCE[dtype], msg=name)


# the examples' design (benchmarks/overhead.py PANM_EXAMPLE): shift pointers and the decoder content read; issue 34's
# candidate (PANM_ONE): the content read keyed by M and each slot's distance from the end, g^o reading z_t
DESIGNS = {
    "attention": {},
    "example": {"pointer_update": "shift", "content_read": "decoder"},
    "one": {"content_read": "decoder", "content_read_keys": "end_distance", "output_decoder_input": True},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernel", ["auto", "triton"])
@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_memory_with_a_decoder_input_is_the_same_under_every_cuda_kernel(design, kernel, dtype):
    """A `PanmMemory` training step with a decoder input, padding and an all-padding row: `"auto"` (Triton
    Pointer Units and reads, cuDNN's Controller GRU) and `"triton"` (its Triton GRU too) against `"eager"`:
    outputs and the gradients of the memory, the decoder states and every parameter."""
    results = {}
    for name in ("eager", kernel):
        torch.manual_seed(0)
        config = PanmMemoryConfig(address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                  recurrence_kernel=name, **DESIGNS[design])  # fmt: skip
        memory = PanmMemory(config, memory_dim=6, decoder_input_size=5, output_size=4).to("cuda", dtype).train()
        generator = torch.Generator().manual_seed(1)
        states = torch.randn(4, 7, 6, dtype=dtype, generator=generator).cuda().requires_grad_()
        decoder = torch.randn(4, 5, 5, dtype=dtype, generator=generator).cuda().requires_grad_()
        mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5, [0] * 7], device="cuda")
        out = memory(states, decoder, attention_mask=mask, base_address=torch.tensor([3, 60, 17, 9], device="cuda"))
        loss = out.hidden_states.square().sum()
        results[name] = [out.hidden_states.detach(), *torch.autograd.grad(loss, [states, decoder,
                                                                                 *memory.parameters()])]  # fmt: skip
    for eager, ours in zip(results["eager"], results[kernel], strict=True):
        torch.testing.assert_close(ours, eager, **READ_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_seq2seq_example_design_training_step_is_the_same_under_triton(backbone_config, dtype):
    """The examples' design (`stack`, shift pointers, the decoder content read) on a BART: logits and every
    gradient, `"triton"` against `"eager"` (drop-path off: eval mode, so both see the same samples)."""
    results = {}
    for kernel in ("eager", "triton"):
        torch.manual_seed(0)
        config = PanmConfig(text_config=backbone_config.to_dict(), placement="stack", address_bits=6,
                            pointer_hidden_size=12, controller_hidden_size=12, mlp_hidden_size=10,
                            recurrence_kernel=kernel, **DESIGNS["example"])  # fmt: skip
        model = PanmForSeq2SeqLM(config).to("cuda", dtype).eval()
        source = torch.randint(3, 99, (5, 9), generator=torch.Generator().manual_seed(2)).cuda()
        mask = torch.ones_like(source)
        mask[1, 6:] = 0
        labels = torch.randint(3, 99, (5, 7), generator=torch.Generator().manual_seed(3)).cuda()
        with torch.backends.cudnn.flags(enabled=False):  # the eager Controller's nn.GRU, backward in eval mode
            out = model(input_ids=source, attention_mask=mask, labels=labels,
                        base_address=torch.tensor([0, 3, 17, 40, 63], device="cuda"))  # fmt: skip
            out.loss.backward()
        results[kernel] = [out.logits.detach()] + [p.grad for p in model.parameters() if p.grad is not None]
    for eager, ours in zip(results["eager"], results["triton"], strict=True):
        torch.testing.assert_close(ours, eager, **TOLERANCE[dtype])


def test_kernel_counter_counts_each_cuda_launch():
    overhead = load_overhead()
    values = torch.zeros(8, device="cuda")
    with overhead.KernelCounter() as counter:
        for _ in range(5):
            values = values + 1
    assert counter.count == 5
    assert values.sum().item() == 40
