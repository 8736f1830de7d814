"""Tests for the length-generalisation suite: models, harness and the demo script."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from research import make_batch, task_spec
from research.diagnostics import WALK_TARGETS, _profile_correlation, address_score_periodicity, pointer_walk
from research.harness import RunResult, evaluate, load_results, sequence_loss, summarize, token_counts
from research.models import MODEL_NAMES, build_model

TINY = {
    "panm": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "panm_shift": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "panm_distract": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "panm_linear": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "panm_ctrl": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "panm_shift_ctrl": dict(memory_dim=16, pointer_hidden_size=16, controller_hidden_size=32, mlp_hidden_size=16),
    "lstm": dict(hidden_size=32),
    "content": dict(memory_dim=16, hidden_size=32),
    "location": dict(memory_dim=16, hidden_size=32, max_slots=16),
    "transformer": dict(d_model=16, num_heads=2, num_layers=1, feedforward_size=32),
}
RUN_PY = Path(__file__).resolve().parents[1] / "examples" / "length_generalization" / "run.py"
POINTER_WALK_PY = RUN_PY.parent / "pointer_walk.py"
SELECTION_RULES_PY = RUN_PY.parent / "selection_rules.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load_script(path: Path, name: str):
    """Import an example script (not a package module) by path."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models are overhead-bound; several threads on a shared 2-core box only contend.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _batch(task: str = "copy", size: int = 4, length=(2, 5), seed: int = 0):
    return make_batch(task, size, length, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("task", ["copy", "drecall", "idsort"])
def test_output_shapes(name, task):
    torch.manual_seed(0)
    model = build_model(name, task_spec(task).feature_dim, **TINY[name])
    batch = _batch(task)
    out = model(batch.inputs, batch.attention_mask, batch.labels.shape[1])
    assert out.logits.shape == (*batch.labels.shape, 10)
    assert torch.isfinite(out.logits).all()


def test_panm_address_attention_shape_and_mass():
    torch.manual_seed(0)
    model = build_model("panm", 12, **TINY["panm"]).eval()
    batch = _batch(length=(2, 5))  # right-padded: 7 slots, shorter samples padded
    out = model(batch.inputs, batch.attention_mask, batch.labels.shape[1], output_attentions=True)
    weights = out.address_attentions
    assert weights.shape == (4, batch.labels.shape[1], 2, batch.inputs.shape[1])  # (batch, steps, H^a, slots)
    mask = batch.attention_mask.bool()[:, None, None, :]
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("name", ["panm", "panm_ctrl"])
def test_padding_does_not_change_panm_outputs(name):
    torch.manual_seed(0)
    model = build_model(name, 12, **TINY[name]).eval()
    batch = _batch(length=(2, 5), seed=3)
    full = model(batch.inputs, batch.attention_mask, batch.labels.shape[1]).logits
    shortest = int(batch.attention_mask.sum(-1).argmin())
    slots = int(batch.attention_mask[shortest].sum())
    steps = int((batch.labels[shortest] != -100).sum())
    alone = model(
        batch.inputs[shortest : shortest + 1, :slots], batch.attention_mask[shortest : shortest + 1, :slots], steps
    )
    torch.testing.assert_close(alone.logits[0], full[shortest, :steps], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["panm", "panm_ctrl", "content"])
def test_tiny_model_overfits_one_batch(name):
    torch.manual_seed(0)
    model = build_model(name, 12, **TINY[name])
    batch = _batch(size=8, length=4, seed=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    model.eval()  # fixed base address 0, so the batch is exactly the same every step
    for _ in range(60):
        loss = sequence_loss(model(batch.inputs, batch.attention_mask, 4).logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1
    assert evaluate(model, [batch]) == 100.0


def test_token_counts_and_summary():
    logits = torch.zeros(1, 3, 10)
    logits[0, 0, 2] = logits[0, 1, 5] = logits[0, 2, 7] = 1.0
    assert token_counts(logits, torch.tensor([[2, 4, -100]])) == (1, 2)
    runs = [
        RunResult("copy", "panm", seed, 10, 10, 100.0, {9: acc, 80: 10.0}, 5, 1.0)
        for seed, acc in ((0, 90.0), (1, 100.0))
    ]
    stats = summarize(runs)["copy"]["panm"]
    assert stats["mean"] == {9: 95.0, 80: 10.0}
    assert stats["std"] == {9: 5.0, 80: 0.0}


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="name"):
        build_model("ntm", 12)
    model = build_model("location", 12, **TINY["location"])
    batch = _batch(length=20)
    with pytest.raises(ValueError, match="max_slots"):
        model(batch.inputs, batch.attention_mask, 20)


@pytest.mark.smoke
def test_demo_smoke_writes_pngs_and_results(tmp_path):
    run = _load_script(RUN_PY, "length_generalization_run")
    summary = run.main(["--smoke", "--no-progress", "--threads", "1", "--output-dir", str(tmp_path)])
    # The demo's three models: the paper's PANM, PANM with `shift`, content attention.
    assert list(summary["copy"]) == ["panm", "panm_shift", "content"]
    assert list(summary["copy"]["panm"]["mean"]) == [9, 10, 20, 40, 80]
    for name in ("accuracy_vs_length.png", "pointer_attention.png", "pointer_attention_copy_panm_shift.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    saved = json.loads((tmp_path / "results.json").read_text())
    assert {run["model"] for run in saved["runs"]} == {"panm", "panm_shift", "content"}
    reloaded = summarize(load_results(tmp_path / "results.json"))
    assert reloaded["copy"]["panm"]["mean"] == summary["copy"]["panm"]["mean"]
    assert "| panm |" in (tmp_path / "results.md").read_text()


def _load_run_py():
    run = _load_script(RUN_PY, "length_generalization_run")
    return run


def test_demo_defaults_to_three_models_and_one_thread_when_busy():
    run = _load_run_py()
    args = run.parse_args([])
    assert args.models == ["panm", "panm_shift", "content"]
    assert args.threads is None  # chosen at run time by default_threads
    assert run.default_threads(cores=2, load=0.3) == (2, None)
    threads, warning = run.default_threads(cores=2, load=2.0)
    assert threads == 1 and "busy" in warning and "--threads" in warning
    assert run.default_threads(cores=16, load=15.9) == (2, None)
    assert run.default_threads(cores=1, load=0.0)[0] == 1
    assert run.parse_args(["--threads", "3"]).threads == 3
    with pytest.raises(ValueError, match="--threads"):
        run.parse_args(["--threads", "0"])


def test_profile_correlation_sees_exact_and_no_repetition():
    period16 = torch.randn(16).repeat(64)  # (1024,) repeats every 16 addresses
    assert _profile_correlation(period16, 16).item() == pytest.approx(1.0, abs=1e-6)
    assert _profile_correlation(period16, 32).item() == pytest.approx(1.0, abs=1e-6)
    noise = torch.randn(4, 1024, generator=torch.Generator().manual_seed(0))
    assert _profile_correlation(noise, 16).abs().max() < 0.15


@pytest.mark.parametrize("name", ["panm", "panm_shift"])
def test_score_periodicity_diagnostic_shapes(name):
    torch.manual_seed(0)
    model = build_model(name, task_spec("copy").feature_dim, **TINY[name])
    result = address_score_periodicity(model, "copy", 12, periods=(16, 32), num_samples=4)
    assert set(result["correlation"]) == {16, 32}
    assert all(len(values) == 2 and all(-1 <= v <= 1 for v in values) for values in result["correlation"].values())
    assert len(result["example_profile"]) == 2 and len(result["example_profile"][0]) == 1024
    assert all(0 < usage <= 1 for usage in result["usage"])
    assert ("shift_gate" in result) == (name == "panm_shift")
    assert model.training  # restored


@pytest.mark.smoke
def test_variants_smoke_with_16x_length_and_score_profiles(tmp_path):
    run = _load_script(RUN_PY, "length_generalization_run")
    summary = run.main(["--smoke", "--no-progress", "--threads", "1", "--task", "copy", "psort", "--models",
                        "panm_shift", "panm_distract", "--extra-lengths", "16", "--output-dir", str(tmp_path)])
    assert list(summary["copy"]["panm_shift"]["mean"]) == [9, 10, 20, 40, 80, 160]
    assert list(summary["psort"]["panm_distract"]["mean"]) == [10, 11, 21, 41, 81, 176]
    diagnostics = json.loads((tmp_path / "score_periodicity.json").read_text())
    assert {(d["task"], d["model"]) for d in diagnostics} == {
        (task, model) for task in ("copy", "psort") for model in ("panm_shift", "panm_distract")
    }
    assert (tmp_path / "score_profiles.png").read_bytes()[:8] == PNG_MAGIC


def test_demo_rejects_non_positive_extra_lengths_before_training():
    run = _load_script(RUN_PY, "length_generalization_run")
    with pytest.raises(ValueError, match="--extra-lengths"):
        run.parse_args(["--extra-lengths", "16", "0"])
    assert run.extra_lengths("psort", [16]) == (176,)


def test_monitoring_longer_lengths_never_changes_training_or_selection():
    from research.harness import TrainConfig, train_and_evaluate

    base = dict(task="copy", model="panm", steps=6, batch_size=8, eval_every=2, eval_samples=8, eval_batch_size=8,
                model_kwargs={"pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16})
    plain, _ = train_and_evaluate(TrainConfig(**base))
    watched, _ = train_and_evaluate(TrainConfig(**base, monitor_lengths=(20, 40)))
    assert watched.test_accuracy == plain.test_accuracy
    assert watched.best_step == plain.best_step
    assert [e["loss"] for e in watched.history] == [e["loss"] for e in plain.history]
    assert all("monitor_accuracy" not in e for e in plain.history)
    monitored = [e["monitor_accuracy"] for e in watched.history]
    assert [list(m) for m in monitored] == [[20, 40]] * 3
    # Monitoring scores the same test sets as the test phase: at the selected step they agree.
    selected = next(e for e in watched.history if e["step"] == watched.best_step)
    assert selected["monitor_accuracy"] == {n: watched.test_accuracy[n] for n in (20, 40)}
    with pytest.raises(ValueError, match="monitor_lengths"):
        TrainConfig(**base, monitor_lengths=(0,))


def test_select_length_validates_on_a_longer_held_out_set(monkeypatch):
    import research.harness as harness

    calls = []
    real = harness.fixed_eval_batches

    def spy(task, length, num_samples, batch_size, seed, device):
        calls.append((length, seed))
        return real(task, length, num_samples, batch_size, seed, device)

    monkeypatch.setattr(harness, "fixed_eval_batches", spy)
    base = dict(task="reverse", model="panm", steps=4, batch_size=8, eval_every=2, eval_samples=8, eval_batch_size=8,
                model_kwargs={"pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16})
    paper, _ = harness.train_and_evaluate(harness.TrainConfig(**base))
    assert paper.select_length == 10 and calls[0] == (10, harness._VALID_SEED)
    calls.clear()
    authors, _ = harness.train_and_evaluate(harness.TrainConfig(**base, select_length=20))
    assert authors.select_length == 20 and calls[0] == (20, harness._VALID_SEED)
    # the held-out validation set at 20 is not the test set at 20
    assert (20, harness._TEST_SEED) in calls and harness._VALID_SEED != harness._TEST_SEED
    with pytest.raises(ValueError, match="select_length"):
        harness.TrainConfig(**base, select_length=0)


def test_select_multiple_flag_is_checked():
    run = _load_script(RUN_PY, "length_generalization_run")
    assert run.parse_args([]).select_multiple == 1
    with pytest.raises(ValueError, match="--select-multiple"):
        run.parse_args(["--select-multiple", "0"])


@pytest.mark.smoke
def test_demo_monitor_flag_writes_curves(tmp_path):
    run = _load_script(RUN_PY, "length_generalization_run")
    run.main(["--smoke", "--no-progress", "--threads", "1", "--models", "panm", "--monitor-lengths", "2", "4",
              "--output-dir", str(tmp_path)])
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    history = runs[0]["history"]
    assert [list(e["monitor_accuracy"]) for e in history] == [["20", "40"]] * len(history)  # JSON keys
    assert (tmp_path / "monitor_curves.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="--monitor-lengths"):
        run.parse_args(["--monitor-lengths", "0"])


def test_evaluate_with_loss_is_cross_entropy_per_real_token():
    from research import make_batch
    from research.harness import evaluate_with_loss
    from research.models import AlgorithmicModelOutput

    class Uniform(torch.nn.Module):
        def forward(self, inputs, attention_mask, num_steps, **_):
            return AlgorithmicModelOutput(logits=torch.zeros(inputs.shape[0], num_steps, 10))

    batch = make_batch("copy", 16, (3, 7), generator=torch.Generator().manual_seed(0))
    accuracy, loss = evaluate_with_loss(Uniform(), [batch])
    real = batch.labels[batch.labels != -100]
    assert loss == pytest.approx(math.log(10), rel=1e-6)  # uniform over 10 tokens, padding ignored
    assert accuracy == pytest.approx(100.0 * (real == 0).float().mean().item())  # argmax of equal logits is 0


def test_history_records_the_validation_loss_of_the_selected_checkpoint():
    from research.harness import TrainConfig, train_and_evaluate

    config = TrainConfig(task="copy", model="panm", steps=6, batch_size=8, eval_every=2, eval_samples=8,
                         eval_batch_size=8,
                         model_kwargs={"pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16})
    result, _ = train_and_evaluate(config)
    assert [e["step"] for e in result.history] == [2, 4, 6]
    assert all(math.isfinite(e["valid_loss"]) and e["valid_loss"] > 0 for e in result.history)
    top = max(e["valid_accuracy"] for e in result.history)
    selected = [e for e in result.history if e["valid_accuracy"] == top][-1]  # ties go to the later one
    assert result.best_step == selected["step"]
    assert result.best_valid_loss == selected["valid_loss"]


def test_step_parity_accuracy_splits_odd_and_even_target_steps():
    from research.harness import TrainConfig, evaluate_by_step_parity, train_and_evaluate
    from research.models import AlgorithmicModelOutput

    class OddStepsRight(torch.nn.Module):
        """Puts the true label on odd steps (1-based t) and a wrong token on even steps."""

        def __init__(self, labels):
            super().__init__()
            self.labels = labels

        def forward(self, inputs, attention_mask, num_steps, **_):
            target = self.labels.clamp(min=0)  # (batch, steps)
            wrong = (target + 1) % 10
            steps = torch.arange(num_steps)
            chosen = torch.where(steps % 2 == 0, target, wrong)  # (batch, steps)
            return AlgorithmicModelOutput(logits=torch.nn.functional.one_hot(chosen, 10).float())

    batch = make_batch("mix", 8, 9, generator=torch.Generator().manual_seed(0))
    assert evaluate_by_step_parity(OddStepsRight(batch.labels), [batch]) == {"odd": 100.0, "even": 0.0}
    config = TrainConfig(task="mix", model="panm", steps=2, batch_size=4, eval_every=2, eval_samples=4,
                         eval_batch_size=4,
                         model_kwargs={"pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16})
    result, _ = train_and_evaluate(config)
    assert list(result.test_parity_accuracy) == list(result.test_accuracy) == [9, 10, 20, 40, 80]
    for length, parity in result.test_parity_accuracy.items():
        odd_steps, even_steps = (length + 1) // 2, length // 2  # every Mix target has `length` steps
        mean = (parity["odd"] * odd_steps + parity["even"] * even_steps) / length
        assert mean == pytest.approx(result.test_accuracy[length])


class _ScriptedWalk(torch.nn.Module):
    """A stand-in suite PANM whose two units stand on `target + offsets[unit]` at every step; logits right
    exactly where unit 0 is on track."""

    def __init__(self, task: str, offsets: tuple[int, int]):
        super().__init__()
        self.task, self.offsets = task, offsets
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device

    def forward(self, inputs, attention_mask, num_steps, output_attentions=False):
        batch, slots, _ = inputs.shape
        length = slots - 2
        target = WALK_TARGETS[self.task](torch.arange(1, num_steps + 1), length)  # (steps,)
        weights = torch.zeros(batch, num_steps, 2, slots)
        for unit, offset in enumerate(self.offsets):
            weights[:, torch.arange(num_steps), unit, (target + offset).clamp(0, slots - 1)] = 1.0
        tokens = inputs[:, 1 : length + 1, :10].argmax(-1)  # (batch, length)
        wanted = tokens[:, target - 1]  # (batch, steps)
        logits = torch.nn.functional.one_hot(wanted, 10).float() * (1.0 if self.offsets[0] == 0 else -1.0)
        return type("Out", (), {"logits": logits, "address_attentions": weights})()


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_pointer_walk_reads_on_track_and_period16_offsets(task):
    on_track = pointer_walk(_ScriptedWalk(task, (0, 16 if task == "copy" else -16)), task, 40, num_samples=8)
    assert on_track["on_track"][0] == [1.0] * 40 and on_track["first_step_off_track"][0] is None
    assert on_track["token_accuracy"] == [1.0] * 40
    # unit 1 stands 16 slots away wherever that slot exists (clamped at the ends: not a multiple of 16)
    assert on_track["first_step_off_track"][1] == 1 and 0.5 < on_track["off_track_period16"][1] < 1.0
    far = pointer_walk(_ScriptedWalk(task, (5, 16)), task, 40, num_samples=8)
    assert far["on_track"][0] == [0.0] * 40 and far["off_track_period16"][0] == 0.0
    with pytest.raises(ValueError, match="pointer_walk covers"):
        pointer_walk(_ScriptedWalk(task, (0, 0)), "mix", 40)


def test_pointer_walk_on_an_untrained_tiny_panm_has_one_value_per_step_and_unit():
    torch.manual_seed(0)
    model = build_model("panm", task_spec("reverse").feature_dim, **TINY["panm"])
    result = pointer_walk(model, "reverse", 12, num_samples=4)
    assert len(result["token_accuracy"]) == 12
    assert len(result["on_track"]) == 2 and all(len(unit) == 12 for unit in result["on_track"])
    assert all(0.0 <= share <= 1.0 for unit in result["on_track"] for share in unit)
    assert model.training  # restored


@pytest.mark.smoke
def test_pointer_walk_script_smoke(tmp_path):
    script = _load_script(POINTER_WALK_PY, "pointer_walk")
    record = script.main(["--smoke", "--steps", "2", "--task", "reverse", "--multiples", "2", "--output-dir",
                          str(tmp_path)])  # fmt: skip
    (run,) = record["runs"]
    assert (run["task"], run["length"], len(run["token_accuracy"])) == ("reverse", 20, 20)
    written = json.loads((tmp_path / "pointer_walk.json").read_text())
    assert written["runs"][0]["length"] == 20 and "--multiples 2" in written["meta"]["command"]


def test_selection_rules_reads_the_paper_rule_from_the_history(tmp_path):
    rules = _load_script(SELECTION_RULES_PY, "selection_rules")
    monitor = [  # Reverse: L+1 = 10; 100% at 10 from step 100 on, best at 20 at step 100
        {"10": 90.0, "20": 50.0, "40": 20.0, "80": 10.0},
        {"10": 100.0, "20": 95.0, "40": 50.0, "80": 33.0},
        {"10": 100.0, "20": 70.0, "40": 30.0, "80": 15.0},
    ]
    run = {"task": "reverse", "model": "panm", "seed": 0, "best_step": 100, "select_length": 20,
           "test_accuracy": {"9": 100.0, "10": 100.0, "20": 95.0, "40": 50.0, "80": 33.0},
           "history": [{"step": 50 * (i + 1), "monitor_accuracy": m} for i, m in enumerate(monitor)]}  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": [run]}))
    (row,) = rules.main([str(path)])
    # the paper's rule keeps the last of the tied L+1 checkpoints (step 150), the run kept step 100
    assert row["paper_rule"] == {"step": 150, 10: 100.0, 20: 70.0, 40: 30.0, 80: 15.0}
    assert row["selected"] == {"step": 100, "select_length": 20, 10: 100.0, 20: 95.0, 40: 50.0, 80: 33.0}
    del run["history"][0]["monitor_accuracy"]["80"]
    path.write_text(json.dumps({"runs": [run]}))
    with pytest.raises(ValueError, match="--monitor-lengths 1 2 4 8"):
        rules.main([str(path)])
