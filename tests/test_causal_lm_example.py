"""examples/causal_lm/run_causal_lm.py end to end on a tiny slice (seconds)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_causal_lm import BOS, PAD, SEP, build, lm_batch

ROOT = Path(__file__).resolve().parents[1]


def test_lm_framing_of_copy_and_reverse():
    input_ids, attention_mask, labels = lm_batch("reverse", 4, (1, 3), torch.Generator().manual_seed(0))
    for row in range(4):
        length = int(attention_mask[row].sum() - 2) // 2
        x = input_ids[row, 1 : length + 1]
        assert input_ids[row, 0] == BOS and input_ids[row, length + 1] == SEP
        assert torch.equal(input_ids[row, length + 2 : 2 * length + 2], x.flip(0))
        assert (input_ids[row, 2 * length + 2 :] == PAD).all()
        # the loss sees exactly the output part
        assert torch.equal((labels[row] != -100).nonzero().squeeze(1), torch.arange(length + 2, 2 * length + 2))


@pytest.mark.smoke
def test_smoke_run_writes_the_per_length_table(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "causal_lm" / "run_causal_lm.py"), "--smoke", "--output-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["test_lengths"] == [3, 5] and set(results["models"]) == {"backbone", "panm", "panm_shift"}
    for run in results["models"].values():
        assert run["steps"] == 3 and run["parameters"] > 0
        for key in ("token_accuracy", "sequence_accuracy"):
            assert set(run[key]) == {"3", "5"} and all(0.0 <= value <= 1.0 for value in run[key].values())
    assert results["models"]["panm"]["parameters"] > results["models"]["backbone"]["parameters"]
    assert results["models"]["backbone"]["pointer_hits"]["5"] is None
    hits = results["models"]["panm_shift"]["pointer_hits"]["5"]  # the diagnosis: reads landing on the source slot
    assert set(hits) == {"unit0", "unit1", "mode2"} and all(0.0 <= value <= 1.0 for value in hits.values())
    assert "| panm_shift | 3 |" in (tmp_path / "results.md").read_text()


def test_prompt_memory_models_train_equal_steps_and_report_pointer_hits():
    """`--causal_memory prompt`: PANM's memory is the prompt `BOS x SEP`; every model trains `--max_steps` steps."""
    from types import SimpleNamespace

    from run_causal_lm import pointer_hits, train

    model = build("panm_shift", "smoke", 0, 6, "llama", "prompt")
    assert model.config.causal_memory == "prompt" and model.config.pointer_update == "shift"
    args = SimpleNamespace(task="copy", batch_size=4, train_length=3, max_steps=2, time_budget=None, lr=1e-3,
                           log_every=1)  # fmt: skip
    assert train(model, args, torch.Generator().manual_seed(0))["steps"] == 2
    input_ids, _, labels = lm_batch("copy", 4, 3, torch.Generator().manual_seed(1))
    hits = pointer_hits(model.eval(), "copy", input_ids, labels, 3)
    assert set(hits) == {"unit0", "unit1", "mode2"} and all(0.0 <= value <= 1.0 for value in hits.values())


@pytest.mark.smoke
def test_smoke_run_with_the_prompt_as_memory(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "causal_lm" / "run_causal_lm.py"), "--smoke", "--task", "reverse",
         "--causal_memory", "prompt", "--output_dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["causal_memory"] == "prompt" and results["task"] == "reverse"
    assert {run["steps"] for run in results["models"].values()} == {3}  # equal steps, not equal wall clock
    assert set(results["models"]["panm"]["pointer_hits"]["5"]) == {"unit0", "unit1", "mode2"}


def test_mistral_backbone_attends_to_its_last_window_tokens_and_caches_the_same():
    """`--backbone mistral`: Llama's sizes with a sliding window. A token `sliding_window` or more places back
    leaves the backbone's last logits unchanged (a nearer one does not), and with the prompt as PANM's memory,
    cached greedy generation equals the uncached."""
    backbone = build("backbone", "smoke", 0, 6, "mistral", sliding_window=4).eval()
    assert backbone.config.sliding_window == 4
    input_ids = torch.randint(0, 10, (2, 12), generator=torch.Generator().manual_seed(0))

    def last_logits_move(position: int) -> bool:
        changed = input_ids.clone()
        changed[:, position] = (changed[:, position] + 1) % 10
        with torch.no_grad():
            return not torch.equal(backbone(input_ids).logits[:, -1], backbone(changed).logits[:, -1])

    assert [last_logits_move(position) for position in (7, 8, 11)] == [False, True, True]
    model = build("panm_shift", "smoke", 0, 6, "mistral", "prompt", sliding_window=4).eval()
    torch.nn.init.normal_(model.panm.controller.output_mlp[-1].weight)  # PANM starts as the backbone: wake it
    prompt = input_ids[:, :6]
    cached = model.generate(prompt, max_new_tokens=10, do_sample=False, eos_token_id=None)
    uncached = model.generate(prompt, max_new_tokens=10, do_sample=False, eos_token_id=None, use_cache=False)
    assert cached.shape == (2, 16) and torch.equal(cached, uncached)
