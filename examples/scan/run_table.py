#!/usr/bin/env python
"""Run the SCAN table: every (design, cut-off, seed) as its own `run_scan.py` process, one JSON per run.

Runs go to `<output_dir>/<design>_L<cutoff>_s<seed>/results.json` (a run whose JSON exists is skipped,
so an interrupted table resumes), `--jobs` at a time, each on one CPU thread. `--summary` prints the
table from whatever JSONs exist (exact match on the longer outputs, the i.i.d. set, and the EOS
diagnosis), without training.

    python examples/scan/run_table.py --designs transformer panm --cutoffs 22 26 30 --seeds 0 1 2 \
        --output_dir runs/scan_table --jobs 2
    python examples/scan/run_table.py --output_dir runs/scan_table --summary
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from panm_hf.pipelines.scan_data import CUTOFFS

# The budget of docs/results/scan.md: the issue's setup (Adam 5e-4, batch 64, 3,000 steps), one thread.
BUDGET = [
    "--max_steps", "3000", "--per_device_train_batch_size", "64", "--learning_rate", "5e-4", "--warmup_steps", "100",
    "--per_device_eval_batch_size", "256", "--eval_every", "500", "--curve_samples", "256", "--logging_steps", "250",
    "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip
# Every design starts from the paper's integration (`--panm_design paper`: the flags of every named design at the
# paper's values), whatever run_scan.py's defaults are: the table's rows keep their meaning when the example's
# defaults change (stop 60: the one design).
PAPER_INTEGRATION = ["--panm_design", "paper", "--eos_decision", "shared"]
# The translation and math examples' PANM flags before stop 60, with their 128-wide GRUs (the Multi30K design).
MULTI30K_DESIGN = [
    "--placement", "stack", "--panm_drop_path", "0.5", "--content_read", "decoder", "--pointer_update", "shift",
    "--pointer_hidden_size", "128", "--controller_hidden_size", "128",
]  # fmt: skip
# The library's default GRU widths (PanmMemoryConfig), spelled out so that the `_w256` rows keep their meaning.
WIDE_POINTER_UNITS = ["--pointer_hidden_size", "256"]
WIDE_CONTROLLER = ["--controller_hidden_size", "256"]
SCAN_DECODER = ["--decoder_positions", "none", "--decoder_window", "24"]
SCAN_STACK = ["--content_read", "decoder", "--placement", "stack"]
# The Multi30K design with SCAN's decoder and PANM deciding EOS: the base of the one-design rows below.
MULTI30K_SCAN_EOS = ["--model", "panm", *SCAN_DECODER, *MULTI30K_DESIGN, "--eos_decision", "panm"]
# The one design, the examples' defaults (docs/results/scan.md#one-design-for-three-tasks): the SCAN design
# (`panm_nope_cr_window`) with g^o reading z_t, 1,024 wide, half the samples' g^o without it, dropout 0.3 on PANM's
# output and the content read only, the content read's keys carrying each slot's distance from the end.
ONE_DESIGN = ["--model", "panm", "--panm_design", "one"]
# Named designs: the flags each adds to run_scan.py (docs/results/scan.md measures them).
DESIGNS = {
    "transformer": ["--model", "transformer", "--decoder_positions", "absolute"],
    "transformer_nope": ["--model", "transformer", "--decoder_positions", "none"],
    # the paper's integration: the Controller replaces the last decoder layer
    "panm": ["--model", "panm", "--decoder_positions", "absolute"],
    "panm_nope": ["--model", "panm", "--decoder_positions", "none"],
    # the decoder's positions start at a random offset in training (PANM's random base address, for the decoder)
    "transformer_offset": ["--model", "transformer", "--decoder_positions", "offset"],
    "panm_offset": ["--model", "panm", "--decoder_positions", "offset"],
    "panm_stack_offset": ["--model", "panm", "--decoder_positions", "offset", "--placement", "stack"],
    "panm_nope_cr": ["--model", "panm", "--decoder_positions", "none", "--content_read", "decoder"],
    "panm_nope_stack": ["--model", "panm", "--decoder_positions", "none", "--placement", "stack"],
    # ALiBi's distance bias in place of the decoder's absolute positions (panm_hf/decoder_positions.py)
    "transformer_alibi": ["--model", "transformer", "--decoder_positions", "alibi"],
    "panm_alibi_cr": ["--model", "panm", "--decoder_positions", "alibi", "--content_read", "decoder"],
    # the decoder's self-attention limited to its last 24 tokens (no query sees more tokens than in training)
    "transformer_nope_window": ["--model", "transformer", "--decoder_positions", "none", "--decoder_window", "24"],
    "panm_nope_cr_window": ["--model", "panm", "--decoder_positions", "none", "--content_read", "decoder",
                            "--decoder_window", "24"],
    # the one design with the content read keyed by `M` alone (its first measured form)
    "panm_one_design": [*ONE_DESIGN, "--content_read_keys", "memory"],
    # the one design: the content read's keys carry each slot's distance from the last real slot (place_value's
    # digit lies a fixed number of slots before the end); run_scan.py's defaults
    "panm_one_design_ek": ONE_DESIGN,
    # the translation and math examples' design (docs/results/transformer_integration.md), 128-wide GRUs
    "panm_example": ["--model", "panm", "--decoder_positions", "absolute", *MULTI30K_DESIGN],
    # one design for SCAN and Multi30K? (docs/results/scan.md#one-design-for-three-tasks): SCAN's decoder changes
    # on the Multi30K design, and the whole decoder kept (`stack`) under SCAN's design; `_eos`: PANM decides EOS
    "panm_example_nope_window": ["--model", "panm", *SCAN_DECODER, *MULTI30K_DESIGN],
    "panm_example_nope_window_eos": MULTI30K_SCAN_EOS,
    # the same without drop-path (a training regulariser, not part of the model at inference): the Multi30K
    # design's architecture trained as SCAN needs (the later `--panm_drop_path` overrides MULTI30K_DESIGN's 0.5)
    "panm_example_nope_window_eos_dp0": [*MULTI30K_SCAN_EOS, "--panm_drop_path", "0"],
    # the same two at the library's default widths (256-wide GRUs, as every SCAN design above; the Multi30K
    # design's 128 is translation's protocol): on SCAN the width, not `shift`, was most of the gap
    "panm_example_nope_window_eos_w256": [*MULTI30K_SCAN_EOS, *WIDE_POINTER_UNITS, *WIDE_CONTROLLER],
    "panm_example_nope_window_eos_dp0_w256": [
        *MULTI30K_SCAN_EOS, "--panm_drop_path", "0", *WIDE_POINTER_UNITS, *WIDE_CONTROLLER,
    ],
    # which GRU's width: the Pointer Units' (`_p256`) or the Controller's (`_c256`), the other at 128
    "panm_example_nope_window_eos_p256": [*MULTI30K_SCAN_EOS, *WIDE_POINTER_UNITS],
    "panm_example_nope_window_eos_c256": [*MULTI30K_SCAN_EOS, *WIDE_CONTROLLER],
    "panm_stack_nope_cr_window": ["--model", "panm", *SCAN_DECODER, *SCAN_STACK],
    "panm_stack_nope_cr_window_eos": ["--model", "panm", *SCAN_DECODER, *SCAN_STACK, "--eos_decision", "panm"],
    # the Controller in place of the last decoder layer, that layer's input added back (`residual`): the LM head
    # sees the 2-layer decoder's state z_t beside PANM's output (what Multi30K's vocabulary needs), PANM decides EOS
    "panm_residual_nope_cr_window_eos": [
        "--model", "panm", *SCAN_DECODER, "--content_read", "decoder", "--placement", "residual", "--eos_decision",
        "panm",
    ],
    "panm_stack_nope_cr_window_eos_dp": [
        "--model", "panm", *SCAN_DECODER, *SCAN_STACK, "--eos_decision", "panm", "--panm_drop_path", "0.5",
    ],
    # `panm_stack_nope_cr_window_eos` with its Controller GRU's z_t input zeroed (a control, controls.py): can the
    # stop come from the reads and the Controller's own recurrence, without the decoder's state?
    "panm_stack_nope_cr_window_eos_no_z": [
        "--model", "panm", *SCAN_DECODER, *SCAN_STACK, "--eos_decision", "panm", "--control", "no_decoder_input",
    ],
    # the controls: the same model with its Mode-1 and Mode-2 values zeroed from the first step (controls.py)
    "panm_nope_no_pointer_reads": ["--model", "panm", "--decoder_positions", "none", "--control", "no_pointer_reads"],
    "panm_nope_cr_no_pointer_reads": [
        "--model",
        "panm",
        "--decoder_positions",
        "none",
        "--content_read",
        "decoder",
        "--control",
        "no_pointer_reads",
    ],
    # Csordas et al.'s trafo_scan profile (sinusoidal positions, dropout 0.5, 8 heads, batch 256, lr 1e-3 held
    # constant, clip 5)
    "transformer_csordas": [
        "--model",
        "transformer",
        "--decoder_positions",
        "absolute",
        "--backbone",
        "marian",
        "--dropout",
        "0.5",
        "--attention_heads",
        "8",
        "--per_device_train_batch_size",
        "256",
        "--learning_rate",
        "1e-3",
        "--warmup_steps",
        "0",
        "--max_grad_norm",
        "5",
        "--lr_scheduler_type",
        "constant",
    ],
}  # a design's flags come after the budget's and --backbone, so they win


def run_dir(output_dir: str, design: str, cutoff: int, seed: int) -> Path:
    return Path(output_dir) / f"{design}_L{cutoff}_s{seed}"


def command(design: str, cutoff: int, seed: int, args: argparse.Namespace) -> list[str]:
    script = str(Path(__file__).resolve().parent / "run_scan.py")
    return [
        sys.executable, script, "--data_dir", args.data_dir, "--cutoff", str(cutoff), "--seed", str(seed),
        "--backbone", args.backbone, *BUDGET, *PAPER_INTEGRATION, *DESIGNS[design], *args.extra,
        "--output_dir", str(run_dir(args.output_dir, design, cutoff, seed)),
    ]  # fmt: skip


def run_all(args: argparse.Namespace) -> None:
    pending = [
        (design, cutoff, seed)
        for seed in args.seeds
        for cutoff in args.cutoffs
        for design in args.designs
        if not (run_dir(args.output_dir, design, cutoff, seed) / "results.json").exists()
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    running: list[subprocess.Popen] = []
    failed = []
    while pending or running:
        while pending and len(running) < args.jobs:
            design, cutoff, seed = pending.pop(0)
            folder = run_dir(args.output_dir, design, cutoff, seed)
            folder.mkdir(parents=True, exist_ok=True)
            log = open(folder / "log.txt", "w")  # noqa: SIM115 (closed with the process)
            process = subprocess.Popen(
                command(design, cutoff, seed, args), stdout=log, stderr=subprocess.STDOUT, env=env
            )
            process.log, process.name = log, folder.name
            running.append(process)
        process = running.pop(0)
        if process.wait() != 0:
            failed.append(process.name)
        process.log.close()
        print(f"{process.name}: exit {process.returncode}", flush=True)
    if failed:
        raise SystemExit(f"failed runs (see their log.txt): {failed}")


def summary(output_dir: str) -> list[dict]:
    """One row per (design, cut-off): exact match per seed and the median, i.i.d. EM, the EOS diagnosis."""
    rows: dict[tuple, list] = {}
    for path in sorted(Path(output_dir).glob("*/results.json")):
        result = json.loads(path.read_text())
        design, _, _ = path.parent.name.rpartition("_L")
        (model_result,) = result["results"].values()
        rows.setdefault((design, result["cutoff"]), []).append((result["seed"], model_result))
    table = []
    for (design, cutoff), runs in sorted(rows.items()):
        runs.sort(key=lambda pair: pair[0])
        test = [r["test"]["exact_match"] for _, r in runs]
        eos = {
            key: statistics.median(r["test"]["eos_diagnosis"][key] for _, r in runs)
            for key in ("early", "late", "content")
        }
        heldout = statistics.median(r["heldout"]["exact_match"] for _, r in runs)
        seeds = [seed for seed, _ in runs]
        table.append({"design": design, "cutoff": cutoff, "seeds": seeds, "test": test,
                      "median": statistics.median(test), "heldout": heldout, **eos})  # fmt: skip
    return table


def print_summary(table: list[dict]) -> None:
    print("| design | L | seeds | longer-output EM (each) | median | i.i.d. EM | early | late | right length, wrong |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for row in table:
        each = " / ".join(f"{value:.1f}" for value in row["test"])
        seeds = ",".join(map(str, row["seeds"]))
        print(
            f"| {row['design']} | {row['cutoff']} | {seeds} | {each} | {row['median']:.1f} | "
            f"{row['heldout']:.1f} | {row['early']:.1f} | {row['late']:.1f} | {row['content']:.1f} |"
        )


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data_dir", default="../shared/data/scan")
    parser.add_argument("--designs", nargs="+", default=["transformer", "panm"], choices=sorted(DESIGNS))
    parser.add_argument("--cutoffs", nargs="+", type=int, default=list(CUTOFFS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--backbone", default="bart", choices=("bart", "marian", "t5"))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--summary", action="store_true", help="print the table of the existing JSONs; train nothing")
    args, extra = parser.parse_known_args(argv)
    args.extra = extra  # passed on to every run_scan.py (e.g. --max_steps 6 --smoke)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1 (got {args.jobs})")
    for cutoff in args.cutoffs:
        if not 1 <= cutoff < 48:
            parser.error(f"--cutoffs must be in 1..47 (SCAN's outputs have 1-48 actions); got {cutoff}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_arguments(argv)
    if not args.summary:
        run_all(args)
    table = summary(args.output_dir)
    print_summary(table)
    return table


if __name__ == "__main__":
    main()
