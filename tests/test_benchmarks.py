"""The overhead benchmark: its cost counter on a known layer, and every section end to end on tiny models."""

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_overhead():
    return importlib.import_module("overhead")  # benchmarks/ is on pytest's pythonpath (pyproject.toml)


def test_time_interleaved_warms_up_interleaves_and_reduces():
    overhead = load_overhead()
    from timing import time_interleaved

    calls = []
    runs = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    counts = time_interleaved(runs, repeats=3, warmup=2, reduce=len)
    assert counts == {"a": 3, "b": 3}  # only the repeats are timed
    assert calls == ["a", "b"] * 5  # warm-up and repeats, each run once per round, in turn
    assert overhead.time_interleaved is time_interleaved
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved(runs, repeats=0, warmup=0)


def test_step_cost_counts_forward_and_backward_matmuls():
    overhead = load_overhead()
    layer = torch.nn.Linear(8, 5)
    inputs = torch.randn(3, 8)  # no grad: backward computes the weight gradient only
    cost = overhead.step_cost(lambda: layer(inputs).sum())
    # forward addmm 2*3*8*5 plus the weight gradient's mm 2*3*8*5
    assert cost["gflops"] * 1e9 == pytest.approx(4 * 3 * 8 * 5)
    assert cost["aten_ops"] > 0


def test_step_cost_counts_rnn_matmuls():
    overhead = load_overhead()
    gru = torch.nn.GRU(4, 6, batch_first=True)
    inputs = torch.randn(2, 3, 4)
    cost = overhead.step_cost(lambda: gru(inputs)[0].sum())
    # oneDNN is off for counting, so the GRU's matmuls are seen: at least its forward 2*B*T*3H*(I+H)
    assert cost["gflops"] * 1e9 >= 2 * 2 * 3 * 18 * (4 + 6)


def test_variants_narrow_every_section_and_keep_the_backbone():
    overhead = load_overhead()
    args = type("Args", (), {"variants": "panm-one,panm-replace"})()
    assert overhead.chosen_variants("seq2seq", args) == ["backbone", "panm-replace", "panm-one"]
    assert overhead.chosen_variants("seq2seq", type("Args", (), {"variants": None})()) == overhead.VARIANTS["seq2seq"]
    with pytest.raises(ValueError, match=r"--variants names unknown variants \['panm-once'\]"):
        overhead.chosen_variants("seq2seq", type("Args", (), {"variants": "panm-one,panm-once"})())
    config = overhead.seq2seq_panm(overhead.BartConfig(**overhead.SIZES["smoke"]["seq2seq"]), "panm-one",
                                   overhead.SIZES["smoke"]).config  # fmt: skip
    assert (config.placement, config.content_read_keys, config.decoder_window) == ("replace", "end_distance", 24)
    assert not config.input_feeding
    fed = overhead.seq2seq_panm(overhead.BartConfig(**overhead.SIZES["smoke"]["seq2seq"]), "panm-one-fed",
                                overhead.SIZES["smoke"]).config  # fmt: skip
    assert fed.input_feeding and fed.to_diff_dict() | {"input_feeding": False} == config.to_diff_dict()


@pytest.mark.smoke
def test_overhead_benchmark_smoke_writes_every_section(tmp_path):
    output = tmp_path / "overhead.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--smoke", "--threads", "1",
         "--output", str(output)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    for section in ("train", "cost"):
        assert set(report[section]) == {"lstm", "seq2seq", "qa", "causal"}
        for case, rows in report[section].items():
            assert "backbone" in rows and len(rows) >= 2, case
    for rows in report["train"].values():
        assert rows["backbone"]["throughput_ratio"] == 1.0
        assert all(row["tokens_per_s"] > 0 and math.isfinite(row["throughput_ratio"]) for row in rows.values())
        assert all(row["peak_memory_mb"] > 0 for row in rows.values())
    for rows in report["cost"].values():
        assert rows["backbone"]["flop_ratio"] == 1.0
        # PANM adds its kernels on top of the backbone's, except where it replaces a backbone layer ("replace")
        assert all(row["aten_ops"] > rows["backbone"]["aten_ops"] for name, row in rows.items()
                   if name != "backbone" and "replace" not in name)  # fmt: skip
        # the fused recurrences (recurrence_kernel="auto") dispatch fewer ops than the step-by-step reference
        assert all(row["aten_ops"] < row["aten_ops_eager"] for name, row in rows.items() if name != "backbone")
    assert set(report["generate"]) == {"greedy", "beam4", "causal-greedy", "causal-beam4"}
    for name, rows in report["generate"].items():
        variants = {"backbone", "panm"} if name.startswith("causal") else {"backbone", "panm-replace", "panm-stack"}
        assert set(rows) == variants
        assert rows["backbone"]["per_token_time_ratio"] == 1.0
        assert all(row["per_token_time_ratio"] > 0 and row["tokens_per_s"] > 0 for row in rows.values())
    greedy = report["generate"]["greedy"]
    # each cached token runs PANM's step on top of (stack) or instead of a layer of (replace) the decoder
    assert greedy["panm-stack"]["aten_ops_per_token"] > greedy["backbone"]["aten_ops_per_token"] > 0
    causal = report["generate"]["causal-greedy"]  # one PANM step per cached token, never a re-run over the prefix
    assert causal["panm"]["aten_ops_per_token"] > causal["backbone"]["aten_ops_per_token"] > 0
    assert [point["L"] for point in report["scaling"]["curve"]] == [4, 8, 6, 12]


@pytest.mark.smoke
def test_op_breakdown_attributes_the_pointer_loop_and_shows_it_fused():
    """The LSTM case's ops by source (tiny model, 5 steps): the Pointer-Unit loop is ~35 ops per step forward
    eager, one op fused."""
    counts = {}
    for kernel in ("eager", "fused"):
        result = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "op_breakdown.py"), "--cases", "lstm", "--smoke",
             "--recurrence-kernel", kernel, *(["--time", "1"] if kernel == "fused" else [])],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        total = int(lines[0].split(": ")[1].split()[0])
        parts = {line[:47].strip(): int(line[47:].split()[0]) for line in lines[1:] if line.startswith("  ")}
        assert sum(parts.values()) == total
        counts[kernel] = parts
    assert counts["fused"]["pointer loop (forward)"] == 1
    assert counts["fused"]["pointer loop (backward)"] <= 6
    assert counts["eager"]["pointer loop (forward)"] > 5 * 20
    assert counts["eager"]["backbone + loss (forward)"] == counts["fused"]["backbone + loss (forward)"]
    timing = lines[-1]  # the fused run's --time line
    assert timing.startswith("lstm: training step ms") and all(n in timing for n in ("backbone", "eager", "fused"))


TRITON_COUNT = """
import torch
import overhead
from test_fused_recurrence import units_and_inputs, values_and_grads
from panm_hf.kernels import triton_port

for steps, batch in ((2, 3), (9, 5)):
    module, inputs = units_and_inputs(2, batch, 6, steps, dtype=torch.float32)
    counts = {}
    for kernel in ("fused", "triton"):
        counter, launches = overhead.OpCounter(), triton_port.launches
        with counter:
            values_and_grads(module, kernel, inputs)
        counts[kernel] = (counter.count, triton_port.launches - launches)
    print(steps, batch, counts)
    # the C path: one op forward, one backward; the Triton path: one launch each, and the wrappers' glue
    # (forward 8 allocations; backward 9 allocations, d_h0 doubling as the kernel's scratch, three gradient
    # reductions and the weight-factor views; the bool mask and the 0-d temperature are passed as they are),
    # independent of steps and batch: the aten ops Triton's interpreter runs inside a launch (over a hundred) are not
    # counted
    assert counts == {"fused": (53, 0), "triton": (74, 2)}, counts
print("OK")
"""


@pytest.mark.triton
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_op_counter_counts_a_triton_launch_as_one_op_and_its_glue():
    """`--recurrence-kernel triton`'s proxy: each Triton launch is one op, the aten ops around it are counted."""
    paths = [str(ROOT), str(ROOT / "benchmarks"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(paths)}
    result = subprocess.run([sys.executable, "-c", TRITON_COUNT], capture_output=True, text=True, env=env, timeout=600,
                            cwd=ROOT / "tests")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def test_kernels_section_names_the_device_it_needs():
    overhead = load_overhead()
    args = type("Args", (), {"device": "cpu", "size": "smoke"})()
    with pytest.raises(ValueError, match="--device cuda"):
        overhead.bench_kernels("lstm", args)
