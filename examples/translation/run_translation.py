#!/usr/bin/env python
"""Length generalisation in translation: Transformer vs Transformer + PANM on Multi30K (paper, Fig. 3b).

The pooled data are sorted by source length; models train on the shortest `--split_ratio`
and are tested on the longest rest. Both models share the backbone config, the tokenizer
(trained here on the training split), the data and the training budget; the PANM model
is the same backbone with PANM plugged into its decoder (`--placement stack`, every backbone
layer kept and PANM's output added through a zero-initialised residual, with `--panm_drop_path 0.5`:
the measured best and the default; `replace`, the paper's setup; or `residual`).
Reports test perplexity (per epoch and final) and sacreBLEU, writes them to
`<output_dir>/results.json`, and with `--plot` draws the per-epoch test perplexity of both models.

    python examples/translation/run_translation.py --data_dir ../shared/data/multi30k \
        --output_dir runs/mt --model both --smoke
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import sacrebleu
import torch
from datasets import Dataset
from length_split import TranslationPairs, hold_out, length_split, load_hub_pairs, load_local_pairs, sample
from local_tokenizer import train_tokenizer
from transformers import HfArgumentParser, Seq2SeqTrainingArguments, set_seed

from panm_hf import PanmMemoryConfig
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
    ModelArguments,
    apply_smoke,
    backbone_config,
    build_model,
    gather_checksums,
    model_trainer,
    parse_with_defaults,
    validate_model_args,
)

# test perplexity every epoch is the figure's curve; a flag given wins
EXAMPLE_DEFAULTS = {**TRAINING_DEFAULTS, "eval_strategy": "epoch"}


@dataclass
class DataArguments(ScriptArguments):
    """Where the data come from and how they are split: --data_dir/--dataset_name pooled for the length split,
    or --train_file/--validation_file/--test_file used as given (columns --source_lang/--target_lang, or a
    "translation" dict of them)."""

    data_dir: str | None = field(
        default=None, metadata={"help": "Folder with {train,val,test_2016_flickr}.{en,de}.gz."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset instead of --data_dir (online)."})
    dataset_config_name: str | None = field(default=None)
    source_lang: str = field(default="en")
    target_lang: str = field(default="de")
    split_ratio: float = field(default=0.8, metadata={"help": "Train on this shortest fraction (paper: 0.8, 0.5)."})
    max_pool_samples: int | None = field(default=None, metadata={"help": "Random subset of the pool before splitting."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Random subset of the training split."})
    max_test_samples: int | None = field(default=None, metadata={"help": "Random subset of the test split."})
    heldout_samples: int | None = field(
        default=None,
        metadata={
            "help": "Hold this many random training-split pairs out of training and report their perplexity every "
            "epoch beside the test split's: in-distribution lengths, so over-fitting shows apart from the length shift."
        },
    )
    max_source_length: int = field(default=128)
    max_target_length: int = field(default=128)
    smoke: bool = field(default=False, metadata={"help": "Tiny slice and tiny models: a CI run in seconds."})
    plot: bool = field(default=False, metadata={"help": "Plot test perplexity per epoch to test_perplexity.png."})


SMOKE_OVERRIDES = {
    "model": {"d_model": 32, "ffn_dim": 64, "attention_heads": 2, "num_layers": 2, "vocab_size": 400},
    "panm": {"pointer_hidden_size": 32, "controller_hidden_size": 32, "mlp_hidden_size": 32},
    "data": {"max_pool_samples": 800, "max_test_samples": 48, "max_source_length": 48, "max_target_length": 48},
    "training": {"num_train_epochs": 2, "per_device_train_batch_size": 32, "per_device_eval_batch_size": 48,
                 "learning_rate": 3e-3, "warmup_steps": 0},
}  # fmt: skip


def validate(model_args: ModelArguments, data_args: DataArguments) -> None:
    validate_model_args(model_args, scores_weight_average=True)
    sources = [data_args.data_dir is not None, data_args.dataset_name is not None, bool(data_args.given_files())]
    if sum(sources) != 1:
        raise ValueError(
            "Give one data source: --data_dir (local Multi30K files), --dataset_name (Hub), or "
            "--train_file/--validation_file/--test_file (json, jsonl or csv, used as given)."
        )


def tokenize(pairs: TranslationPairs, tokenizer, data_args: DataArguments) -> Dataset:
    encoded = tokenizer(
        pairs.sources,
        text_target=pairs.targets,
        max_length=data_args.max_source_length,
        truncation=True,
    )
    labels = tokenizer(text_target=pairs.targets, max_length=data_args.max_target_length, truncation=True)
    return Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels["input_ids"]}
    )


def best_epoch(epoch_perplexity: list[dict]) -> dict | None:
    """The entry of `epoch_perplexity` with the lowest test perplexity (the paper's figure's measure); None if empty."""
    return min(epoch_perplexity, key=lambda entry: entry["test_perplexity"], default=None)


@dataclass
class TranslationData:
    """The tokenized sets a run uses (None where it does not use one) and the test pairs for BLEU."""

    train: Dataset | None
    eval: Dataset | None
    test: Dataset | None
    test_pairs: TranslationPairs | None
    heldout: Dataset | None = None


def epoch_curve(log_history: list[dict], test_key: str, heldout: bool) -> list[dict]:
    """Test (and held-out) perplexity of every evaluation logged during training."""
    test = [entry for entry in log_history if test_key in entry]
    curve = [{"epoch": entry["epoch"], "test_perplexity": math.exp(entry[test_key])} for entry in test]
    if heldout:
        held = [math.exp(entry["eval_heldout_loss"]) for entry in log_history if "eval_heldout_loss" in entry]
        for point, ppl in zip(curve, held, strict=True):
            point["heldout_perplexity"] = ppl
    return curve


def evaluate_perplexity(trainer, data: TranslationData, test_key: str) -> dict:
    metrics = trainer.evaluate()
    log_and_save(trainer, "eval", {**metrics, "eval_samples": len(data.eval)})
    heldout = None if data.heldout is None else math.exp(metrics["eval_heldout_loss"])
    return {"test_perplexity": math.exp(metrics[test_key]), "test_loss": metrics[test_key],
            "heldout_perplexity": heldout}  # fmt: skip


def predict_bleu(trainer, data: TranslationData, tokenizer, max_length: int, num_beams: int) -> dict:
    """Translate the test set (beam search) and score sacreBLEU."""
    trainer.args.predict_with_generate = True
    start = time.time()
    prediction = trainer.predict(data.test, max_length=max_length, num_beams=num_beams)
    generate_seconds = time.time() - start
    token_ids = np.where(prediction.predictions >= 0, prediction.predictions, tokenizer.pad_token_id)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(token_ids, skip_special_tokens=True)]
    bleu = sacrebleu.corpus_bleu(hypotheses, [data.test_pairs.targets])
    log_and_save(trainer, "predict", {**prediction.metrics, "predict_bleu": bleu.score,
                                      "predict_samples": len(data.test)})  # fmt: skip
    pairs = data.test_pairs
    return {"test_bleu": bleu.score, "bleu_detail": str(bleu), "generate_seconds": round(generate_seconds, 1),
            "examples": [{"source": s, "reference": r, "hypothesis": h} for s, r, h in
                         zip(pairs.sources[:3], pairs.targets[:3], hypotheses[:3])]}  # fmt: skip


def run_one(name, model_args, panm_args, data_args, training_args, tokenizer, config, data: TranslationData) -> dict:
    """Train one model (test perplexity every epoch), evaluate its perplexity, translate the test set for BLEU.

    `config` is a backbone config, or the path of a checkpoint (`--model_name_or_path`, or a saved model).
    """
    set_seed(training_args.seed)  # both models start from the same random stream
    model = build_model(name, model_args, panm_args, config)
    num_beams = training_args.generation_num_beams or 1  # beams for the BLEU translations
    max_length = training_args.generation_max_length or data_args.max_target_length
    # Seq2SeqTrainer pads predictions to generation_config.max_length.
    model.generation_config.max_length = max_length
    model.generation_config.num_beams = num_beams
    # per-epoch evaluation: loss only; BLEU once at the end
    # a dict of eval sets makes Trainer log eval_test_loss / eval_heldout_loss, one entry each
    eval_sets = data.eval if data.heldout is None else {"test": data.eval, "heldout": data.heldout}
    test_key = "eval_loss" if data.heldout is None else "eval_test_loss"
    trainer = model_trainer(
        name, model, tokenizer, training_args, data.train, eval_sets if data.eval is not None else None,
        generate=False, panm_weight_decay=model_args.panm_weight_decay,
        weight_average_decay=model_args.weight_average_decay,
    )  # fmt: skip
    result = {"num_parameters": sum(p.numel() for p in model.parameters())}
    if training_args.do_train:
        result.update(train(trainer, data_args, len(data.train), data_args.train_file or data_args.data_dir or
                            data_args.dataset_name))  # fmt: skip
    result["epoch_perplexity"] = epoch_curve(trainer.state.log_history, test_key, data.heldout is not None)
    result["best_epoch_perplexity"] = best_epoch(result["epoch_perplexity"])
    if model_args.weight_average_decay is not None:  # the moving average's curve (weight_average.py)
        average_key = test_key.removesuffix("_loss") + "_average_loss"  # eval_average_loss, eval_test_average_loss
        result["average_epoch_perplexity"] = epoch_curve(trainer.state.log_history, average_key, False)
        result["best_average_epoch_perplexity"] = best_epoch(result["average_epoch_perplexity"])
    if training_args.do_eval:
        result.update(evaluate_perplexity(trainer, data, test_key))
    if training_args.do_predict:
        result.update(predict_bleu(trainer, data, tokenizer, max_length, num_beams))
    checksums = gather_checksums(trainer.model)
    result.update(rank_checksums=checksums, ranks_in_sync=all(c == checksums[0] for c in checksums))
    return result


def plot_perplexity(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    for name, result in results.items():
        points = result["epoch_perplexity"]
        axis.plot([p["epoch"] for p in points], [p["test_perplexity"] for p in points], marker="o", label=name)
    axis.set_xlabel("epoch")
    axis.set_ylabel("test perplexity")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_arguments(argv: list[str]) -> tuple:
    """The four argument dataclasses from command-line flags, or from one JSON file (`run_translation.py args.json`).

    The example's defaults (`EXAMPLE_DEFAULTS`) apply either way; a flag or JSON key given wins.
    """
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, Seq2SeqTrainingArguments))
    given = None
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(os.path.abspath(argv[0]), encoding="utf-8") as handle:
            given = json.load(handle)
    return parse_with_defaults(parser, EXAMPLE_DEFAULTS, argv, given)


def load_pairs(data_args: DataArguments, seed: int) -> dict[str, TranslationPairs]:
    """Pairs per set: the given files as they are, or the pool's length split (the long part is eval and test)."""
    if data_args.given_files():
        columns = load_file_pairs(data_args, (data_args.source_lang,), (data_args.target_lang,))
        names = {"train": "train", "validation": "eval", "test": "test"}
        return {names[split]: TranslationPairs(*pair) for split, pair in columns.items()}
    if data_args.data_dir is not None:
        pairs = load_local_pairs(data_args.data_dir, data_args.source_lang, data_args.target_lang)
    else:
        pairs = load_hub_pairs(
            data_args.dataset_name, data_args.dataset_config_name, data_args.source_lang, data_args.target_lang
        )
    train_pairs, test_pairs = length_split(sample(pairs, data_args.max_pool_samples, seed), data_args.split_ratio)
    return {"train": train_pairs, "eval": test_pairs, "test": test_pairs}


def prepare_pairs(data_args: DataArguments, training_args) -> dict[str, TranslationPairs]:
    """The sets of this run, sampled (--max_train_samples, --max_test_samples) and with the held-out pairs."""
    seed = training_args.seed
    pairs = load_pairs(data_args, seed)
    check_sets(training_args, set(pairs), {"do_train": "train", "do_eval": "eval", "do_predict": "test"})
    if "train" in pairs:
        pairs["train"] = sample(pairs["train"], data_args.max_train_samples, seed)
    for key in ("eval", "test"):
        if key in pairs:
            pairs[key] = sample(pairs[key], data_args.max_test_samples, seed)
    if data_args.heldout_samples is not None:
        pairs["train"], pairs["heldout"] = hold_out(pairs["train"], data_args.heldout_samples, seed)
    return pairs


def tokenize_sets(pairs: dict, tokenizer, data_args: DataArguments, training_args) -> TranslationData:
    def tokenized(key: str, needed: bool) -> Dataset | None:
        return tokenize(pairs[key], tokenizer, data_args) if needed and key in pairs else None

    evaluates = training_args.do_eval or training_args.eval_strategy != "no"
    return TranslationData(
        train=tokenized("train", training_args.do_train), eval=tokenized("eval", evaluates),
        test=tokenized("test", training_args.do_predict), test_pairs=pairs.get("test"),
        heldout=tokenized("heldout", evaluates),
    )  # fmt: skip


def split_summary(pairs: dict[str, TranslationPairs]) -> dict:
    train, test = pairs.get("train"), pairs.get("eval")
    return {
        "num_train": len(train) if train else 0, "num_test": len(test) if test else 0,
        "num_heldout": len(pairs["heldout"]) if "heldout" in pairs else 0,
        "max_train_source_words": max(len(s.split()) for s in train.sources) if train else None,
        "min_test_source_words": min(len(s.split()) for s in test.sources) if test else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    use_cpu_for_multi_process_launch()
    argv = sys.argv[1:] if argv is None else argv
    model_args, panm_args, data_args, training_args = parse_arguments(argv)
    apply_default_steps(training_args, argv, ("do_train", "do_eval", "do_predict"))
    if data_args.smoke:
        apply_smoke(SMOKE_OVERRIDES, model_args, panm_args, data_args, training_args)
    validate(model_args, data_args)
    check_run(data_args, training_args, model_args.model)
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not training_args.fp16:
        training_args.bf16 = True  # bf16 on GPU; CPU runs stay fp32
    set_seed(training_args.seed)

    pairs = prepare_pairs(data_args, training_args)
    names = MODELS if model_args.model == "both" else (model_args.model,)
    sources = {name: model_source(name, data_args, training_args) for name in names}
    if sources[names[0]] is not None:
        tokenizer = load_tokenizer(sources[names[0]])
    else:  # the tokenizer learns from the training pairs only (never the held-out or test ones)
        tokenizer = train_tokenizer(pairs["train"].sources + pairs["train"].targets, model_args.vocab_size)
    data = tokenize_sets(pairs, tokenizer, data_args, training_args)
    max_positions = max(data_args.max_source_length, data_args.max_target_length) + 2
    config = backbone_config(model_args, tokenizer, max_positions) if None in sources.values() else None
    results = {
        name: run_one(name, model_args, panm_args, data_args, training_args, tokenizer, sources[name] or config, data)
        for name in names
    }
    summary = {
        "split_ratio": data_args.split_ratio, "seed": training_args.seed, "num_layers": model_args.num_layers,
        "placement": model_args.placement, **split_summary(pairs), "world_size": training_args.world_size,
        "model_args": {**asdict(model_args), **asdict(panm_args)}, "data_args": asdict(data_args),
        "num_train_epochs": training_args.num_train_epochs, "learning_rate": training_args.learning_rate,
        "per_device_train_batch_size": training_args.per_device_train_batch_size, "results": results,
    }  # fmt: skip
    write_results(training_args, summary)
    if training_args.process_index == 0:
        if data_args.plot:
            plot_perplexity(
                results,
                os.path.join(training_args.output_dir, "test_perplexity.png"),
                f"Multi30K {data_args.source_lang}-{data_args.target_lang}, split {data_args.split_ratio}, "
                f"{model_args.num_layers} layers",
            )
        for name, result in results.items():
            print(f"{name}: test perplexity {result.get('test_perplexity')}, BLEU {result.get('test_bleu')}")
    return summary


if __name__ == "__main__":
    main()
