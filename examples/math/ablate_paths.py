#!/usr/bin/env python
"""Where a trained PANM model's Mathematics answers come from: exact match with one path to the output cut.

Loads a `run_math.py` run (its `results.json` and saved `panm/` model) and scores greedy answers on the module's
`interpolate` and `extrapolate` sets (the run's first N pairs) with, in turn, nothing cut and each of:

- `no_output_decoder_input`: `g^o`'s `z_t` columns zeroed (with `output_decoder_input`; the GRU keeps `z_t`);
- `no_pointer_reads`: the Mode-1 and Mode-2 values zeroed at the Controller (`panm_hf/pipelines/controls.py`);
- `no_content_read`: the decoder content read zeroed at the Controller;
- `no_reads`: every read zeroed;
- `no_decoder_input`: `z_t` zeroed where the Controller takes it (its GRU and `g^o`).

A cut that leaves the score where it is marks a path the answer does not need; one that lowers it, a path it
does. Cuts apply at test time only, to a model trained whole (the training-time controls are `--control`).
On place_value the uncut model's exact match per asked place is reported too (`<split>_by_place`).

    python examples/math/ablate_paths.py runs/pv/pv3k_one_s43 --data_dir ../shared/data/math --output paths.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from run_math import SPLITS, read_pairs
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import panm_hf  # noqa: F401  (registers PANM with the Auto classes)
from panm_hf.decoder_positions import apply as apply_decoder_positions
from panm_hf.pipelines.controls import zero_decoder_input, zero_reads

PLACE = re.compile(r"the ([a-z ]+) digit of")  # place_value's asked place


def zero_output_decoder_input(model):
    """Zero the `z_t` columns (the last ones) of `g^o`'s input; ValueError unless `g^o` reads `z_t`."""
    controller = model.panm.controller
    if not controller.output_reads_decoder:
        raise ValueError("no_output_decoder_input needs a model trained with --output_decoder_input true.")
    width = controller.decoder_input_size

    def hook(module, inputs):
        rows = inputs[0].clone()  # (rows, g^o input): the z_t columns last
        rows[..., rows.shape[-1] - width :] = 0
        return (rows,)

    return controller.output_mlp[0].register_forward_pre_hook(hook)


def zero_content_read(model):
    """Zero the decoder content read (the last `memory_dim` columns of the reads) at the Controller."""
    if model.panm.content_reader is None:
        raise ValueError("no_content_read needs a model trained with --content_read decoder.")
    width = model.panm.memory_dim

    def hook(module, inputs):
        reads = inputs[0].clone()  # (.., num_reads * dim): the content read last
        reads[..., reads.shape[-1] - width :] = 0
        return (reads, *inputs[1:])

    return model.panm.controller.register_forward_pre_hook(hook)


CUTS = {
    "none": lambda model: None,
    "no_output_decoder_input": zero_output_decoder_input,
    "no_pointer_reads": zero_reads,
    "no_content_read": zero_content_read,
    "no_reads": lambda model: zero_reads(model, include_content_read=True),
    "no_decoder_input": zero_decoder_input,
}


def load_run(run_dir: Path):
    """(results.json, the saved PANM model in eval mode with the run's decoder settings, its tokenizer)."""
    summary = json.loads((run_dir / "results.json").read_text())
    model_dir = run_dir / "panm"
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} holds no saved PANM model; train one with run_math.py --model panm.")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    args = summary["model_args"]  # a model saved before PanmConfig kept the decoder settings gets them here
    apply_decoder_positions(model, args.get("decoder_positions", "absolute"), args.get("max_position_offset", 64),
                            args.get("decoder_window", 0))  # fmt: skip
    return summary, model, AutoTokenizer.from_pretrained(model_dir)


def correct_answers(model, tokenizer, questions, answers, batch_size: int, max_length: int) -> list[bool]:
    """Whether each greedy answer equals its reference."""
    correct = []
    with torch.no_grad():
        for start in range(0, len(questions), batch_size):
            batch = tokenizer(questions[start : start + batch_size], return_tensors="pt", padding=True,
                              truncation=True, max_length=160)  # fmt: skip
            generated = model.generate(**batch, max_length=max_length, num_beams=1, do_sample=False)
            texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
            correct += [text.strip() == answer for text, answer in zip(texts, answers[start : start + batch_size])]
    return correct


def by_place(questions: list[str], correct: list[bool]) -> dict:
    """place_value's exact match per asked place ("tens", "hundred billions", ...), with each place's count."""
    groups = {}
    for question, right in zip(questions, correct):
        match = PLACE.search(question)
        groups.setdefault(match.group(1) if match else "other", []).append(right)
    return {place: {"count": len(r), "exact_match": round(100.0 * sum(r) / len(r), 1)} for place, r in groups.items()}


def ablate(run_dir: Path, data_dir: Path, cuts: list[str], batch_size: int = 250) -> dict:
    summary, model, tokenizer = load_run(run_dir)
    limit = summary["data_args"].get("max_eval_samples")
    max_length = summary["data_args"].get("max_target_length", 32)
    result = {}
    for split in SPLITS:
        questions, answers = read_pairs(data_dir / f"{summary['module']}.{split}.tsv.gz", limit)
        for cut in cuts:
            handle = CUTS[cut](model)
            correct = correct_answers(model, tokenizer, questions, answers, batch_size, max_length)
            if handle is not None:
                handle.remove()
            result[f"{split}_{cut}"] = round(100.0 * sum(correct) / len(correct), 1)
            if cut == "none" and summary["module"] == "place_value":  # which places the whole model gets
                result[f"{split}_by_place"] = by_place(questions, correct)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run_math.py output folders (results.json, panm/).")
    parser.add_argument("--data_dir", type=Path, default=Path("../shared/data/math"))
    parser.add_argument("--cuts", nargs="+", choices=tuple(CUTS), default=list(CUTS))
    parser.add_argument("--output", type=Path, help="Write {run: {split_cut: exact match}} as JSON here.")
    args = parser.parse_args(argv)
    results = {}
    for run_dir in args.run_dirs:
        results[run_dir.name] = ablate(run_dir, args.data_dir, args.cuts)
        print(run_dir.name, json.dumps(results[run_dir.name]))
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
