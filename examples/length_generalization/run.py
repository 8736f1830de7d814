"""Length generalisation on the PANM paper's algorithmic tasks (Sec. 3.1).

With no arguments (the demo, `make demo`): trains three models on Copy with a CPU-sized
budget (500 steps at batch 64): the paper's PANM (`panm`), PANM with content-free pointer
arithmetic (`panm_shift`, `pointer_update="shift"`, beyond the paper) and the content-attention
(Bahdanau) baseline; prints token accuracy per test length (L, L+1, 2(L+1), 4(L+1), 8(L+1)),
and writes `accuracy_vs_length.png` (all three), `pointer_attention.png` (the faithful PANM's
Mode-1 address attention of each pointer over the decoding steps for one test sample of length
2(L+1), like the paper's Fig. 2c/2d; `pointer_attention_copy_panm_shift.png` for `shift`),
`results.json` and `results.md` into `--output-dir`. It uses two threads on an idle machine and
one when the machine is busy (load average >= cores); `--threads` overrides.

Full protocol, e.g.:
    python examples/length_generalization/run.py --task reverse \
        --models panm content location lstm transformer --steps 3000 --seeds 0 1 2
    python examples/length_generalization/run.py --task all --device cuda --steps 10000 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from panm_hf.memory_config import CONTROLLER_INITS, SCORINGS
from research import TASKS, make_batch, task_spec
from research.diagnostics import address_score_periodicity
from research.harness import TrainConfig, markdown_table, train_and_evaluate, write_results
from research.models import MODEL_NAMES, PANM_VARIANTS

# The demo's models: the paper's PANM, PANM with the content-free `shift` Pointer Unit, the best baseline.
DEMO_MODELS = ("panm", "panm_shift", "content")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--task", nargs="+", default=["copy"], choices=(*TASKS, "all"), help="one or more tasks, or all"
    )
    parser.add_argument("--models", nargs="+", default=list(DEMO_MODELS), choices=MODEL_NAMES)
    parser.add_argument("--steps", type=int, default=500, help="optimiser steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=50, help="steps between validations (checkpoint selection)")
    parser.add_argument(
        "--select-multiple", type=int, default=1,
        help="select the checkpoint on a validation set of M(L+1) tokens (1: L+1, the paper's text; the authors' "
        "code validates on about 2(L+1))",
    )  # fmt: skip
    parser.add_argument("--eval-samples", type=int, default=256, help="samples per validation/test length")
    parser.add_argument(
        "--scoring", choices=SCORINGS, default=None, help="PANM scoring (suite default: cosine x 15)"
    )
    parser.add_argument("--cosine-inverse-temperature", type=float, default=None)
    parser.add_argument("--controller-init", choices=CONTROLLER_INITS, default=None)
    parser.add_argument(
        "--extra-lengths",
        type=int,
        nargs="*",
        default=[],
        help="also test at these multiples of L+1 (e.g. 16 for 16(L+1)); the paper stops at 8",
    )
    parser.add_argument(
        "--monitor-lengths",
        type=int,
        nargs="*",
        default=[],
        help="diagnostic: also score these multiples of L+1 (e.g. 2 4 8) at every validation and plot them "
        "against the step in monitor_curves.png; never used to select the checkpoint",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 2, or 1 when the machine is busy: load average >= its cores)",
    )
    parser.add_argument("--output-dir", default="outputs/length_generalization")
    parser.add_argument("--no-progress", action="store_true", help="hide the tqdm bar")
    parser.add_argument("--smoke", action="store_true", help="a few steps on tiny eval sets (seconds), for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.eval_every, args.eval_samples = 4, 8, 2, 8
    for flag in ("extra_lengths", "monitor_lengths"):
        if any(k < 1 for k in getattr(args, flag)):
            raise ValueError(
                f"--{flag.replace('_', '-')} takes positive multiples of L+1 (e.g. 16); got {getattr(args, flag)}."
            )
    for name in ("steps", "batch_size", "eval_every", "eval_samples", "threads", "select_multiple"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}.")
    return args


def default_threads(cores: int | None = None, load: float | None = None) -> tuple[int, str | None]:
    """`(threads, warning or None)`: 2 threads (at most the cores), or 1 when the machine is busy.

    Busy = the 1-minute load average is at least the number of cores: other jobs already use
    every core, and on such a box two threads per process made a PANM step up to ~20x slower
    (docs/RESULTS.md, protocol). `cores` and `load` default to this machine's.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load >= cores:
        return 1, (
            f"the machine is busy (load average {load:.1f} on {cores} cores): using 1 thread, so the demo "
            "may take longer than its ~5 minutes; pass --threads N to override"
        )
    if cores < 2:
        return 1, "1 CPU core: the demo may take about twice its ~5 minutes"
    return 2, None


def extra_lengths(task: str, multiples: list[int]) -> tuple[int, ...]:
    """Test lengths `k (L+1)` for each multiple `k`, beyond the paper's five."""
    return tuple(k * (task_spec(task).train_length + 1) for k in multiples)


def panm_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {}
    if args.scoring is not None:
        kwargs["scoring"] = args.scoring
    if args.cosine_inverse_temperature is not None:
        kwargs["cosine_inverse_temperature"] = args.cosine_inverse_temperature
    if args.controller_init is not None:
        kwargs["controller_init"] = args.controller_init
    return kwargs


def plot_accuracy(summary: dict, path: Path) -> None:
    """Token accuracy vs test length, one panel per task, one line (mean ± std) per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for model, stats in summary[task].items():
            lengths = list(stats["mean"])
            ax.errorbar(
                lengths,
                [stats["mean"][n] for n in lengths],
                yerr=[stats["std"][n] for n in lengths],
                marker="o",
                capsize=3,
                label=model,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_ylim(0, 102)
        ax.set_xlabel("test length (tokens)")
        ax.set_ylabel("token accuracy (%)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_monitor_curves(results, path: Path) -> None:
    """Accuracy at the monitored lengths against the training step, one panel per task, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(result.task for result in results))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        # Colour = test length, line style = run.
        for run_index, result in enumerate(r for r in results if r.task == task):
            steps = [entry["step"] for entry in result.history]
            for length_index, length in enumerate(result.history[0]["monitor_accuracy"]):
                accuracy = [entry["monitor_accuracy"][length] for entry in result.history]
                ax.plot(steps, accuracy, color=f"C{length_index}", linestyle=("-", "--", ":", "-.")[run_index % 4],
                        label=f"{result.model} s{result.seed} @ {length}", linewidth=1)
            ax.axvline(result.best_step, color="grey", linewidth=0.5, linestyle=":")
        ax.set_ylim(0, 102)
        lengths = {result.select_length for result in results if result.task == task}
        where = "L+1" if lengths <= {None, task_spec(task).train_length + 1} else "/".join(map(str, sorted(lengths)))
        ax.set_xlabel(f"training step (dotted: checkpoint selected at {where})")
        ax.set_ylabel("token accuracy (%)")
        ax.set_title(f"{task}: accuracy on longer inputs during training (not used for selection)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@torch.no_grad()
def plot_pointer_attention(model, task: str, path: Path, device: str) -> None:
    """Heatmap of each Mode-1 pointer's address attention (x: memory slot, y: decoding step) at 2(L+1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = task_spec(task)
    length = 2 * (spec.train_length + 1)
    batch = make_batch(task, 1, length, generator=torch.Generator().manual_seed(1234)).to(device)
    model.eval()
    out = model(batch.inputs, batch.attention_mask, batch.labels.shape[1], output_attentions=True)
    weights = out.address_attentions[0].float().cpu()  # (steps, units, slots)
    units = weights.shape[1]
    fig, axes = plt.subplots(1, units, figsize=(4.6 * units, 4.2), squeeze=False, layout="constrained")
    names = ["p_B (starts at START)", "p_E (starts at END)"] + [f"unit {k}" for k in range(2, units)]
    for unit, ax in enumerate(axes[0]):
        image = ax.imshow(weights[:, unit, :].numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"{task}, length {length}: pointer {unit} = {names[unit]}", fontsize=8)
        ax.set_xlabel("memory slot (0 = START)")
        ax.set_ylabel("decoding step")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="address attention")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_score_profiles(diagnostics: list[dict], path: Path) -> None:
    """Each PANM variant's address scores over all 2^b addresses (unit 0 = p_B, middle step, one sample)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(diagnostics), 1, figsize=(10, 2.2 * len(diagnostics)), squeeze=False)
    for ax, entry in zip(axes[:, 0], diagnostics):
        profile = entry["example_profile"][0]
        ax.plot(range(len(profile)), profile, linewidth=0.6)
        corr = entry["correlation"]["16"][0]
        ax.set_title(
            f"{entry['task']} / {entry['model']} (seed {entry['seed']}): scores of pointer 0 over all addresses; "
            f"correlation with itself shifted by 16 = {corr:.2f}",
            fontsize=8,
        )
        ax.set_xlim(0, len(profile))
    axes[-1, 0].set_xlabel("address")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is None:
        args.threads, warning = default_threads()
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    torch.set_num_threads(args.threads)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tasks = TASKS if "all" in args.task else tuple(dict.fromkeys(args.task))
    results, panm_models, diagnostics = [], {}, []
    start = time.perf_counter()
    with open(output_dir / "train_log.txt", "w") as log_file:

        def log(line: str) -> None:
            log_file.write(line + "\n")
            log_file.flush()

        for task in tasks:
            for model_name in args.models:
                for seed in args.seeds:
                    config = TrainConfig(
                        task=task,
                        model=model_name,
                        steps=args.steps,
                        batch_size=args.batch_size,
                        lr=args.lr,
                        seed=seed,
                        eval_every=args.eval_every,
                        eval_samples=args.eval_samples,
                        eval_batch_size=min(256, args.eval_samples),
                        device=args.device,
                        model_kwargs=panm_kwargs(args) if model_name in PANM_VARIANTS else {},
                        extra_test_lengths=extra_lengths(task, args.extra_lengths),
                        monitor_lengths=extra_lengths(task, args.monitor_lengths),
                        select_length=extra_lengths(task, [args.select_multiple])[0],
                    )
                    result, model = train_and_evaluate(config, progress=not args.no_progress, log=log)
                    results.append(result)
                    if model_name in PANM_VARIANTS:
                        length = 2 * (task_spec(task).train_length + 1)
                        periodicity = address_score_periodicity(model, task, length)
                        periodicity["correlation"] = {str(k): v for k, v in periodicity["correlation"].items()}
                        diagnostics.append({"task": task, "model": model_name, "seed": seed, "length": length,
                                            **periodicity})
                    if model_name in PANM_VARIANTS and (task, model_name) not in panm_models:
                        panm_models[(task, model_name)] = model
    elapsed = time.perf_counter() - start
    meta = {
        "command": " ".join(
            ["python examples/length_generalization/run.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seeds": args.seeds,
        "device": args.device,
        "threads": args.threads,
        "panm_kwargs": panm_kwargs(args),
        "select_multiple": args.select_multiple,
        "wall_seconds": round(elapsed, 1),
    }
    summary = write_results(results, output_dir, meta=meta)
    if diagnostics:
        with open(output_dir / "score_periodicity.json", "w") as handle:
            json.dump(diagnostics, handle)
        plot_score_profiles([d for d in diagnostics if d["seed"] == diagnostics[0]["seed"]],
                            output_dir / "score_profiles.png")
    for task in summary:
        where = "L+1" if args.select_multiple == 1 else f"{args.select_multiple}(L+1) (held-out validation set)"
        print(f"\n{task}: token accuracy (%) per test length, checkpoint selected at {where}")
        print(markdown_table(summary, task))
    plot_accuracy(summary, output_dir / "accuracy_vs_length.png")
    if args.monitor_lengths:
        plot_monitor_curves(results, output_dir / "monitor_curves.png")
    for index, ((task, model_name), model) in enumerate(panm_models.items()):
        name = "pointer_attention.png" if index == 0 else f"pointer_attention_{task}_{model_name}.png"
        plot_pointer_attention(model, task, output_dir / name, args.device)
    print(
        f"\nwall time {elapsed:.0f} s; wrote results.json, results.md, accuracy_vs_length.png"
        f"{', pointer_attention.png' if panm_models else ''} to {output_dir}"
    )
    return summary


if __name__ == "__main__":
    main()
