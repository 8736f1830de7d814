"""The Triton ports of PANM's reads (`kernels/triton_reads.py`: cosine normalisation, the Mode-2 read, `h^c_0`'s
pooling) against their C kernels under Triton's interpreter, on values and gradients, float64 and float32; and
`recurrence_kernel="triton"` running them inside a whole `PanmMemory` training step against `"eager"`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from panm_hf.kernels import dispatch

pytestmark = [
    pytest.mark.triton,  # `make test` deselects these; `make test-triton` installs Triton and runs them
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
    pytest.mark.skipif(
        dispatch.unavailable_reason(dispatch.torch.float64, dispatch.torch.device("cpu")) is not None,
        reason="no C kernel to compare against",
    ),
]

OPS_CHECK = """
import torch
from panm_hf.kernels import loader
from panm_hf.kernels import triton_reads as tr

assert loader.register_triton() is None
gen = torch.Generator().manual_seed(0)

def randn(*shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=dtype)

def close(ours, ref, tolerance, what):
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    assert torch.allclose(ours, ref, atol=tolerance, rtol=tolerance), (what, (ours - ref).abs().max().item())

for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
    # normalize_rows: plain rows (with a zero and a below-eps row), with and without a scale, and the swapped keys
    x = randn(3, 5, 37, dtype=dtype)  # 15 rows: a partial block of rows; 37: a partial block of columns
    x[0, 1] = 0
    x[2, 4] = 1e-14
    scale = torch.tensor(2.5, dtype=dtype)
    for s in (scale, None):
        ref, ours = loader.normalize_rows(x, s), tr.normalize_rows_triton(x, s)
        for a, b in zip(ours, ref):
            close(a, b, tolerance, "normalize forward")
        dy = randn(*x.shape, dtype=dtype)
        for a, b in zip(tr.normalize_rows_backward_triton(dy, x, s, ref[1], 0),
                        loader.normalize_rows_backward(dy, x, s, ref[1], 0)):
            close(a, b, tolerance * 10, "normalize backward")
    units, batch, slots, hidden = 2, 3, 7, 12
    keys = randn(units, batch * slots, hidden, dtype=dtype)
    ref, ours = loader.normalize_rows(keys, None, batch), tr.normalize_rows_triton(keys, None, batch)
    assert ref[0].shape == (batch, units, slots, hidden)
    for a, b in zip(ours, ref):
        close(a, b, tolerance, "swapped normalize forward")
    dy = randn(batch, units, slots, hidden, dtype=dtype)
    for a, b in zip(tr.normalize_rows_backward_triton(dy, keys, None, ref[1], batch),
                    loader.normalize_rows_backward(dy, keys, None, ref[1], batch)):
        close(a, b, tolerance * 10, "swapped normalize backward")

    # mode2_attention: cosine and dot, a short row, an all-padding row, a zero slot, gradients into the weights too
    batch, queries, slots, dim = 3, 5, 9, 20
    q, memory = randn(batch, queries, dim, dtype=dtype), randn(batch, slots, dim, dtype=dtype)
    memory[0, 2] = 0
    q[1, 3] = 0
    mask = torch.ones(batch, slots, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2] = False
    for s in (scale, None):
        ref, ours = loader.mode2_attention(q, memory, mask, s), tr.mode2_attention_triton(q, memory, mask, s)
        for a, b in zip(ours, ref):
            close(a, b, tolerance, "mode2 forward")
        dv, dw = randn(batch, queries, dim, dtype=dtype), randn(batch, queries, slots, dtype=dtype)
        for grads in ((dv, dw), (dv, None), (None, dw)):
            args = (*grads, q, memory, mask, s, *ref[1:])
            for a, b in zip(tr.mode2_attention_backward_triton(*args), loader.mode2_attention_backward(*args)):
                close(a, b, tolerance * 10, "mode2 backward")

    # masked_pool: mean and sum, more slots than one block, an all-padding row
    memory = randn(3, 41, 6, dtype=dtype)
    mask = torch.rand(3, 41, generator=gen) > 0.3
    mask[2] = False
    for mean in (True, False):
        close(tr.masked_pool_triton(memory, mask, mean), loader.masked_pool(memory, mask, mean), tolerance, "pool")
        grad = randn(3, 6, dtype=dtype)
        close(tr.masked_pool_backward_triton(grad, mask, mean), loader.masked_pool_backward(grad, mask, mean),
              tolerance, "pool backward")
print("OK")
"""

STEP_CHECK = """
import torch
from test_fused_reads import TOLERANCE, content_read_step, training_step

for scoring, init in (("cosine", "mean"), ("dot", "sum")):
    for dtype in (torch.float64, torch.float32):
        eager, eager_grads, _ = training_step("eager", scoring=scoring, controller_init=init, dtype=dtype)
        ours, our_grads, names = training_step("triton", scoring=scoring, controller_init=init, dtype=dtype,
                                               count=True)
        for name in ("hidden_states", "address_attentions", "mode2_attentions"):
            torch.testing.assert_close(getattr(ours, name), getattr(eager, name), **TOLERANCE[dtype])
        for name, grad in eager_grads.items():
            torch.testing.assert_close(our_grads[name], grad, **TOLERANCE[dtype], msg=name)
        ports = ["mode2_attention_triton", "masked_pool_triton", "address_bank_triton", "start_pointers_triton"] + (
            ["normalize_rows_triton"] * (scoring == "cosine"))  # fmt: skip
        for op in ports:
            assert f"panm_hf.{op}.default" in names, (op, sorted(set(names)))
        assert not [n for n in names if n.startswith("panm_hf.") and "triton" not in n], sorted(set(names))

# the decoder content read, with its keys from M and from each slot's distance to the end (content_read_keys)
for scoring, keys in (("cosine", "memory"), ("dot", "end_distance"), ("cosine", "end_distance_only")):
    for dtype in (torch.float64, torch.float32):
        eager, eager_grads, _ = content_read_step("eager", scoring=scoring, keys=keys, dtype=dtype)
        ours, our_grads, names = content_read_step("triton", scoring=scoring, keys=keys, dtype=dtype)
        for name in ("hidden_states", "content_attentions"):
            torch.testing.assert_close(getattr(ours, name), getattr(eager, name), **TOLERANCE[dtype])
        for our_grad, eager_grad in zip(our_grads, eager_grads, strict=True):
            torch.testing.assert_close(our_grad, eager_grad, **TOLERANCE[dtype])
        assert names.count("panm_hf.mode2_attention_triton.default") == 2, sorted(set(names))
print("OK")
"""


ADDRESS_CHECK = """
import torch
from panm_hf import PanmMemoryConfig
from panm_hf.kernels import triton_port
from panm_hf.memory import PanmMemory

torch.manual_seed(0)
for units, bits, dtype in ((2, 6, torch.float32), (3, 5, torch.float64), (4, 7, torch.float32), (1, 4, torch.float64)):
    config = PanmMemoryConfig(address_bits=bits, num_pointer_units=units, recurrence_kernel="eager")
    memory = PanmMemory(config, memory_dim=8, decoder_input_size=8, output_size=8).to(dtype)
    states = torch.randn(5, 9, 8, dtype=dtype)
    mask = torch.ones(5, 9, dtype=torch.long)
    mask[1, 6:], mask[2], mask[3, :4], mask[4, ::2] = 0, 0, 0, 0  # right padding, empty, left padding, holes
    base = torch.randint(0, 2**bits, (5,))
    results = {}
    for kernel in ("eager", "triton"):
        for module in memory.modules():
            if hasattr(module, "recurrence_kernel"):
                module.recurrence_kernel = kernel
        launches = triton_port.launches
        bound = memory.bind(states, mask, base_address=base)
        state = memory.initial_state(bound)
        results[kernel] = (bound.address_bank, bound.lengths, state.pointers, state.pointer_weights)
        # triton: the bank, the start, the pooling of h^c_0 (and the address keys' normalisation under cosine)
        assert triton_port.launches - launches == (0 if kernel == "eager" else 4), triton_port.launches - launches
        causal = memory.initial_state(bound, causal=True)  # the first slot alone: eager on every path
        results[kernel] += (causal.pointers, causal.pointer_weights)
    for ours, theirs in zip(results["triton"], results["eager"], strict=True):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (ours, theirs)
print("OK")
"""


def _run(script: str) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, for panm_hf
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600,
                            cwd=os.path.dirname(os.path.abspath(__file__)))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def test_triton_reads_match_the_c_kernels_under_the_interpreter():
    """Each port against its C kernel: every output and every gradient, padded, all-padding and zero rows."""
    _run(OPS_CHECK)


def test_triton_setting_runs_the_read_ports_in_a_training_step():
    """`recurrence_kernel="triton"`: a whole `PanmMemory` training step takes the read ports (they are dispatched)
    and gives eager's outputs and gradients."""
    _run(STEP_CHECK)


def test_triton_address_glue_equals_eager_under_the_interpreter():
    """The address bank and the Pointer Units' start (`triton_addressing`): exactly eager's codes, lengths, start
    pointers and one-hot weights, for right and left padding, holes and an empty sample; one launch each."""
    _run(ADDRESS_CHECK)
