"""The Dyck example's models (causal, padding-independent) and an end-to-end run on a tiny budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_dyck import MODELS, DyckArguments, build_model

from panm_hf import PanmMemoryConfig
from research.dyck import from_strings

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "dyck" / "run_dyck.py"


def _model(name):
    torch.manual_seed(0)
    config = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8, address_bits=6)
    model = build_model(name, 4, DyckArguments(stack_size=16), config).eval()
    if name == "panm":  # larger g^o weights, so that what a step reads shows in its logits
        torch.nn.init.normal_(model.panm.controller.output_mlp[-1].weight)
    return model


def test_stack_output_starts_as_the_baseline():
    config = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8, address_bits=6)
    args = DyckArguments(stack_size=16, panm_output="stack")
    torch.manual_seed(0)
    baseline = build_model("srnn", 4, args, config).eval()
    model = build_model("panm", 4, args, config).eval()
    model.encoder.load_state_dict(baseline.encoder.state_dict())
    model.output.load_state_dict(baseline.output.state_dict())
    tokens = from_strings(["([])[()]", "[]"])
    with torch.no_grad():
        assert torch.allclose(model(tokens), baseline(tokens))


@pytest.mark.parametrize("name", MODELS)
def test_step_t_sees_only_symbols_up_to_t(name):
    model = _model(name)
    tokens = from_strings(["([])[()]", "([][[]])"])  # identical for the first 3 symbols
    with torch.no_grad():
        logits = model(tokens)
    assert torch.allclose(logits[0, :3], logits[1, :3], atol=1e-6)
    assert not torch.allclose(logits[0, 3:], logits[1, 3:], atol=1e-3)


@pytest.mark.parametrize("name", MODELS)
def test_padding_does_not_change_a_strings_outputs(name):
    model = _model(name)
    with torch.no_grad():
        alone = model(from_strings(["([])"]))
        batched = model(from_strings(["([])", "[[()()]]"]))
    assert torch.allclose(alone[0], batched[0, :4], atol=1e-5)


@pytest.mark.smoke
def test_smoke_run_reports_both_models_at_every_length(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), "--smoke", "--output_dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["num_pairs"] == 2 and summary["train_length"] == 10 and summary["test_lengths"] == [10, 12, 20]
    for name in MODELS:
        run = summary["results"][name]
        assert len(run["history"]) == 2 and run["best_epoch"] in (1, 2)
        assert set(run["test"]) == {"10", "12", "20"}
        for scores in run["test"].values():
            assert 0.0 <= scores["sequence_accuracy"] <= scores["step_accuracy"] <= 100.0
    assert summary["results"]["panm"]["num_parameters"] > summary["results"]["srnn"]["num_parameters"]
    assert "| srnn |" in (tmp_path / "results.md").read_text()
