"""The fused recurrences (`recurrence_kernel="fused"`) against the references: the eager Pointer-Unit loop, `nn.GRU`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import OpNames

from panm_hf import PanmMemory, PanmMemoryConfig
from panm_hf.controller import Controller
from panm_hf.kernels import dispatch, loader
from panm_hf.pointer_unit import PointerUnits

REASON = dispatch.unavailable_reason(torch.float64, torch.device("cpu"))
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"fused kernel unavailable: {REASON}")
TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-9), torch.float32: dict(atol=2e-5, rtol=2e-4)}
# (units, batch, slots, steps): the paper's 2 units, one unit, three (a middle pointer), a batch past the tile of 8
SHAPES = [(2, 3, 6, 4), (1, 2, 5, 3), (3, 4, 9, 7), (2, 11, 4, 2)]


def units_and_inputs(units, batch, slots, steps, *, dtype, scoring="cosine", seed=0, bits=5, size=8):
    """Pointer Units with random parameters, and inputs with padding (row 1 short, row 2 all padding)."""
    torch.manual_seed(seed)
    config = PanmMemoryConfig(address_bits=bits, num_pointer_units=units, pointer_hidden_size=size,
                              mlp_hidden_size=6, scoring=scoring)  # fmt: skip
    module = PointerUnits(config).to(dtype)
    with torch.no_grad():  # move off the init (zero-ish biases, fixed temperature) so every path matters
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    bank = torch.randint(0, 2, (batch, slots, bits)).to(dtype)
    mask = torch.ones(batch, slots, dtype=torch.bool)
    if batch > 1:
        mask[1, slots // 2 :] = False
    if batch > 2:
        mask[2] = False
    pointers = torch.rand(batch, units, bits, dtype=dtype)
    hidden = torch.randn(batch, units, size, dtype=dtype)
    return module, dict(pointers=pointers, hidden=hidden, address_bank=bank, mask=mask, steps=steps)


def run(module, kernel, inputs, *, keys=None):
    """One forward (keys from the module's own `g^a` unless given) under `kernel`."""
    module.recurrence_kernel = kernel
    keys = module.address_keys(inputs["address_bank"]) if keys is None else keys
    return module(inputs["pointers"], inputs["hidden"], inputs["address_bank"], keys, inputs["mask"], inputs["steps"])


def values_and_grads(module, kernel, inputs):
    """Outputs, and gradients of a random projection of them w.r.t. every input and parameter."""
    leaves = {name: inputs[name].clone().requires_grad_() for name in ("pointers", "hidden", "address_bank")}
    run_inputs = {**inputs, **leaves}
    outputs = run(module, kernel, run_inputs)
    generator = torch.Generator().manual_seed(1)
    loss = sum((out * torch.randn(out.shape, generator=generator, dtype=out.dtype)).sum() for out in outputs)
    named = list(leaves.items()) + list(module.named_parameters())
    grads = torch.autograd.grad(loss, [tensor for _, tensor in named])
    return outputs, {name: grad for (name, _), grad in zip(named, grads)}


def assert_fused_equals_eager(module, inputs, shape, dtype, min_grads: int, run_both=None) -> None:
    """The fused loop against the eager one: every output and every gradient (none of them vacuous), exact zeros
    on padded slots and on the all-padding row. `run_both` is the suite's `values_and_grads`."""
    run_both = run_both or values_and_grads
    eager_out, eager_grads = run_both(module, "eager", inputs)
    fused_out, fused_grads = run_both(module, "fused", inputs)
    for eager, fused in zip(eager_out, fused_out, strict=True):
        assert fused.shape == eager.shape
        torch.testing.assert_close(fused, eager, **TOLERANCE[dtype])
    assert set(fused_grads) == set(eager_grads) and len(fused_grads) >= min_grads
    for name, grad in eager_grads.items():
        assert grad.abs().sum() > 0 or name == "address_bank", f"{name} gets no gradient: the test would be vacuous"
        torch.testing.assert_close(fused_grads[name], grad, **TOLERANCE[dtype], msg=lambda m, n=name: f"{n}: {m}")
    padded = fused_out[0][1, :, :, inputs["address_bank"].shape[1] // 2 :]
    assert torch.equal(padded, torch.zeros_like(padded))  # exact zeros on padding, all-padding row too
    if shape[1] > 2:
        assert torch.equal(fused_out[0][2], torch.zeros_like(fused_out[0][2]))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_equals_eager_in_values_and_every_gradient(shape, scoring, dtype):
    module, inputs = units_and_inputs(*shape, dtype=dtype, scoring=scoring)
    assert_fused_equals_eager(module, inputs, shape, dtype, min_grads=11)  # 3 inputs, GRU, g^a MLP (+ temperature)


@needs_kernel
def test_fused_continues_from_a_state_as_one_longer_call():
    module, inputs = units_and_inputs(2, 4, 7, 6, dtype=torch.float64)
    whole = run(module, "fused", inputs)
    first = run(module, "fused", {**inputs, "steps": 2})
    second = run(module, "fused", {**inputs, "pointers": first[1], "hidden": first[2], "steps": 4})
    eager_second = run(module, "eager", {**inputs, "pointers": first[1], "hidden": first[2], "steps": 4})
    torch.testing.assert_close(torch.cat([first[0], second[0]], dim=1), whole[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(second[1:], whole[1:], atol=1e-12, rtol=0)
    torch.testing.assert_close(second, eager_second, atol=1e-12, rtol=0)


@needs_kernel
@pytest.mark.parametrize("scoring", ["cosine", "dot"])
def test_gradcheck_of_the_fused_op_in_float64(scoring):
    module, inputs = units_and_inputs(2, 3, 4, 3, dtype=torch.float64, scoring=scoring, size=4, bits=3)
    cell = module.cell
    keys = module.address_keys(inputs["address_bank"]).detach()
    tau = module.scorer.inverse_temperature.detach().clone() if scoring == "cosine" else None
    leaves = [inputs["pointers"], inputs["hidden"], keys, inputs["address_bank"], cell.input_gates.weight.detach(),
              cell.input_gates.bias.detach(), cell.hidden_gates.weight.detach(), cell.hidden_gates.bias.detach()]
    leaves = [leaf.clone().requires_grad_() for leaf in leaves]
    if tau is not None:
        leaves.append(tau.requires_grad_())

    def fused(pointers, hidden, keys, bank, w_i, b_i, w_h, b_h, tau=None):
        outputs = torch.ops.panm_hf.pointer_recurrence(pointers, hidden, keys, bank, inputs["mask"], w_i, b_i, w_h,
                                                       b_h, tau, inputs["steps"])  # fmt: skip
        return outputs[:3]

    assert torch.autograd.gradcheck(fused, leaves, eps=1e-6, atol=1e-6)


@needs_kernel
def test_the_custom_ops_pass_torch_library_opcheck():
    module, inputs = units_and_inputs(2, 3, 5, 3, dtype=torch.float64)
    cell = module.cell
    keys = module.address_keys(inputs["address_bank"]).detach().requires_grad_()
    args = (inputs["pointers"].requires_grad_(), inputs["hidden"].requires_grad_(), keys, inputs["address_bank"],
            inputs["mask"], cell.input_gates.weight, cell.input_gates.bias, cell.hidden_gates.weight,
            cell.hidden_gates.bias, module.scorer.inverse_temperature, inputs["steps"])  # fmt: skip
    torch.library.opcheck(torch.ops.panm_hf.pointer_recurrence.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))  # fmt: skip


@needs_kernel
def test_fused_loop_is_one_op_forward_and_a_fixed_few_backward():
    """Forward: the one custom op. Backward: its kernel plus the two weight-gradient GEMMs, whatever the steps."""
    names = {}
    for steps in (2, 9):
        module, inputs = units_and_inputs(2, 3, 6, steps, dtype=torch.float32)
        keys = module.address_keys(inputs["address_bank"]).detach().requires_grad_()
        counter = OpNames()
        with counter:
            weights, _, _ = run(module, "fused", inputs, keys=keys)
        assert counter.names == ["panm_hf.pointer_recurrence.default"]
        loss = weights.sum()
        counter.names.clear()
        with counter:
            loss.backward()
        names[steps] = counter.names
    assert names[2] == names[9]  # nothing per step
    assert names[9].count("panm_hf.pointer_recurrence_backward.default") == 1
    assert names[9].count("aten.bmm.default") == 2 and len(names[9]) <= 16  # + the loss, views, grad accumulation


@needs_kernel
def test_panm_memory_training_step_is_the_same_with_either_kernel():
    """The whole memory (bind, Pointer Units, reads, Controller) in training mode: loss and every gradient."""
    results = {}
    for kernel in ("eager", "fused"):
        torch.manual_seed(0)
        config = PanmMemoryConfig(address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                  recurrence_kernel=kernel)  # fmt: skip
        memory = PanmMemory(config, memory_dim=6, decoder_input_size=5, output_size=4).double().train()
        states = torch.randn(3, 7, 6, dtype=torch.float64)
        mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 2 + [1] * 5])
        decoder = torch.randn(3, 5, 5, dtype=torch.float64)
        out = memory(states, decoder, attention_mask=mask, base_address=torch.tensor([3, 60, 17]))
        loss = out.hidden_states.square().sum()
        grads = torch.autograd.grad(loss, list(memory.parameters()))
        results[kernel] = (out.hidden_states, dict(zip([n for n, _ in memory.named_parameters()], grads)))
    torch.testing.assert_close(results["fused"][0], results["eager"][0], atol=1e-10, rtol=1e-9)
    for name, grad in results["eager"][1].items():
        torch.testing.assert_close(results["fused"][1][name], grad, atol=1e-10, rtol=1e-9, msg=name)


def test_auto_falls_back_to_eager_where_the_kernel_does_not_apply():
    module, inputs = units_and_inputs(2, 3, 5, 4, dtype=torch.float32)
    keys = module.address_keys(inputs["address_bank"])
    args = (inputs["pointers"], inputs["hidden"], inputs["address_bank"], keys)
    steps, slots = inputs["steps"], inputs["address_bank"].shape[1]
    per_step = inputs["mask"].unsqueeze(1).expand(-1, steps, -1)  # (batch, steps, slots)
    assert "per-step" in module.fused_unavailable_reason(*args, per_step)
    assert "per-step" in module.fused_unavailable_reason(*args, inputs["mask"], torch.ones(3, steps, dtype=torch.bool))
    half = [tensor.to(torch.bfloat16) for tensor in args]
    assert "dtype" in module.fused_unavailable_reason(*half, inputs["mask"])
    assert "device" in dispatch.unavailable_reason(torch.float32, torch.device("meta"))
    # auto with a per-step mask runs (eagerly) and matches eager
    module.recurrence_kernel = "auto"
    auto = module(*args, per_step, steps)
    module.recurrence_kernel = "eager"
    torch.testing.assert_close(auto, module(*args, per_step, steps), atol=0, rtol=0)
    assert auto[0].shape == (3, steps, 2, slots)


def test_no_compiler_gives_a_reason_and_auto_runs_eager(monkeypatch):
    monkeypatch.setattr(loader, "find_compiler", lambda: None)
    loader.load_library.cache_clear()
    try:
        reason = dispatch.unavailable_reason(torch.float32, torch.device("cpu"))
        assert reason is not None and "compiler" in reason
        module, inputs = units_and_inputs(2, 3, 5, 4, dtype=torch.float32)
        assert run(module, "auto", inputs)[0].shape == (3, 4, 2, 5)
        with pytest.raises(ValueError, match="compiler"):
            run(module, "fused", inputs)
    finally:
        loader.load_library.cache_clear()


def test_recurrence_kernel_knob_is_validated():
    assert PanmMemoryConfig().recurrence_kernel == "auto"
    with pytest.raises(ValueError, match="recurrence_kernel"):
        PanmMemoryConfig(recurrence_kernel="cuda")
    PanmMemoryConfig(recurrence_kernel="fused", pointer_update="shift")  # "shift" has its fused kernel too
    module, inputs = units_and_inputs(2, 3, 5, 4, dtype=torch.float32)
    per_step = inputs["mask"].unsqueeze(1).expand(-1, 4, -1)
    keys = module.address_keys(inputs["address_bank"])
    module.recurrence_kernel = "fused"
    with pytest.raises(ValueError, match="per-step masks"):
        module(inputs["pointers"], inputs["hidden"], inputs["address_bank"], keys, per_step, 4)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch, steps, with_step_mask", [(3, 5, False), (11, 2, False), (4, 6, True)])
def test_fused_controller_gru_equals_nn_gru(batch, steps, with_step_mask, dtype):
    torch.manual_seed(0)
    config = PanmMemoryConfig(controller_hidden_size=7, mlp_hidden_size=5)
    controller = Controller(config, read_size=6, decoder_input_size=3, memory_dim=4, output_size=2).to(dtype)
    reads = torch.randn(batch, steps, 6, dtype=dtype, requires_grad=True)
    decoder = torch.randn(batch, steps, 3, dtype=dtype, requires_grad=True)
    hidden = torch.randn(batch, 7, dtype=dtype, requires_grad=True)
    step_mask = None
    if with_step_mask:  # a prefix of real steps per row (causal decoding)
        step_mask = torch.arange(steps).unsqueeze(0) < torch.tensor([steps, 2, 0, 5]).unsqueeze(1)
    results = {}
    for kernel in ("eager", "fused"):
        controller.recurrence_kernel = kernel
        outputs, last, _ = controller(reads, decoder, hidden, step_mask=step_mask)
        generator = torch.Generator().manual_seed(1)
        loss = (outputs * torch.randn(outputs.shape, generator=generator, dtype=dtype)).sum() + last.square().sum()
        leaves = [reads, decoder, hidden, *controller.parameters()]
        results[kernel] = (outputs, last, torch.autograd.grad(loss, leaves, allow_unused=True))
    torch.testing.assert_close(results["fused"][:2], results["eager"][:2], **TOLERANCE[dtype])
    for fused, eager in zip(results["fused"][2], results["eager"][2]):
        if eager is None:  # the initial-state projection is not used by forward
            assert fused is None
            continue
        torch.testing.assert_close(fused, eager, **TOLERANCE[dtype])


@needs_kernel
def test_gradcheck_of_the_fused_gru_op_in_float64():
    torch.manual_seed(0)
    leaves = [torch.randn(3, 4, 9, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64),
              0.5 * torch.randn(9, 3, dtype=torch.float64), torch.randn(9, dtype=torch.float64)]  # fmt: skip
    leaves = [leaf.requires_grad_() for leaf in leaves]
    assert torch.autograd.gradcheck(lambda *args: torch.ops.panm_hf.gru_recurrence(*args)[:2], leaves)
    torch.library.opcheck(torch.ops.panm_hf.gru_recurrence.default, leaves,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))  # fmt: skip


def test_fused_controller_raises_or_falls_back_where_it_cannot_run():
    config = PanmMemoryConfig(controller_hidden_size=4, mlp_hidden_size=4, recurrence_kernel="fused")
    controller = Controller(config, read_size=3, decoder_input_size=0, memory_dim=4, output_size=2)
    reads, hidden = torch.randn(2, 3, 3, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    assert "dtype" in controller.fused_unavailable_reason(reads, hidden)
    with pytest.raises(ValueError, match="Controller GRU"):
        controller(reads, None, hidden)
    controller.recurrence_kernel = "auto"
    outputs, _, _ = controller(reads.float(), None, hidden.float())
    assert outputs.shape == (2, 3, 2)


TRITON_CHECK = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels run on CPU tensors
import torch
from panm_hf import PanmMemoryConfig
from panm_hf.pointer_unit import PointerUnits
from panm_hf.kernels.triton_port import pointer_backward_triton, pointer_forward_triton

torch.manual_seed(0)
worst = {}
for scoring in ("cosine", "dot"):
    for dtype in (torch.float64, torch.float32):
        U, B, S, T, NB, H = 2, 3, 9, 4, 6, 40  # H > one block of W_h rows
        config = PanmMemoryConfig(address_bits=NB, num_pointer_units=U, pointer_hidden_size=H, scoring=scoring)
        pu = PointerUnits(config).to(dtype)
        with torch.no_grad():
            for p in pu.parameters():
                p.add_(0.3 * torch.randn_like(p))
        bank = torch.randint(0, 2, (B, S, NB)).to(dtype)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[1, 4:] = False
        mask[2] = False
        keys = pu.address_keys(bank).detach()
        c = pu.cell
        tau = pu.scorer.inverse_temperature.detach() if scoring == "cosine" else None
        args = (torch.rand(B, U, NB, dtype=dtype), torch.randn(B, U, H, dtype=dtype), keys, bank, mask,
                c.input_gates.weight.detach(), c.input_gates.bias.detach(), c.hidden_gates.weight.detach(),
                c.hidden_gates.bias.detach(), tau, T)
        ref, tri = torch.ops.panm_hf.pointer_recurrence(*args), pointer_forward_triton(*args)
        grads = (torch.randn(B, T, U, S, dtype=dtype), torch.randn(B, U, NB, dtype=dtype),
                 torch.randn(B, U, H, dtype=dtype))
        bargs = (*grads, keys, bank, mask, c.input_gates.weight.detach(), c.hidden_gates.weight.detach(), tau,
                 *ref[3:])
        ref_b, tri_b = torch.ops.panm_hf.pointer_recurrence_backward(*bargs), pointer_backward_triton(*bargs)
        pairs = list(zip(ref, tri)) + list(zip(ref_b, tri_b))
        for absent in range(3):  # an output the loss does not use: no gradient, read by the kernel as zeros
            zeros = [g if i != absent else torch.zeros_like(g) for i, g in enumerate(grads)]
            nones = [g if i != absent else None for i, g in enumerate(grads)]
            pairs += zip(torch.ops.panm_hf.pointer_recurrence_backward(*zeros, *bargs[3:]),
                         pointer_backward_triton(*nones, *bargs[3:]))  # fmt: skip
        assert all(a.shape == b.shape for a, b in pairs)
        worst[f"{scoring}-{dtype}"] = max((a - b).abs().max().item() for a, b in pairs)
print(worst)
assert all(v < (1e-12 if "float64" in k else 2e-5) for k, v in worst.items()), worst
print("OK")
"""


@needs_kernel
@pytest.mark.triton  # `make test` deselects it; `make test-triton` installs Triton and runs it
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_port_matches_the_c_kernel_under_the_interpreter():
    """The CUDA (Triton) kernels, run by Triton's interpreter on CPU tensors, against the C kernel: all outputs."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


TRITON_GRU_CHECK = """
import torch
from panm_hf import PanmMemoryConfig
from panm_hf.controller import Controller

worst = {}
for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
    for batch, steps, size in ((3, 5, 7), (4, 6, 40)):  # 40: past one block of W_hh columns
        torch.manual_seed(0)
        config = PanmMemoryConfig(controller_hidden_size=size, mlp_hidden_size=5)
        controller = Controller(config, read_size=6, decoder_input_size=3, memory_dim=4, output_size=2).to(dtype)
        leaves = [torch.randn(batch, steps, 6, dtype=dtype), torch.randn(batch, steps, 3, dtype=dtype),
                  torch.randn(batch, size, dtype=dtype)]
        leaves = [leaf.requires_grad_() for leaf in leaves]
        for uses_last in (True, False):  # without the last state in the loss its gradient is absent (None)
            results = {}
            for kernel in ("eager", "fused", "triton"):
                controller.recurrence_kernel = kernel
                outputs, last, _ = controller(*leaves)
                projection = torch.randn(outputs.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
                loss = (outputs * projection).sum() + (last.square().sum() if uses_last else 0)
                grads = torch.autograd.grad(loss, [*leaves, *controller.parameters()], allow_unused=True)
                results[kernel] = [outputs, last, *[g for g in grads if g is not None]]
            assert len(results["triton"]) == len(results["fused"]) == 13  # 2 outputs, 3 inputs, GRU (4), g^o (4)
            for ref, scale in ((results["fused"], 1), (results["eager"], 10)):
                for ours, theirs in zip(results["triton"], ref, strict=True):
                    assert torch.allclose(ours, theirs, atol=tolerance * scale, rtol=tolerance * scale)
            worst[(dtype, size, uses_last)] = max((a - b).abs().max().item()
                                                  for a, b in zip(results["triton"], results["fused"]))  # fmt: skip
print(worst)
print("OK")
"""


@needs_kernel
@pytest.mark.triton  # `make test` deselects it; `make test-triton` installs Triton and runs it
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_controller_gru_matches_the_c_kernel_and_nn_gru_under_the_interpreter():
    """`recurrence_kernel="triton"`'s Controller GRU (its Triton port) against the C kernel and `nn.GRU`: outputs,
    last state and every gradient, float64 and float32."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, for panm_hf
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    result = subprocess.run([sys.executable, "-c", TRITON_GRU_CHECK], capture_output=True, text=True, env=env,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def test_cuda_takes_the_triton_kernel_under_auto_when_triton_imports(monkeypatch):
    cuda = torch.device("cuda")
    assert "dtype" in dispatch.unavailable_reason(torch.float16, cuda)
    assert "dtype" in dispatch.unavailable_reason(torch.bfloat16, cuda)
    # without Triton, "auto" on CUDA gets a reason naming it (and so falls back to the eager loop)
    monkeypatch.setattr(dispatch, "register_triton", lambda: "the CUDA kernel needs Triton (missing)")
    assert "Triton" in dispatch.unavailable_reason(torch.float32, cuda)
    monkeypatch.setattr(dispatch, "register_triton", lambda: None)
    assert dispatch.unavailable_reason(torch.float32, cuda) is None
    assert dispatch.unavailable_reason(torch.float64, cuda) is None


def test_an_unwritable_cache_gives_a_reason_not_an_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PANM_HF_CACHE", str(blocker / "cache"))  # under a file: mkdir fails
    loader.load_library.cache_clear()
    try:
        reason = dispatch.unavailable_reason(torch.float32, torch.device("cpu"))
        assert reason is not None and "PANM_HF_CACHE" in reason
    finally:
        loader.load_library.cache_clear()
