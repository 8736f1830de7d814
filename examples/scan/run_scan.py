#!/usr/bin/env python
"""SCAN length generalisation: Transformer vs Transformer + PANM at a length cut-off (paper, Table 3 left).

The cut-off protocol of Newman et al. 2020 / Csordas et al. 2021 on SCAN's `tasks.txt`
(`panm_hf.pipelines.scan_data`): commands whose action sequence has at most `--cutoff` L actions form
the training range, 10% of it (NumPy `RandomState(1234)`, as Csordas et al.) is held out as an i.i.d.
set, and every longer command is the test set (L = 22 is SCAN's standard length split). Word-level
vocabulary, greedy decoding, exact match overall and per target length, and the EOS diagnosis: for
every wrong output, did it stop early, run late, or have the right length with wrong content.

Both models share the backbone config, the vocabulary, the data order, the seed and the step budget;
the PANM model is the same backbone with PANM plugged into its decoder (`--placement`, and every
`PanmMemoryConfig` field). `--decoder_positions none` removes the decoder's absolute positions
(zeroed and frozen), for either model; `offset` and `alibi` are the other position signals of
`panm_hf/decoder_positions.py`. `--eval_every N` scores a fixed sample of the test and
i.i.d. sets every N steps: the curve against steps.

    python examples/scan/run_scan.py --data_dir ../shared/data/scan --cutoff 26 \
        --output_dir runs/scan_smoke --model both --smoke --report_to none
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from datasets import Dataset
from transformers import (
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from panm_hf import PanmMemoryConfig
from panm_hf.pipelines import seq2seq
from panm_hf.pipelines.scan_data import ScanSplit, load_cutoff_split, score, word_tokenizer
from panm_hf.pipelines.script_conventions import (
    TRAINING_DEFAULTS,
    ScriptArguments,
    apply_default_steps,
    check_run,
    check_sets,
    load_file_pairs,
    load_tokenizer,
    log_and_save,
    model_source,
    train,
    use_cpu_for_multi_process_launch,
    write_results,
)
from panm_hf.pipelines.seq2seq import (
    MODELS,
    apply_smoke,
    backbone_config,
    build_model,
    model_trainer,
    parse_with_defaults,
    validate_model_args,
)


@dataclass
class ModelArguments(seq2seq.ModelArguments):
    """The seq2seq examples' model flags with the SCAN defaults (Csordas et al.'s trafo_scan sizes)."""

    backbone: str = field(
        default="bart", metadata={"help": "bart (learned positions), marian (sinusoidal) or t5 (relative)."}
    )
    num_layers: int = field(default=3, metadata={"help": "Encoder and decoder layers (Csordas et al.: 3 + 3)."})
    d_model: int = field(default=128, metadata={"help": "Transformer hidden size."})
    ffn_dim: int = field(default=256, metadata={"help": "Transformer feed-forward size."})
    attention_heads: int = field(default=4, metadata={"help": "Attention heads per layer (Csordas et al.: 8)."})
    vocab_size: int = field(default=0, metadata={"help": "Unused: the vocabulary is SCAN's words."})


@dataclass
class DataArguments(ScriptArguments):
    """Which cut-off, and how much of the data; or --train_file/--validation_file/--test_file used as given
    (columns "command" and "actions" unless --source_column/--target_column)."""

    data_dir: str = field(default="../shared/data/scan", metadata={"help": "Folder with tasks.txt.gz."})
    cutoff: int = field(default=22, metadata={"help": "L: train on at most L actions, test on longer (paper: 22-40)."})
    heldout_fraction: float = field(default=0.1, metadata={"help": "i.i.d. share of the training range (0.1)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Random subset of the training range."})
    max_test_samples: int | None = field(default=None, metadata={"help": "Random subset of the test set."})
    max_heldout_samples: int | None = field(default=None, metadata={"help": "Random subset of the i.i.d. set."})
    eval_every: int = field(default=0, metadata={"help": "Score a sample of test and i.i.d. every N steps (0: off)."})
    curve_samples: int = field(default=512, metadata={"help": "Size of that sample (each set)."})
    max_new_tokens: int = field(default=64, metadata={"help": "Greedy decoding limit (SCAN's longest: 48 + EOS)."})
    smoke: bool = field(default=False, metadata={"help": "Tiny slice and tiny models: a CI run in seconds."})


SMOKE_OVERRIDES = {
    "model": {"d_model": 32, "ffn_dim": 64, "attention_heads": 2, "num_layers": 2},
    "panm": {"pointer_hidden_size": 32, "controller_hidden_size": 32, "mlp_hidden_size": 32},
    "data": {"max_train_samples": 256, "max_test_samples": 32, "max_heldout_samples": 16, "max_new_tokens": 56},
    "training": {"max_steps": 6, "per_device_train_batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 0},
}  # fmt: skip


def tokenize(split: ScanSplit, tokenizer) -> Dataset:
    encoded = tokenizer(split.commands)
    labels = tokenizer(split.actions)
    return Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels["input_ids"]}
    )


@torch.no_grad()
def greedy_actions(model, split: ScanSplit, tokenizer, batch_size: int, max_new_tokens: int, **limits) -> list[str]:
    """Greedy action sequences for `split.commands`, decoded to space-separated words; `limits` are further
    `generate()` arguments (`eos_oracle.py` forces lengths with them)."""
    was_training = model.training
    model.eval()
    outputs = []
    for start in range(0, len(split.commands), batch_size):
        batch = tokenizer(split.commands[start : start + batch_size], padding=True, return_tensors="pt")
        generated = model.generate(
            input_ids=batch["input_ids"].to(model.device),
            attention_mask=batch["attention_mask"].to(model.device),
            max_new_tokens=max_new_tokens, num_beams=1, do_sample=False, **limits,
        )  # fmt: skip
        outputs += [" ".join(t.split()) for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    model.train(was_training)
    return outputs


class CurveCallback(TrainerCallback):
    """Every `every` steps, greedy exact match on fixed samples of the test and i.i.d. sets; with `trainer`'s
    weight average (`--weight_average_decay`), the average's too (`<set>_average_exact_match`)."""

    def __init__(self, sets: dict[str, ScanSplit], tokenizer, every: int, batch_size: int, max_new_tokens: int,
                 trainer=None):  # fmt: skip
        self.sets, self.tokenizer, self.every = sets, tokenizer, every
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.trainer = trainer
        self.curve: list[dict] = []

    def score_into(self, point: dict, model, suffix: str = "") -> None:
        for name, split in self.sets.items():
            predictions = greedy_actions(model, split, self.tokenizer, self.batch_size, self.max_new_tokens)
            scored = score(predictions, split)
            point[f"{name}{suffix}_exact_match"] = scored["exact_match"]
            point[f"{name}{suffix}_eos"] = scored["eos_diagnosis"]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.is_world_process_zero:
            point = {"step": state.global_step}
            self.score_into(point, model)
            if self.trainer is not None and self.trainer.weight_average is not None:
                with self.trainer.weight_average_swapped_in() as averaged:
                    self.score_into(point, averaged, "_average")
            self.curve.append(point)
            print(json.dumps(point), flush=True)


def score_sets(trainer, sets: dict, prefix: str, tokenizer, batch_size: int, max_new_tokens: int) -> dict:
    """Greedy exact match (own scoring) and teacher-forced loss of each set; `<prefix>_results.json` holds them."""
    result, metrics = {}, {}
    for key, split in sets.items():
        predictions = greedy_actions(trainer.model, split, tokenizer, batch_size, max_new_tokens)
        result[key] = score(predictions, split)
        result[key]["examples"] = [
            {"command": c, "target": a, "prediction": p}
            for c, a, p in zip(split.commands, split.actions, predictions)
            if c and p != a
        ][:5]
        metrics.update(trainer.evaluate(tokenize(split, tokenizer), metric_key_prefix=f"{prefix}_{key}"))
        metrics.update({f"{prefix}_{key}_exact_match": result[key]["exact_match"],
                        f"{prefix}_{key}_samples": len(split.commands)})  # fmt: skip
    log_and_save(trainer, prefix, metrics)
    return result


def run_one(name, model_args, panm_args, data_args, training_args, tokenizer, config, datasets, sets) -> dict:
    """Train one model for the step budget, then score the evaluation (and test) sets."""
    set_seed(training_args.seed)  # both models start from the same random stream and see the same batches
    model = build_model(name, model_args, panm_args, config)  # with its --decoder_positions
    batch_size = training_args.per_device_eval_batch_size
    curve_sets = {key: split.subset(data_args.curve_samples, training_args.seed) for key, split in sets["eval"].items()}
    trainer = model_trainer(
        name, model, tokenizer, training_args, datasets["train"], generate=False,
        panm_weight_decay=model_args.panm_weight_decay, weight_average_decay=model_args.weight_average_decay,
    )  # fmt: skip
    callback = CurveCallback(curve_sets, tokenizer, data_args.eval_every, batch_size, data_args.max_new_tokens,
                             trainer)  # fmt: skip
    trainer.add_callback(callback)  # after the weight average's callback: a point sees the step's average
    result = {"num_parameters": sum(p.numel() for p in model.parameters())}
    if training_args.do_train:
        result.update(train(trainer, data_args, len(datasets["train"]), data_args.train_file or data_args.data_dir))
    result["curve"] = callback.curve
    start = time.time()
    if training_args.do_eval:
        result.update(score_sets(trainer, sets["eval"], "eval", tokenizer, batch_size, data_args.max_new_tokens))
    if training_args.do_predict:
        result.update(score_sets(trainer, sets["test"], "predict", tokenizer, batch_size, data_args.max_new_tokens))
    if trainer.weight_average is not None:  # --weight_average_decay: the same scoring on the average
        with trainer.weight_average_swapped_in():
            result["average"] = {}
            if training_args.do_eval:
                result["average"].update(score_sets(trainer, sets["eval"], "eval_average", tokenizer, batch_size,
                                                    data_args.max_new_tokens))  # fmt: skip
            if training_args.do_predict:
                result["average"].update(score_sets(trainer, sets["test"], "predict_average", tokenizer,
                                                    batch_size, data_args.max_new_tokens))  # fmt: skip
    result["generate_seconds"] = round(time.time() - start, 1)
    return result


def load_sets(data_args: DataArguments, seed: int) -> dict:
    """The training set and {name: set} to evaluate and to predict: the given files, or the cut-off split."""
    if data_args.given_files():
        pairs = load_file_pairs(data_args, ("command",), ("actions",))
        files = {split: ScanSplit(*pair) for split, pair in pairs.items()}
        return {"train": files.get("train"), "eval": {k: v for k, v in files.items() if k == "validation"},
                "test": {k: v for k, v in files.items() if k == "test"}}  # fmt: skip
    train, heldout, test = load_cutoff_split(data_args.data_dir, data_args.cutoff, data_args.heldout_fraction)
    evaluation = {
        "test": test.subset(data_args.max_test_samples, seed),
        "heldout": heldout.subset(data_args.max_heldout_samples, seed),
    }
    return {"train": train, "eval": evaluation, "test": {}}


def validate(model_args: ModelArguments, data_args: DataArguments, training_args) -> None:
    validate_model_args(model_args, scores_weight_average=True)
    check_run(data_args, training_args, model_args.model)
    if not 0.0 < data_args.heldout_fraction < 1.0:
        raise ValueError(f"--heldout_fraction must be in (0, 1) (got {data_args.heldout_fraction}).")
    if training_args.do_train and training_args.max_steps <= 0:
        raise ValueError("--max_steps must be set: the budget is a number of training steps (Csordas et al.: 50K).")


def parse_arguments(argv: list[str]) -> tuple:
    """`(model_args, panm_args, data_args, training_args)` from the command line, with the SCAN defaults."""
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, Seq2SeqTrainingArguments))
    return parse_with_defaults(parser, TRAINING_DEFAULTS, argv)


def main(argv: list[str] | None = None) -> dict:
    use_cpu_for_multi_process_launch()
    argv = sys.argv[1:] if argv is None else argv
    model_args, panm_args, data_args, training_args = parse_arguments(argv)
    apply_default_steps(training_args, argv, ("do_train", "do_eval"))
    if data_args.smoke:
        apply_smoke(SMOKE_OVERRIDES, model_args, panm_args, data_args, training_args)
    validate(model_args, data_args, training_args)
    training_args.eval_strategy = "no"  # SCAN scores by generation (score_sets, --eval_every), not Trainer's loss
    set_seed(training_args.seed)

    sets = load_sets(data_args, training_args.seed)
    if sets["train"] is not None:
        sets["train"] = sets["train"].subset(data_args.max_train_samples, training_args.seed)
    check_sets(training_args, {key for key in ("train", "eval", "test") if sets[key]},
               {"do_train": "train", "do_eval": "eval", "do_predict": "test"})  # fmt: skip
    names = MODELS if model_args.model == "both" else (model_args.model,)
    sources = {name: model_source(name, data_args, training_args) for name in names}
    if sources[names[0]] is not None:
        tokenizer = load_tokenizer(sources[names[0]])
    else:  # every SCAN word occurs at every cut-off
        tokenizer = word_tokenizer(sets["train"].commands + sets["train"].actions)
    datasets = {"train": tokenize(sets["train"], tokenizer) if training_args.do_train else None}
    max_positions = 64  # SCAN's longest output is 48 actions + EOS (+ --max_position_offset for offset)
    config = backbone_config(model_args, tokenizer, max_positions) if None in sources.values() else None
    results = {
        name: run_one(name, model_args, panm_args, data_args, training_args, tokenizer, sources[name] or config,
                      datasets, sets)
        for name in names
    }  # fmt: skip
    summary = {
        "cutoff": data_args.cutoff, "max_steps": training_args.max_steps,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "learning_rate": training_args.learning_rate, "seed": training_args.seed,
        "num_train": len(sets["train"].commands) if sets["train"] else 0,
        "num_eval": {key: len(split.commands) for key, split in {**sets["eval"], **sets["test"]}.items()},
        "model_args": {**asdict(model_args), **asdict(panm_args)}, "data_args": asdict(data_args),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "command": " ".join(["python", "examples/scan/run_scan.py", *argv]), "results": results,
    }  # fmt: skip
    write_results(training_args, summary)
    if training_args.process_index == 0:
        for name, result in results.items():
            scores = ", ".join(f"{key} {result[key]['exact_match']:.1f}%" for key in sets["eval"] if key in result)
            print(f"{name}: L={data_args.cutoff} {scores} exact match")
    return summary


if __name__ == "__main__":
    main()
