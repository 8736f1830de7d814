"""Where the Pointer Units' walk breaks on long Copy / Reverse inputs (RESULTS.md, "Where the faithful walk breaks").

Trains one suite PANM per task and seed with the harness (checkpoint selected at L+1, as in `run.py`),
then runs `research.diagnostics.pointer_walk` at 2(L+1), 4(L+1) and 8(L+1): per decoding step, the
token accuracy and the share of samples whose pointer stands on the slot holding the step's target;
the first step at which fewer than half are on track; and how many off-track positions are the
period-16 look-alike of the target. Writes `pointer_walk.json` and prints one row per run and length.

Usage:
    python examples/length_generalization/pointer_walk.py --task copy reverse --seeds 0 1 2 \
        --steps 400 --batch-size 32 --output-dir docs/results/pointer_walk
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from research import task_spec
from research.diagnostics import WALK_TARGETS, pointer_walk
from research.harness import TrainConfig, train_and_evaluate
from research.models import PANM_VARIANTS


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", nargs="+", default=["copy", "reverse"], choices=sorted(WALK_TARGETS))
    parser.add_argument("--model", default="panm", choices=sorted(PANM_VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--multiples", nargs="+", type=int, default=[2, 4, 8], help="test lengths, in units of L+1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output-dir", default="outputs/pointer_walk")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a tiny test set (seconds), for tests")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    samples = 16 if args.smoke else 256
    runs = []
    for task in args.task:
        spec = task_spec(task)
        for seed in args.seeds:
            config = TrainConfig(
                task=task, model=args.model, steps=args.steps, batch_size=args.batch_size, seed=seed,
                eval_every=min(50, args.steps), eval_samples=samples,
            )  # fmt: skip
            result, model = train_and_evaluate(config)
            for multiple in args.multiples:
                length = multiple * (spec.train_length + 1)
                walk = pointer_walk(model, task, length, num_samples=samples)
                runs.append({"task": task, "model": args.model, "seed": seed, "length": length,
                             "test_accuracy": result.test_accuracy.get(length), **walk})  # fmt: skip
                accuracy = sum(walk["token_accuracy"]) / len(walk["token_accuracy"])
                print(
                    f"{task} seed {seed} length {length}: accuracy {accuracy:.1%}, "
                    f"on track at step 1 {[f'{u[0]:.0%}' for u in walk['on_track']]}, "
                    f"first step off track {walk['first_step_off_track']}, "
                    f"period-16 share of off-track {[f'{s:.0%}' for s in walk['off_track_period16']]} (per unit)"
                )
    record = {
        "meta": {
            "command": shlex.join(["python", "examples/length_generalization/pointer_walk.py",
                                   *(sys.argv[1:] if argv is None else argv)]),
            "steps": args.steps,
            "batch_size": args.batch_size,
        },
        "runs": runs,
    }
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "pointer_walk.json").write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
