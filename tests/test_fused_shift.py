"""The fused shift Pointer-Unit loop (`pointer_update="shift"`, `panm_hf::shift_recurrence`) against the eager loop."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import BACKBONES, OpNames
from test_fused_recurrence import SHAPES, TOLERANCE, assert_fused_equals_eager, needs_kernel

from panm_hf import PanmConfig, PanmForSeq2SeqLM, PanmMemory, PanmMemoryConfig
from panm_hf.pointer_unit import PointerUnits

LEAVES = ("pointers", "hidden", "address_bank", "previous_weights")


def shift_units_and_inputs(units, batch, slots, steps, *, dtype, scoring="cosine", reach=1, bits=5, size=8):
    """Shift Pointer Units with random parameters (the moves' head too), and inputs with padding (row 1 short, row 2
    all padding) and previous weights `w_0`: one-hot on row 0 (as `PanmMemory.initial_state` gives them), random
    elsewhere."""
    torch.manual_seed(0)
    config = PanmMemoryConfig(address_bits=bits, num_pointer_units=units, pointer_hidden_size=size, mlp_hidden_size=6,
                              scoring=scoring, pointer_update="shift", shift_range=reach)  # fmt: skip
    module = PointerUnits(config).to(dtype)
    with torch.no_grad():  # move off the init (a zero head, zero sharpening) so every path matters
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    bank = torch.randint(0, 2, (batch, slots, bits)).to(dtype)
    mask = torch.ones(batch, slots, dtype=torch.bool)
    if batch > 1:
        mask[1, slots // 2 :] = False
    if batch > 2:
        mask[2] = False
    previous = torch.softmax(torch.randn(batch, units, slots, dtype=dtype), dim=-1)  # (batch, units, slots)
    previous[0] = torch.nn.functional.one_hot(torch.arange(units) % slots, slots).to(dtype)
    inputs = dict(pointers=torch.rand(batch, units, bits, dtype=dtype), address_bank=bank, mask=mask, steps=steps,
                  hidden=torch.randn(batch, units, size, dtype=dtype), previous_weights=previous)  # fmt: skip
    return module, inputs


def run(module, kernel, inputs):
    """One forward under `kernel`, the keys from the module's own `g^a`."""
    module.recurrence_kernel = kernel
    keys = module.address_keys(inputs["address_bank"])
    return module(inputs["pointers"], inputs["hidden"], inputs["address_bank"], keys, inputs["mask"], inputs["steps"],
                  inputs["previous_weights"])  # fmt: skip


def values_and_grads(module, kernel, inputs, used=None):
    """Outputs, and gradients of a random projection of them (the first `used` outputs; all by default) w.r.t.
    every input (`w_0` too) and parameter."""
    leaves = {name: inputs[name].clone().requires_grad_() for name in LEAVES}
    outputs = run(module, kernel, {**inputs, **leaves})
    generator = torch.Generator().manual_seed(1)
    projections = [torch.randn(out.shape, generator=generator, dtype=out.dtype).to(out.device) for out in outputs]
    loss = sum((out * projection).sum() for out, projection in list(zip(outputs, projections))[:used])
    named = list(leaves.items()) + list(module.named_parameters())
    grads = torch.autograd.grad(loss, [tensor for _, tensor in named])
    return outputs, {name: grad for (name, _), grad in zip(named, grads)}


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_shift_equals_eager_in_values_and_every_gradient(shape, scoring, dtype):
    reach = 2 if shape[2] > 5 else 1  # K = 2 where the slots leave room to move by two
    module, inputs = shift_units_and_inputs(*shape, dtype=dtype, scoring=scoring, reach=reach)
    # 4 inputs, GRU, g^a MLP, the moves' head and the sharpening (+ temperature)
    assert_fused_equals_eager(module, inputs, shape, dtype, min_grads=15, run_both=values_and_grads)


@needs_kernel
def test_fused_shift_past_the_softplus_threshold_and_with_sharp_moves():
    """A sharpening past softplus's threshold (20) and a head sure of one move (mixtures exactly 0: the clamp)."""
    module, inputs = shift_units_and_inputs(2, 4, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        module.arithmetic_head.sharpening[0] = 25.0
        module.arithmetic_head.bias[1, 0] = 60.0  # unit 1: "+1" nearly always
    eager_out, eager_grads = values_and_grads(module, "eager", inputs)
    fused_out, fused_grads = values_and_grads(module, "fused", inputs)
    torch.testing.assert_close(fused_out, eager_out, **TOLERANCE[torch.float64])
    for name, grad in eager_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, **TOLERANCE[torch.float64], msg=name)


@needs_kernel
def test_fused_shift_continues_from_a_state_as_one_longer_call():
    module, inputs = shift_units_and_inputs(2, 4, 7, 6, dtype=torch.float64)
    whole = run(module, "fused", inputs)
    first = run(module, "fused", {**inputs, "steps": 2})
    state = {"pointers": first[1], "hidden": first[2], "previous_weights": first[0][:, -1], "steps": 4}
    second = run(module, "fused", {**inputs, **state})
    eager_second = run(module, "eager", {**inputs, **state})
    torch.testing.assert_close(torch.cat([first[0], second[0]], dim=1), whole[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(second[1:], whole[1:], atol=1e-12, rtol=0)
    torch.testing.assert_close(second, eager_second, atol=1e-12, rtol=0)


def _op_arguments(module, inputs, keys):
    cell, head = module.cell, module.arithmetic_head
    tau = module.scorer.inverse_temperature if module.scorer.scoring == "cosine" else None
    return [inputs["pointers"], inputs["hidden"], keys, inputs["address_bank"], inputs["mask"], cell.input_gates.weight,
            cell.input_gates.bias, cell.hidden_gates.weight, cell.hidden_gates.bias, tau, inputs["previous_weights"],
            head.weight, head.bias, head.sharpening, inputs["steps"]]  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
def test_gradcheck_of_the_fused_shift_op_in_float64(scoring):
    module, inputs = shift_units_and_inputs(2, 3, 5, 3, dtype=torch.float64, scoring=scoring, size=4, bits=3)
    args = _op_arguments(module, inputs, module.address_keys(inputs["address_bank"]))
    differentiable = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor) and arg.is_floating_point()]
    leaves = [args[i].detach().clone().requires_grad_() for i in differentiable]

    def fused(*tensors):
        call = list(args)
        for i, tensor in zip(differentiable, tensors):
            call[i] = tensor
        return torch.ops.panm_hf.shift_recurrence(*call)[:3]

    assert len(leaves) == (13 if scoring == "cosine" else 12)
    assert torch.autograd.gradcheck(fused, leaves, eps=1e-6, atol=1e-6)


@needs_kernel
def test_the_shift_op_passes_torch_library_opcheck():
    module, inputs = shift_units_and_inputs(2, 3, 5, 3, dtype=torch.float64)
    keys = module.address_keys(inputs["address_bank"]).detach().requires_grad_()
    args = _op_arguments(module, {**inputs, "previous_weights": inputs["previous_weights"].requires_grad_()}, keys)
    torch.library.opcheck(torch.ops.panm_hf.shift_recurrence.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))  # fmt: skip


@needs_kernel
def test_fused_shift_loop_is_one_op_forward_and_a_fixed_few_backward():
    names = {}
    for steps in (2, 9):
        module, inputs = shift_units_and_inputs(2, 3, 6, steps, dtype=torch.float32)
        module.recurrence_kernel = "fused"
        keys = module.address_keys(inputs["address_bank"]).detach().requires_grad_()
        counter = OpNames()
        with counter:
            weights, _, _ = module(inputs["pointers"], inputs["hidden"], inputs["address_bank"], keys, inputs["mask"],
                                   steps, inputs["previous_weights"])  # fmt: skip
        assert counter.names == ["panm_hf.shift_recurrence.default"]
        counter.names.clear()
        with counter:
            weights.sum().backward()
        names[steps] = counter.names
    assert names[2] == names[9]  # nothing per step
    assert names[9].count("panm_hf.shift_recurrence_backward.default") == 1
    assert names[9].count("aten.bmm.default") == 2 and len(names[9]) <= 20  # + the loss, views, grad accumulation


@needs_kernel
def test_panm_memory_shift_training_step_is_the_same_with_either_kernel():
    """The whole memory with shift pointers (one-hot `w_0` from `initial_state`), training mode: every gradient."""
    results = {}
    for kernel in ("eager", "fused"):
        torch.manual_seed(0)
        config = PanmMemoryConfig(address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                  pointer_update="shift", recurrence_kernel=kernel)  # fmt: skip
        memory = PanmMemory(config, memory_dim=6, decoder_input_size=5, output_size=4).double().train()
        with torch.no_grad():
            memory.pointer_units.arithmetic_head.weight.normal_(0, 0.5)
        states = torch.randn(3, 7, 6, dtype=torch.float64)
        mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5])
        decoder = torch.randn(3, 5, 5, dtype=torch.float64)
        out = memory(states, decoder, attention_mask=mask, base_address=torch.tensor([3, 60, 17]))
        loss = out.hidden_states.square().sum() + out.state.pointer_weights.sum()
        grads = torch.autograd.grad(loss, list(memory.parameters()))
        results[kernel] = (out.hidden_states, dict(zip([n for n, _ in memory.named_parameters()], grads)))
    torch.testing.assert_close(results["fused"][0], results["eager"][0], atol=1e-10, rtol=1e-9)
    for name, grad in results["eager"][1].items():
        torch.testing.assert_close(results["fused"][1][name], grad, atol=1e-10, rtol=1e-9, msg=name)


@needs_kernel
def test_seq2seq_shift_generation_is_the_same_with_either_kernel():
    """The examples' design (shift, decoder content read, stacked): cached greedy tokens and a training loss."""
    models = {}
    for kernel in ("eager", "auto"):
        torch.manual_seed(0)
        config = PanmConfig(text_config=BACKBONES["bart"]().to_dict(), placement="stack", content_read="decoder",
                            pointer_update="shift", address_bits=6, pointer_hidden_size=12, controller_hidden_size=12,
                            mlp_hidden_size=10, recurrence_kernel=kernel)  # fmt: skip
        models[kernel] = PanmForSeq2SeqLM(config).eval()
    models["auto"].load_state_dict(models["eager"].state_dict())
    source = torch.randint(4, 99, (3, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(source)
    mask[1, 5:] = 0
    labels = torch.randint(4, 99, (3, 6), generator=torch.Generator().manual_seed(1))
    outputs = {}
    for kernel, model in models.items():
        tokens = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                                do_sample=False)  # fmt: skip
        outputs[kernel] = (tokens, model(input_ids=source, attention_mask=mask, labels=labels).loss)
    assert torch.equal(outputs["auto"][0], outputs["eager"][0])
    torch.testing.assert_close(outputs["auto"][1], outputs["eager"][1], atol=1e-5, rtol=1e-5)


TRITON_RUN = """
import torch
from test_fused_shift import shift_units_and_inputs, values_and_grads

worst = {}
for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
    # the last case uses the attention weights alone: the final pointer and state have no gradient (None)
    for shape, scoring, reach, used in (((2, 3, 6, 4), "cosine", 1, None), ((3, 4, 9, 3), "dot", 2, None),
                                        ((1, 2, 5, 3), "cosine", 2, None), ((2, 3, 6, 4), "dot", 1, 1)):
        module, inputs = shift_units_and_inputs(*shape, dtype=dtype, scoring=scoring, reach=reach, size=40)
        triton_out, triton_grads = values_and_grads(module, "triton", inputs, used)
        c_out, c_grads = values_and_grads(module, "fused", inputs, used)
        eager_out, eager_grads = values_and_grads(module, "eager", inputs, used)
        ours = [*triton_out, *triton_grads.values()]
        for refs, scale in (([*c_out, *c_grads.values()], 1), ([*eager_out, *eager_grads.values()], 10)):
            for mine, ref in zip(ours, refs, strict=True):
                assert mine.shape == ref.shape
                close = torch.allclose(mine, ref, atol=tolerance * scale, rtol=tolerance * scale)
                assert close, (mine - ref).abs().max()
        worst[(dtype, shape, used)] = max((a - b).abs().max().item() for a, b in zip(ours, [*c_out, *c_grads.values()]))
print(worst)
print("OK")
"""


@needs_kernel
@pytest.mark.triton  # `make test` deselects it; `make test-triton` installs Triton and runs it
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_shift_port_matches_the_c_kernel_and_eager_under_the_interpreter():
    """`recurrence_kernel="triton"` with shift pointers on CPU tensors (Triton's interpreter): values and gradients
    against the C kernel and the eager loop, float64 and float32, hidden 40 (past one block of `W_h` rows)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, for panm_hf
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    result = subprocess.run([sys.executable, "-c", TRITON_RUN], capture_output=True, text=True, env=env, timeout=600,
                            cwd=os.path.dirname(__file__))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")
