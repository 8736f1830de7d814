"""Train / evaluate loop of the length-generalisation suite (paper, Sec. 3.1).

One harness trains every model the same way: Adam, cross-entropy on the target
tokens, training lengths drawn uniformly from `1..L` per sample, no teacher
forcing. Every `eval_every` steps the model is scored on a fixed validation set
of length `L + 1` and the best checkpoint is kept (the paper's model selection);
that checkpoint is then tested on the task's five test lengths
(`L, L+1, 2(L+1), 4(L+1), 8(L+1)`). Accuracy is token accuracy in percent.
`summarize` aggregates seeds (mean ± std) and `write_results` writes JSON and Markdown.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .algorithmic import PAD_LABEL, make_batch, task_spec
from .models import build_model, count_parameters

# Seed offsets: training batches, validation set and test sets never share a stream.
_VALID_SEED = 10_000
_TEST_SEED = 20_000


@dataclass
class TrainConfig:
    """Settings of one training run.

    Args:
        task: one of `research.TASKS`.
        model: one of `research.models.MODEL_NAMES`.
        steps: optimiser steps.
        batch_size: training batch size.
        lr: Adam learning rate.
        seed: seeds the model init, the training batches and the base addresses.
        eval_every: steps between validations at `L + 1` (checkpoint selection).
        eval_samples: samples per validation / test length.
        eval_batch_size: batch size of evaluation.
        grad_clip: gradient-norm clip (0 disables).
        device: torch device string.
        model_kwargs: constructor overrides passed to `build_model` (e.g. `{"scoring": "cosine"}`).
        extra_test_lengths: test lengths beyond the task's five (e.g. 16(L+1)).
        monitor_lengths: diagnostic only: test lengths also scored at every validation and
            recorded in `RunResult.history` (never used to select the checkpoint), to see
            when a model's accuracy on longer inputs is decided during training.
        select_length: input length of the validation set that selects the checkpoint; None is
            `L + 1`, the paper's text. The authors' released code validates on 2(L+1) - 1 tokens
            by default (`-genlen 2`). Its samples never overlap a test set's (separate seeds).
    """

    task: str = "copy"
    model: str = "panm"
    steps: int = 1500
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0
    eval_every: int = 100
    eval_samples: int = 512
    eval_batch_size: int = 256
    grad_clip: float = 1.0
    device: str = "cpu"
    model_kwargs: dict = field(default_factory=dict)
    extra_test_lengths: tuple[int, ...] = ()
    monitor_lengths: tuple[int, ...] = ()
    select_length: int | None = None

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_samples", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}.")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0; got {self.lr!r}.")
        if any(not isinstance(n, int) or n < 1 for n in self.monitor_lengths):
            raise ValueError(f"monitor_lengths must be positive ints (test lengths); got {self.monitor_lengths!r}.")
        if self.select_length is not None and (not isinstance(self.select_length, int) or self.select_length < 1):
            raise ValueError(
                f"select_length must be a positive int (an input length) or None for L + 1; got {self.select_length!r}."
            )


@dataclass
class RunResult:
    """Result of one `train_and_evaluate` run: accuracies in percent keyed by test length.

    `test_parity_accuracy[length]` is `{"odd": ..., "even": ...}`, the token accuracy on the odd and
    on the even target steps (1-based `t`): on Mix, the middle-token and the `x_1` steps.
    """

    task: str
    model: str
    seed: int
    steps: int
    best_step: int
    best_valid_accuracy: float
    test_accuracy: dict[int, float]
    num_parameters: int
    train_seconds: float
    history: list[dict] = field(default_factory=list)
    best_valid_loss: float | None = None
    test_parity_accuracy: dict[int, dict[str, float]] = field(default_factory=dict)
    select_length: int | None = None


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the real target tokens: `(batch, steps, 10)`, `(batch, steps)`."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=PAD_LABEL
    )  # logits flattened to (batch*steps, 10)


def token_counts(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """`(correct, total)` real target tokens."""
    valid = labels != PAD_LABEL
    correct = (logits.argmax(dim=-1) == labels) & valid
    return int(correct.sum()), int(valid.sum())


def fixed_eval_batches(task: str, length: int, num_samples: int, batch_size: int, seed: int, device: str):
    """A reproducible evaluation set of `num_samples` samples of exactly `length` tokens, in batches."""
    generator = torch.Generator().manual_seed(seed + 7919 * length)
    batches = []
    for start in range(0, num_samples, batch_size):
        size = min(batch_size, num_samples - start)
        batches.append(make_batch(task, size, length, generator=generator).to(device))
    return batches


@torch.no_grad()
def _evaluate(model: nn.Module, batches) -> dict:
    """Accuracy, loss and accuracy on odd / even target steps (1-based t) of `model` in eval mode."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    parity = {"odd": [0, 0], "even": [0, 0]}  # name -> [correct, total]
    for batch in batches:
        logits = model(batch.inputs, batch.attention_mask, batch.labels.shape[1]).logits
        c, t = token_counts(logits, batch.labels)
        correct, total = correct + c, total + t
        loss_sum += nn.functional.cross_entropy(
            logits.flatten(0, 1), batch.labels.flatten(), ignore_index=PAD_LABEL, reduction="sum"
        ).item()  # logits flattened to (batch*steps, 10)
        for name, first in (("odd", 0), ("even", 1)):  # t = 1, 3, ... are columns 0, 2, ...
            c, t = token_counts(logits[:, first::2], batch.labels[:, first::2])
            parity[name][0] += c
            parity[name][1] += t
    model.train(was_training)
    return {
        "accuracy": 100.0 * correct / max(total, 1),
        "loss": loss_sum / max(total, 1),
        "parity": {name: 100.0 * c / max(t, 1) for name, (c, t) in parity.items()},
    }


def evaluate_with_loss(model: nn.Module, batches) -> tuple[float, float]:
    """`(token accuracy in percent, mean cross-entropy per real target token)` of `model` in eval
    mode over a list of `AlgorithmicBatch`."""
    scores = _evaluate(model, batches)
    return scores["accuracy"], scores["loss"]


def evaluate_by_step_parity(model: nn.Module, batches) -> dict[str, float]:
    """Token accuracy (percent) on the odd and on the even target steps (1-based `t`), e.g. Mix's
    middle-token steps (odd) and its `x_1` steps (even)."""
    return _evaluate(model, batches)["parity"]


def evaluate(model: nn.Module, batches) -> float:
    """Token accuracy (percent) of `model` in eval mode over a list of `AlgorithmicBatch`."""
    return evaluate_with_loss(model, batches)[0]


def train_and_evaluate(config: TrainConfig, *, progress: bool = False, log=None) -> tuple[RunResult, nn.Module]:
    """Train one model on one task, select the checkpoint on `L + 1` (or `select_length`), test it on the five lengths.

    Args:
        config: the run's `TrainConfig`.
        progress: show a tqdm bar with the running loss.
        log: optional callable receiving one line of text per validation.

    Returns:
        `(RunResult, the selected model in eval mode)`.
    """
    spec = task_spec(config.task)
    torch.manual_seed(config.seed)
    model = build_model(config.model, spec.feature_dim, **config.model_kwargs).to(config.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    select_length = config.select_length or spec.train_length + 1
    valid_batches = fixed_eval_batches(
        config.task, select_length, config.eval_samples, config.eval_batch_size, _VALID_SEED, config.device
    )

    def test_batches(length: int):
        """The test set at `length`; the monitored lengths (a diagnostic, never used for selection) use it too."""
        return fixed_eval_batches(
            config.task, length, config.eval_samples, config.eval_batch_size, _TEST_SEED, config.device
        )

    monitor_batches = {length: test_batches(length) for length in config.monitor_lengths}
    best_accuracy, best_loss, best_step, best_state, history = -1.0, math.inf, 0, None, []
    running = None
    steps = range(1, config.steps + 1)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(steps, desc=f"{config.model} on {config.task}", dynamic_ncols=True)
        steps = bar
    start = time.perf_counter()
    model.train()
    for step in steps:
        batch = make_batch(config.task, config.batch_size, spec.train_length_range, generator=generator)
        batch = batch.to(config.device)
        logits = model(batch.inputs, batch.attention_mask, batch.labels.shape[1], generator=generator).logits
        loss = sequence_loss(logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        if bar is not None:
            bar.set_postfix(loss=f"{running:.3f}", best_val=f"{max(best_accuracy, 0):.1f}")
        if step % config.eval_every == 0 or step == config.steps:
            accuracy, valid_loss = evaluate_with_loss(model, valid_batches)
            entry = {"step": step, "loss": running, "valid_accuracy": accuracy, "valid_loss": valid_loss}
            if monitor_batches:
                entry["monitor_accuracy"] = {length: evaluate(model, b) for length, b in monitor_batches.items()}
            history.append(entry)
            if log is not None:
                log(
                    f"{config.model} {config.task} seed={config.seed} step={step} "
                    f"loss={running:.4f} valid@{select_length}={accuracy:.1f}"
                )
            # Ties go to the later checkpoint: same validation score, more training. (The validation
            # loss is recorded, not used: at 100% on L+1 it keeps falling, so as a tie-break it
            # would pick the last checkpoint too; docs/RESULTS.md, "The demo".)
            if accuracy >= best_accuracy:
                best_accuracy, best_loss, best_step = accuracy, valid_loss, step
                best_state = copy.deepcopy(model.state_dict())
    train_seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    model.load_state_dict(best_state)
    model.eval()
    test_scores = {
        length: _evaluate(model, monitor_batches.get(length) or test_batches(length))
        for length in (*spec.test_lengths, *config.extra_test_lengths)
    }
    test_accuracy = {length: scores["accuracy"] for length, scores in test_scores.items()}
    result = RunResult(
        task=config.task,
        model=config.model,
        seed=config.seed,
        steps=config.steps,
        best_step=best_step,
        best_valid_accuracy=best_accuracy,
        test_accuracy=test_accuracy,
        num_parameters=count_parameters(model),
        train_seconds=train_seconds,
        history=history,
        best_valid_loss=best_loss,
        test_parity_accuracy={length: scores["parity"] for length, scores in test_scores.items()},
        select_length=select_length,
    )
    return result, model


def summarize(results: list[RunResult]) -> dict:
    """Mean and std (population, as over the seeds run) per task, model and test length.

    Returns:
        `{task: {model: {"mean": {length: m}, "std": {length: s}, "seeds": [...], ...}}}`.
    """
    grouped: dict = {}
    for result in results:
        grouped.setdefault(result.task, {}).setdefault(result.model, []).append(result)
    summary: dict = {}
    for task, per_model in grouped.items():
        for model, runs in per_model.items():
            lengths = list(runs[0].test_accuracy)
            mean, std = {}, {}
            for length in lengths:
                values = [run.test_accuracy[length] for run in runs]
                mu = sum(values) / len(values)
                mean[length] = mu
                std[length] = math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))
            summary.setdefault(task, {})[model] = {
                "mean": mean,
                "std": std,
                "seeds": [run.seed for run in runs],
                "best_steps": [run.best_step for run in runs],
                "num_parameters": runs[0].num_parameters,
                "train_seconds": [round(run.train_seconds, 1) for run in runs],
            }
    return summary


def markdown_table(summary: dict, task: str) -> str:
    """One Markdown table (models x test lengths, `mean ± std`) for a task of a `summarize` output."""
    per_model = summary[task]
    lengths = list(next(iter(per_model.values()))["mean"])
    header = "| model | params | " + " | ".join(str(length) for length in lengths) + " |"
    rule = "|---|---:|" + "---:|" * len(lengths)
    rows = [header, rule]
    for model, stats in per_model.items():
        cells = [f"{stats['mean'][n]:.1f} ± {stats['std'][n]:.1f}" for n in lengths]
        rows.append(f"| {model} | {stats['num_parameters'] / 1e6:.2f}M | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_results(results: list[RunResult], output_dir: str | Path, *, meta: dict | None = None) -> dict:
    """Write `results.json` (every run plus the summary) and `results.md` into `output_dir`.

    Returns:
        The `summarize` output.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    payload = {"meta": meta or {}, "summary": summary, "runs": [asdict(result) for result in results]}
    (output_dir / "results.json").write_text(json.dumps(payload, indent=2))
    lines = ["# Length generalisation: token accuracy (%) per test length", ""]
    if meta:
        lines += [f"- {key}: `{value}`" for key, value in meta.items()] + [""]
    for task in summary:
        lines += [f"## {task}", "", markdown_table(summary, task), ""]
    (output_dir / "results.md").write_text("\n".join(lines))
    return summary


def load_results(path: str | Path) -> list[RunResult]:
    """Read the runs of a `results.json` written by `write_results` (test lengths back to ints)."""
    runs = json.loads(Path(path).read_text())["runs"]
    results = []
    for run in runs:
        run = dict(run)
        run["test_accuracy"] = {int(length): value for length, value in run["test_accuracy"].items()}
        run["test_parity_accuracy"] = {int(n): v for n, v in run.get("test_parity_accuracy", {}).items()}
        results.append(RunResult(**run))
    return results
