#!/usr/bin/env python
"""Length extrapolation on the Mathematics dataset: Transformer vs Transformer + PANM (paper, Table 3 right).

Saxton et al.'s `add_or_sub` and `place_value` modules, character level, as in Csordás et al. 2021
(the setup the paper follows): a Transformer encoder-decoder trained on the train file and scored
by exact match of greedy answers on the `interpolate` set (numbers as in training) and the
`extrapolate` set (larger numbers, longer questions). Both models share the backbone config, the
character vocabulary, the data order, the seed and the step budget; the PANM model is the same
backbone with PANM plugged into its decoder (`--placement`, default `stack` with `--panm_drop_path 0.5`).

    python examples/math/run_math.py --data_dir ../shared/data/math --module place_value \
        --output_dir runs/math_pv --model both --smoke --report_to none
"""

from __future__ import annotations

import gzip
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
    set_seed,
)

from panm_hf import PanmMemoryConfig
from panm_hf.pipelines import seq2seq
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

MODULES = ("add_or_sub", "place_value")
SPLITS = ("interpolate", "extrapolate")
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"


@dataclass
class ModelArguments(seq2seq.ModelArguments):
    """The seq2seq examples' model flags with the Mathematics defaults (character level, 3 + 3 layers)."""

    num_layers: int = field(default=3, metadata={"help": "Encoder and decoder layers (Csordas et al.: 3 + 3)."})
    d_model: int = field(default=128, metadata={"help": "Transformer hidden size."})
    ffn_dim: int = field(default=256, metadata={"help": "Transformer feed-forward size."})
    vocab_size: int = field(default=0, metadata={"help": "Unused: the vocabulary is the training set's characters."})


@dataclass
class DataArguments(ScriptArguments):
    """Which module and how much of it: --data_dir's module files, or --train_file/--validation_file/--test_file
    used as given (columns "question" and "answer" unless --source_column/--target_column)."""

    data_dir: str = field(default="../shared/data/math", metadata={"help": "Folder with <module>.<split>.tsv.gz."})
    module: str = field(default="place_value", metadata={"help": f"One of {MODULES}."})
    max_train_samples: int | None = field(default=None, metadata={"help": "First N training pairs (file order)."})
    max_eval_samples: int | None = field(default=1000, metadata={"help": "First N pairs of each test set."})
    max_source_length: int = field(default=160)
    max_target_length: int = field(default=32)
    smoke: bool = field(default=False, metadata={"help": "Tiny slice and tiny models: a CI run in seconds."})


SMOKE_OVERRIDES = {
    "model": {"d_model": 32, "ffn_dim": 64, "attention_heads": 2, "num_layers": 2},
    "panm": {"pointer_hidden_size": 32, "controller_hidden_size": 32, "mlp_hidden_size": 32},
    "data": {"max_train_samples": 256, "max_eval_samples": 16},
    "training": {"max_steps": 8, "per_device_train_batch_size": 32, "per_device_eval_batch_size": 16,
                 "learning_rate": 3e-3, "warmup_steps": 0},
}  # fmt: skip


def read_pairs(path: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """`question<TAB>answer` lines of a gzipped TSV; ValueError naming the file and line when damaged."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist; --data_dir must hold <module>.<split>.tsv.gz (see shared/data/math).")
    questions, answers = [], []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if limit is not None and len(questions) >= limit:
                    break
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 2 or not fields[0] or not fields[1]:
                    raise ValueError(f"{path}, line {number}: expected 'question<TAB>answer', got {line!r}.")
                questions.append(fields[0])
                answers.append(fields[1])
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is not a readable gzipped UTF-8 file ({error}); restore it from shared/data."
        ) from error
    if not questions:
        raise ValueError(f"{path} holds no pairs.")
    return questions, answers


def char_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over the characters of `texts`; every sequence ends with `</s>`."""
    characters = sorted(set("".join(texts)))
    vocab = {token: index for index, token in enumerate([PAD, UNK, BOS, EOS, *characters])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS
    )


def tokenize(questions: list[str], answers: list[str], tokenizer, data_args: DataArguments) -> Dataset:
    encoded = tokenizer(questions, max_length=data_args.max_source_length, truncation=True)
    labels = tokenizer(answers, max_length=data_args.max_target_length, truncation=True)
    return Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels["input_ids"]}
    )


def exact_match(predictions: np.ndarray, answers: list[str], tokenizer) -> float:
    """Percentage of greedy answers equal to the reference string."""
    token_ids = np.where(predictions >= 0, predictions, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    return 100.0 * float(np.mean([text.strip() == answer for text, answer in zip(texts, answers)]))


def score_sets(trainer, sets: dict, prefix: str, tokenizer, max_length: int) -> dict:
    """Greedy exact match (and teacher-forced loss) on each set; `<prefix>_results.json` holds them."""
    trainer.args.predict_with_generate = True
    metrics, result = {}, {}
    for split, (dataset, answers) in sets.items():
        prediction = trainer.predict(dataset, max_length=max_length, num_beams=1, metric_key_prefix=f"{prefix}_{split}")
        result[f"{split}_accuracy"] = exact_match(prediction.predictions, answers, tokenizer)
        metrics.update(prediction.metrics, **{f"{prefix}_{split}_accuracy": result[f"{split}_accuracy"],
                                              f"{prefix}_{split}_samples": len(answers)})  # fmt: skip
    trainer.args.predict_with_generate = False
    log_and_save(trainer, prefix, metrics)
    return result


def run_one(name, model_args, panm_args, data_args, training_args, tokenizer, config, data: dict) -> dict:
    """Train one model for the step budget, then score exact match on each evaluation (and test) set."""
    set_seed(training_args.seed)  # both models start from the same random stream and see the same batches
    model = build_model(name, model_args, panm_args, config)
    model.generation_config.max_length = data_args.max_target_length
    model.generation_config.num_beams = 1
    # evaluation during training (--eval_strategy): loss on the first evaluation set
    during = next(iter(data["eval"].values()))[0] if data["eval"] and training_args.eval_strategy != "no" else None
    trainer = model_trainer(
        name, model, tokenizer, training_args, data["train"], during, generate=False,
        panm_weight_decay=model_args.panm_weight_decay,
    )  # fmt: skip
    result = {"num_parameters": sum(p.numel() for p in model.parameters())}
    if training_args.do_train:
        result.update(train(trainer, data_args, len(data["train"]), data_args.train_file or data_args.data_dir))
    if training_args.do_eval:
        result.update(score_sets(trainer, data["eval"], "eval", tokenizer, data_args.max_target_length))
    if training_args.do_predict:
        result.update(score_sets(trainer, data["test"], "predict", tokenizer, data_args.max_target_length))
    return result


def load_sets(data_args: DataArguments, training_args) -> dict:
    """(questions, answers) per set: the given files, or the module's train file and its two test sets."""
    if data_args.given_files():
        files = load_file_pairs(data_args, ("question",), ("answer",))
        limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                  "test": data_args.max_eval_samples}  # fmt: skip
        files = {split: (q[: limits[split]], a[: limits[split]]) for split, (q, a) in files.items()}
        return {"train": files.get("train"), "eval": {k: v for k, v in files.items() if k == "validation"},
                "test": {k: v for k, v in files.items() if k == "test"}}  # fmt: skip
    data_dir = Path(data_args.data_dir)
    train = read_pairs(data_dir / f"{data_args.module}.train.tsv.gz", data_args.max_train_samples)
    evaluation = {split: read_pairs(data_dir / f"{data_args.module}.{split}.tsv.gz", data_args.max_eval_samples)
                  for split in SPLITS}  # fmt: skip
    return {"train": train, "eval": evaluation, "test": {}}


def tokenize_sets(sets: dict, tokenizer, data_args: DataArguments) -> dict:
    """The sets as datasets: `train` one, `eval` and `test` {split: (dataset, answers)}."""
    return {
        "train": tokenize(*sets["train"], tokenizer, data_args) if sets["train"] else None,
        "eval": {k: (tokenize(q, a, tokenizer, data_args), a) for k, (q, a) in sets["eval"].items()},
        "test": {k: (tokenize(q, a, tokenizer, data_args), a) for k, (q, a) in sets["test"].items()},
    }


def main(argv: list[str] | None = None) -> dict:
    use_cpu_for_multi_process_launch()
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, Seq2SeqTrainingArguments))
    model_args, panm_args, data_args, training_args = parse_with_defaults(parser, TRAINING_DEFAULTS, argv)
    apply_default_steps(training_args, argv, ("do_train", "do_eval"))
    if data_args.smoke:
        apply_smoke(SMOKE_OVERRIDES, model_args, panm_args, data_args, training_args)
    if data_args.module not in MODULES:
        raise ValueError(f"--module must be one of {MODULES} (got {data_args.module!r}).")
    validate_model_args(model_args)
    check_run(data_args, training_args, model_args.model)
    if training_args.do_train and training_args.max_steps <= 0:
        raise ValueError("--max_steps must be set: the budget is a number of training steps (Csordas et al.: 50K).")
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not training_args.fp16:
        training_args.bf16 = True  # bf16 on GPU; CPU runs stay fp32
    set_seed(training_args.seed)

    sets = load_sets(data_args, training_args)
    available = {key for key in ("train", "eval", "test") if sets[key]}
    check_sets(training_args, available, {"do_train": "train", "do_eval": "eval", "do_predict": "test"})
    names = MODELS if model_args.model == "both" else (model_args.model,)
    sources = {name: model_source(name, data_args, training_args) for name in names}
    if sources[names[0]] is not None:
        tokenizer = load_tokenizer(sources[names[0]])
    else:
        tokenizer = char_tokenizer(sets["train"][0] + sets["train"][1])
    data = tokenize_sets(sets, tokenizer, data_args)
    max_positions = max(data_args.max_source_length, data_args.max_target_length) + 2
    config = backbone_config(model_args, tokenizer, max_positions) if None in sources.values() else None
    results = {
        name: run_one(name, model_args, panm_args, data_args, training_args, tokenizer, sources[name] or config, data)
        for name in names
    }
    summary = {
        "module": data_args.module, "max_steps": training_args.max_steps,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "learning_rate": training_args.learning_rate, "seed": training_args.seed,
        "num_train": len(data["train"]) if data["train"] else 0,
        "num_eval": {split: len(answers) for split, (_, answers) in {**data["eval"], **data["test"]}.items()},
        "model_args": {**asdict(model_args), **asdict(panm_args)}, "data_args": asdict(data_args),
        "device": "cuda" if torch.cuda.is_available() else "cpu", "results": results,
    }  # fmt: skip
    write_results(training_args, summary)
    if training_args.process_index == 0:
        for name, result in results.items():
            scores = ", ".join(f"{key} {value:.1f}%" for key, value in result.items() if key.endswith("_accuracy"))
            print(f"{name}: {scores} exact match")
    return summary


if __name__ == "__main__":
    main()
