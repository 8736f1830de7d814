"""`panm_hf.kernels.dispatch`: every fallback row gives its reason for its case, and `recurrence_kernel="triton"`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from panm_hf import PanmMemoryConfig
from panm_hf.kernels import dispatch
from panm_hf.kernels.dispatch import FALLBACKS, Call, decide, require

CPU, CUDA, META = torch.device("cpu"), torch.device("cuda"), torch.device("meta")
F32 = torch.float32
C_REASON = dispatch.unavailable_reason(torch.float64, CPU)
needs_c_kernel = pytest.mark.skipif(C_REASON is not None, reason=f"fused kernel unavailable: {C_REASON}")
_no_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
triton_stage = pytest.mark.triton  # `make test` deselects these; `make test-triton` installs Triton and runs them

# (op, call, the index of the FALLBACKS row that must decide it): one case per row
CASES = [
    ("pointer_recurrence", Call("eager", CPU, F32), 0),
    ("pointer_recurrence", Call("fused", CPU, F32, per_step=True), 1),
    ("mode2_read", Call("auto", CPU, F32, per_step=True), 2),
    ("address_bank", Call("auto", CUDA, F32, per_step=True), 3),  # distractor addresses in the bank
    ("start_pointers", Call("auto", CPU, F32), 4),  # no C twin: eager on the CPU path
    ("pointer_recurrence", Call("auto", CPU, F32, compiled_step=True), 5),
    ("controller_gru", Call("auto", CUDA, F32, controller_read=True), 6),
    ("controller_gru", Call("auto", CPU, F32, uniform=False), 7),
    ("mode2_read", Call("auto", CUDA, F32, uniform=False), 7),
    ("mode2_read", Call("auto", CUDA, F32, tile=512 * 512), 8),  # BERT-sized M: cuBLAS reads it
    ("pointer_recurrence", Call("auto", META, F32), 9),
    ("pointer_recurrence", Call("auto", CPU, torch.float16), 10),
    ("cosine_normalize", Call("auto", CUDA, torch.bfloat16), 10),
    ("controller_gru", Call("auto", CPU, F32), 11),  # with no C compiler (patched below)
    ("pointer_recurrence", Call("auto", CUDA, F32), 12),  # with no Triton (patched below)
    ("controller_pool", Call("auto", CUDA, F32), 12),  # with no Triton (patched below)
    ("pointer_recurrence", Call("triton", CPU, F32), 13),  # with the interpreter off (patched below)
    ("cosine_normalize", Call("triton", CPU, F32), 13),  # with the interpreter off (patched below)
]


def test_every_fallback_row_gives_its_reason_for_its_case(monkeypatch):
    monkeypatch.setattr(dispatch, "load_library", lambda dtype: "no C compiler found (set $CC or install cc/gcc)")
    monkeypatch.setattr(dispatch, "register_triton", lambda: "the Triton kernel needs Triton (missing)")
    for op, call, row in CASES:
        if row == 13:
            monkeypatch.setattr(dispatch, "register_triton", lambda: None)
            monkeypatch.setattr(dispatch, "triton_interpreted", lambda: False)
        reason = FALLBACKS[row][3]
        expected = reason if isinstance(reason, str) else reason(call)
        assert decide(op, call) == dispatch.Decision("eager", expected), (op, call)
    assert {row for *_, row in CASES} == set(range(len(FALLBACKS)))  # no row untested
    assert "TRITON_INTERPRET=1" in decide(*CASES[-1][:2]).reason


def test_the_kernel_when_nothing_falls_back(monkeypatch):
    monkeypatch.setattr(dispatch, "load_library", lambda dtype: object())
    monkeypatch.setattr(dispatch, "register_triton", lambda: None)
    monkeypatch.setattr(dispatch, "triton_interpreted", lambda: True)
    assert decide("pointer_recurrence", Call("auto", CPU, F32)) == dispatch.Decision("c")
    assert decide("pointer_recurrence", Call("fused", CUDA, F32)).kernel == "triton"
    assert decide("pointer_recurrence", Call("triton", CPU, torch.float64)).kernel == "triton"
    assert decide("controller_gru", Call("fused", CUDA, torch.float16)).kernel == "cudnn"  # cuDNN's GRU, no raise
    assert decide("controller_gru", Call("triton", CPU, F32)).kernel == "triton"  # its port, as cuDNN's one op
    assert decide("controller_gru", Call("auto", CUDA, F32)).kernel == "cudnn"  # CUDA's "auto" keeps cuDNN's GRU
    for op in dispatch.READS:  # a C kernel on CPU, the Triton port on the CUDA path
        assert decide(op, Call("auto", CPU, F32)).kernel == "c"
        assert decide(op, Call("auto", CUDA, F32)).kernel == "triton"
        assert decide(op, Call("triton", CPU, torch.float64)).kernel == "triton"
    assert decide("mode2_read", Call("auto", CUDA, F32, tile=dispatch.TRITON_TILE)).kernel == "triton"
    assert decide("mode2_read", Call("auto", CPU, F32, tile=512 * 512)).kernel == "c"  # the C kernel has no tile


def test_fused_op_names_the_custom_op_of_each_read(monkeypatch):
    monkeypatch.setattr(dispatch, "load_library", lambda dtype: object())
    monkeypatch.setattr(dispatch, "register_triton", lambda: None)
    monkeypatch.setattr(dispatch, "triton_interpreted", lambda: True)
    assert dispatch.fused_op("mode2_read", Call("auto", CPU, F32)) is torch.ops.panm_hf.mode2_attention
    assert dispatch.fused_op("controller_pool", Call("auto", CPU, F32)) is torch.ops.panm_hf.masked_pool
    assert dispatch.fused_op("cosine_normalize", Call("eager", CPU, F32)) is None
    assert dispatch.fused_op("mode2_read", Call("auto", CPU, F32, per_step=True)) is None


def test_forced_settings_raise_for_the_recurrences_only():
    for setting in ("fused", "triton"):
        with pytest.raises(ValueError, match=f'recurrence_kernel="{setting}" cannot run the loop: .*per-step.*"auto"'):
            require("pointer_recurrence", Call(setting, CPU, F32, per_step=True), "the loop")
    with pytest.raises(ValueError, match="differ in dtype"):
        require("controller_gru", Call("fused", CPU, F32, uniform=False), "the GRU")
    with pytest.raises(ValueError, match='recurrence_kernel="triton" cannot run the GRU: .*differ in dtype'):
        require("controller_gru", Call("triton", CPU, F32, uniform=False), "the GRU")  # its Triton port, forced
    assert require("controller_gru", Call("fused", CUDA, F32, uniform=False), "the GRU").kernel == "cudnn"  # nn.GRU
    assert require("pointer_recurrence", Call("auto", CPU, F32, per_step=True), "the loop").kernel == "eager"
    assert require("mode2_read", Call("fused", CPU, F32, per_step=True), "the read").kernel == "eager"


def test_triton_setting_is_validated(monkeypatch):
    settings = ("fused", "triton") if importlib.util.find_spec("triton") else ("fused",)  # CI's make test: no Triton
    for setting in settings:  # both Pointer-Unit updates have a fused kernel
        assert PanmMemoryConfig(recurrence_kernel=setting, pointer_update="shift").pointer_update == "shift"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ValueError, match='recurrence_kernel="triton" needs Triton.*pip install triton'):
        PanmMemoryConfig(recurrence_kernel="triton")


@needs_c_kernel
@triton_stage
@_no_triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter is on in this process")
def test_triton_on_cpu_without_the_interpreter_names_the_fix():
    from test_fused_recurrence import run, units_and_inputs

    module, inputs = units_and_inputs(2, 3, 6, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match='recurrence_kernel="triton" cannot run .*TRITON_INTERPRET=1'):
        run(module, "triton", inputs)


TRITON_RUN = """
import torch
from test_fused_recurrence import units_and_inputs, values_and_grads

for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
    module, inputs = units_and_inputs(2, 3, 6, 4, dtype=dtype)
    triton_out, triton_grads = values_and_grads(module, "triton", inputs)
    c_out, c_grads = values_and_grads(module, "fused", inputs)
    eager_out, eager_grads = values_and_grads(module, "eager", inputs)
    for ours, ref in zip([*triton_out, *triton_grads.values()], [*c_out, *c_grads.values()]):
        assert torch.allclose(ours, ref, atol=tolerance, rtol=tolerance), (ours - ref).abs().max()
    for ours, ref in zip([*triton_out, *triton_grads.values()], [*eager_out, *eager_grads.values()]):
        assert torch.allclose(ours, ref, atol=tolerance * 10, rtol=tolerance * 10), (ours - ref).abs().max()
print("OK")
"""


@needs_c_kernel
@triton_stage
@_no_triton
def test_triton_setting_runs_the_triton_port_on_cpu_under_the_interpreter():
    """`recurrence_kernel="triton"` on CPU tensors (Triton's interpreter): values and gradients against the C
    kernel and the eager loop, float64 and float32."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, for panm_hf
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    tests = os.path.dirname(__file__)
    result = subprocess.run([sys.executable, "-c", TRITON_RUN], capture_output=True, text=True, env=env, timeout=600,
                            cwd=tests)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")
