#!/usr/bin/env python
"""bAbI QA with a length split: Transformer vs Transformer + PANM (paper, Sec. 3.3 and Table 4).

The paper's protocol (appendix "Other NLP Tasks"): for each of the 20 tasks, pool the task's
questions, sort them by length (story + question) and split the sorted list so the test questions
are the longest (0.8/0.2 and 0.5/0.5); train one model jointly on all tasks; an answer counts only
if it matches the reference exactly. The paper's models: a Transformer with 3 encoder and
3 decoder layers, d_model 512, 8 heads; PANM on the same backbone with 2 decoder layers plus the
Controller; 100 epochs. It reports test accuracy (Transformer 0.79 / 0.76, PANM 0.85 / 0.81).

Each question becomes one seq2seq pair: the story so far (statements only, lower-cased, "." and "?"
as words) then the question; the target is the answer (list answers such as `s,e` as `s , e`).
Besides overall accuracy the script reports the standard bAbI figures per task: accuracy, mean
error and the number of failed tasks (error > 5%).

The model flags are the seq2seq examples' (`panm_hf.pipelines.seq2seq`, shared with translation and
math): `--backbone`, `--num_layers`, `--d_model`, `--placement`, and every `PanmMemoryConfig` field.

    python examples/babi/run_babi.py --data_dir ../shared/data/babi --output_dir runs/babi \
        --model both --max_steps 2000 --report_to none
    python examples/babi/run_babi.py --data_dir ../shared/data/babi --output_dir /tmp/babi_smoke \
        --model both --smoke --report_to none   # seconds
"""

from __future__ import annotations

import gzip
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
    set_seed,
)

from panm_hf import PanmMemoryConfig, splits
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
    RECOMMENDED_PANM_FLAGS,
    apply_smoke,
    backbone_config,
    build_model,
    model_trainer,
    validate_model_args,
)

TASKS = tuple(range(1, 21))
SUBSETS = ("en", "en-10k")
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
FAILED_ERROR = 5.0  # the bAbI convention: a task with more than 5% error is failed


@dataclass
class ModelArguments(seq2seq.ModelArguments):
    """The seq2seq examples' model flags with the paper's bAbI backbone as defaults (3 + 3 layers,
    d_model 512, 8 heads)."""

    num_layers: int = field(default=3, metadata={"help": "Encoder and decoder layers (paper: 3 + 3)."})
    d_model: int = field(default=512, metadata={"help": "Transformer hidden size (paper: 512)."})
    ffn_dim: int = field(default=1024, metadata={"help": "Transformer feed-forward size."})
    attention_heads: int = field(default=8, metadata={"help": "Attention heads (paper: 8)."})
    vocab_size: int = field(default=0, metadata={"help": "Unused: the vocabulary is the training split's words."})


@dataclass
class DataArguments(ScriptArguments):
    """Which tasks, which copy of the data and how they are split; or --train_file/--validation_file/--test_file
    used as given (columns "story" (a string or a list of statements) + "question" and "answer", or "source"
    and "target", unless --source_column/--target_column)."""

    data_dir: str = field(default="../shared/data/babi", metadata={"help": "Folder holding en/ and en-10k/."})
    subset: str = field(default="en", metadata={"help": f"One of {SUBSETS} (1,000 or 10,000 training questions)."})
    tasks: str = field(default="all", metadata={"help": "Comma-separated task numbers (1..20) or 'all'."})
    split_ratio: float = field(
        default=0.8, metadata={"help": "Train on this shortest fraction per task (paper: 0.8, 0.5)."}
    )
    max_source_length: int = field(default=512, metadata={"help": "Longer inputs keep their last tokens."})
    max_target_length: int = field(default=8)
    max_test_per_task: int | None = field(
        default=None, metadata={"help": "Score N test questions per task, evenly spread over their lengths."}
    )
    smoke: bool = field(default=False, metadata={"help": "Tiny slice and tiny models: a CI run in seconds."})


SMOKE_OVERRIDES = {
    "model": {"d_model": 32, "ffn_dim": 64, "attention_heads": 2, "num_layers": 2},
    "panm": {"pointer_hidden_size": 16, "controller_hidden_size": 16, "mlp_hidden_size": 16},
    "data": {"tasks": "1,2", "max_test_per_task": 8, "max_source_length": 96},
    "training": {"max_steps": 6, "per_device_train_batch_size": 16, "per_device_eval_batch_size": 16,
                 "learning_rate": 3e-3, "warmup_steps": 0},
}  # fmt: skip


@dataclass
class BabiQuestion:
    """One question with the story before it.

    Attributes:
        task: the task number, 1..20.
        story: the statements of the story before the question, in order (question lines excluded).
        question: the question text.
        answer: the answer as written in the file (list answers joined by commas).
    """

    task: int
    story: list[str]
    question: str
    answer: str

    @property
    def source(self) -> str:
        return normalise(" ".join(self.story) + " " + self.question)

    @property
    def target(self) -> str:
        return normalise(self.answer.replace(",", " , "))


def normalise(text: str) -> str:
    """Lower-case; '.', '?' and ',' become words of their own; single spaces."""
    return " ".join(re.sub(r"([.?,])", r" \1 ", text.lower()).split())


def read_babi_file(path: Path, task: int) -> list[BabiQuestion]:
    """The questions of one gzipped bAbI file; ValueError naming the file and line when it is damaged."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist; --data_dir must hold en/ and en-10k/ (see shared/data/README.md).")
    questions, story = [], []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip("\n")
                index, _, text = line.partition(" ")
                if not index.isdigit() or not text:
                    raise ValueError(f"{path}, line {number}: expected 'ID text', got {line!r}.")
                if index == "1":
                    story = []  # IDs restart at 1: a new story
                if "\t" in text:
                    fields = text.split("\t")
                    if len(fields) != 3 or not fields[1]:
                        raise ValueError(
                            f"{path}, line {number}: a question line needs 'question<TAB>answer<TAB>ids', got {line!r}."
                        )
                    questions.append(BabiQuestion(task, list(story), fields[0].strip(), fields[1].strip()))
                else:
                    story.append(text.strip())
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is not a readable gzipped UTF-8 file ({error}); restore it from shared/data."
        ) from error
    if not questions:
        raise ValueError(f"{path} holds no questions.")
    return questions


def task_files(data_dir: Path, subset: str, task: int) -> tuple[Path, Path]:
    """(train, test) files of one task; ValueError naming the fix when the folder or a file is missing."""
    if subset not in SUBSETS:
        raise ValueError(f"--subset must be one of {SUBSETS} (got {subset!r}).")
    folder = data_dir / subset
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; --data_dir must be shared/data/babi (holding {SUBSETS}).")
    found = {}
    for split in ("train", "test"):
        matches = sorted(folder.glob(f"qa{task}_*_{split}.txt.gz"))
        if len(matches) != 1:
            hint = " (en-10k lacks qa3's training file: use --subset en)" if subset == "en-10k" and task == 3 else ""
            raise ValueError(f"expected one qa{task}_*_{split}.txt.gz in {folder}, found {len(matches)}{hint}.")
        found[split] = matches[0]
    return found["train"], found["test"]


def load_task(data_dir: Path, subset: str, task: int) -> list[BabiQuestion]:
    """All questions of one task, the training file then the test file (the paper pools them)."""
    train, test = task_files(data_dir, subset, task)
    return read_babi_file(train, task) + read_babi_file(test, task)


def length_split(questions: list[BabiQuestion], ratio: float) -> tuple[list[BabiQuestion], list[BabiQuestion]]:
    """The paper's split (`panm_hf.splits.length_split`): sort by length in words (story + question; stable,
    so ties keep file order) and cut at `ratio`."""
    return splits.length_split(questions, ratio, sort_key=lambda q: len(q.source.split()))


def parse_tasks(text: str) -> list[int]:
    if text == "all":
        return list(TASKS)
    try:
        tasks = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ValueError(f"--tasks must be 'all' or comma-separated numbers in 1..20 (got {text!r}).") from None
    if not tasks or any(t not in TASKS for t in tasks):
        raise ValueError(f"--tasks must be 'all' or comma-separated numbers in 1..20 (got {text!r}).")
    return tasks


def word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the words of `texts` (already normalised); sequences end with `</s>`.

    Inputs longer than the limit keep their **last** tokens (the question is at the end)."""
    words = sorted({word for text in texts for word in text.split()})
    vocab = {token: index for index, token in enumerate([PAD, UNK, BOS, EOS, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS,
        truncation_side="left",
    )  # fmt: skip


def tokenize(questions: list[BabiQuestion], tokenizer, data_args: DataArguments) -> Dataset:
    encoded = tokenizer([q.source for q in questions], max_length=data_args.max_source_length, truncation=True)
    tokenizer.truncation_side = "right"  # targets keep their start
    labels = tokenizer([q.target for q in questions], max_length=data_args.max_target_length, truncation=True)
    tokenizer.truncation_side = "left"
    return Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels["input_ids"]}
    )


def babi_scores(predictions: list[str], questions: list[BabiQuestion]) -> dict:
    """Exact-match accuracy overall (the paper's figure) and per task, mean error, failed tasks."""
    correct = np.array([p.strip() == q.target for p, q in zip(predictions, questions)])
    tasks = np.array([q.task for q in questions])
    per_task = {int(t): 100.0 * float(correct[tasks == t].mean()) for t in sorted(set(tasks.tolist()))}
    errors = [100.0 - a for a in per_task.values()]
    return {
        "accuracy": 100.0 * float(correct.mean()),
        "per_task_accuracy": per_task,
        "mean_error": float(np.mean(errors)),
        "failed_tasks": int(sum(e > FAILED_ERROR for e in errors)),
    }


def score_sets(trainer, sets: dict, prefix: str, tokenizer, max_length: int) -> dict:
    """Greedy answers scored as bAbI does (and teacher-forced loss) per set; `<prefix>_results.json` holds them."""
    trainer.args.predict_with_generate = True
    result, metrics = {}, {}
    for key, (dataset, questions) in sets.items():
        prediction = trainer.predict(dataset, max_length=max_length, num_beams=1, metric_key_prefix=f"{prefix}_{key}")
        token_ids = np.where(prediction.predictions >= 0, prediction.predictions, tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        scores = babi_scores(texts, questions)
        scores["examples"] = [{"source": q.source[-200:], "answer": q.target, "predicted": p.strip()}
                              for q, p in zip(questions[:3], texts[:3])]  # fmt: skip
        if prefix == "eval":  # the one evaluation set: the length split's test part, or --validation_file
            result.update(scores)
        else:
            result[key] = scores
        metrics.update(prediction.metrics, **{f"{prefix}_{key}_accuracy": scores["accuracy"],
                                              f"{prefix}_{key}_samples": len(questions)})  # fmt: skip
    trainer.args.predict_with_generate = False
    log_and_save(trainer, prefix, metrics)
    return result


def run_one(name, model_args, panm_args, data_args, training_args, tokenizer, config, data: dict) -> dict:
    """Train one model for the step budget, then answer the evaluation (and test) questions greedily."""
    set_seed(training_args.seed)  # both models start from the same random stream and see the same batches
    model = build_model(name, model_args, panm_args, config)
    model.generation_config.max_length = data_args.max_target_length
    model.generation_config.num_beams = 1
    # evaluation during training (--eval_strategy): loss on the evaluation set
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


def file_questions(data_args: DataArguments) -> dict[str, list[BabiQuestion]]:
    """The given files as questions (task 0): the source text as the story, the target as the answer."""
    pairs = load_file_pairs(data_args, ("story,question", "source"), ("answer", "target"))
    return {split: [BabiQuestion(0, [source], "", target) for source, target in zip(*pair)]
            for split, pair in pairs.items()}  # fmt: skip


def split_questions(data_args: DataArguments) -> tuple[list, list, dict]:
    """(train, test, split lengths per task): each task's length split, pooled over the tasks."""
    data_dir = Path(data_args.data_dir)
    if not data_dir.is_dir():
        raise ValueError(f"--data_dir {data_dir} is not a folder; point it at shared/data/babi.")
    train_questions, test_questions, split_lengths = [], [], {}
    for task in parse_tasks(data_args.tasks):
        train, test = length_split(load_task(data_dir, data_args.subset, task), data_args.split_ratio)
        if data_args.max_test_per_task is not None and len(test) > data_args.max_test_per_task:
            keep = np.linspace(0, len(test) - 1, data_args.max_test_per_task).round().astype(int)
            test = [test[i] for i in keep]  # evenly spread over the sorted lengths, longest included
        split_lengths[task] = {"train_max_words": len(train[-1].source.split()),
                               "test_min_words": len(test[0].source.split()),
                               "test_max_words": len(test[-1].source.split())}  # fmt: skip
        train_questions += train
        test_questions += test
    return train_questions, test_questions, split_lengths


def load_sets(data_args: DataArguments) -> dict:
    """Questions per set: the given files as they are, or the paper's length split (evaluated as "test")."""
    if data_args.given_files():
        files = file_questions(data_args)
        return {"train": files.get("train"), "eval": {k: v for k, v in files.items() if k == "validation"},
                "test": {k: v for k, v in files.items() if k == "test"}, "split_lengths": {}}  # fmt: skip
    train, test, split_lengths = split_questions(data_args)
    return {"train": train, "eval": {"test": test}, "test": {}, "split_lengths": split_lengths}


def main(argv: list[str] | None = None) -> dict:
    use_cpu_for_multi_process_launch()
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, Seq2SeqTrainingArguments))
    parser.set_defaults(**RECOMMENDED_PANM_FLAGS, **TRAINING_DEFAULTS)
    model_args, panm_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    apply_default_steps(training_args, argv, ("do_train", "do_eval"))
    if data_args.smoke:
        apply_smoke(SMOKE_OVERRIDES, model_args, panm_args, data_args, training_args)
    validate_model_args(model_args)
    if model_args.panm_design is not None:
        raise ValueError(
            "--panm_design is for the translation, math and SCAN examples; here PANM's defaults are "
            "--placement residual --content_read decoder --pointer_update shift: give the flags themselves."
        )
    check_run(data_args, training_args, model_args.model)
    if training_args.do_train and training_args.max_steps <= 0 and training_args.num_train_epochs <= 0:
        raise ValueError("Set --max_steps or --num_train_epochs (the paper: 100 epochs).")
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not training_args.fp16:
        training_args.bf16 = True  # bf16 on GPU; CPU runs stay fp32
    set_seed(training_args.seed)

    sets = load_sets(data_args)
    check_sets(training_args, {key for key in ("train", "eval", "test") if sets[key]},
               {"do_train": "train", "do_eval": "eval", "do_predict": "test"})  # fmt: skip
    names = MODELS if model_args.model == "both" else (model_args.model,)
    sources = {name: model_source(name, data_args, training_args) for name in names}
    if sources[names[0]] is not None:
        tokenizer = load_tokenizer(sources[names[0]])
        tokenizer.truncation_side = "left"  # long inputs keep their end, the question
    else:
        tokenizer = word_tokenizer([q.source for q in sets["train"]] + [q.target for q in sets["train"]])
    data = {"train": tokenize(sets["train"], tokenizer, data_args) if training_args.do_train else None,
            **{key: {name: (tokenize(questions, tokenizer, data_args), questions)
                     for name, questions in sets[key].items()} for key in ("eval", "test")}}  # fmt: skip
    max_positions = max(data_args.max_source_length, data_args.max_target_length) + 2
    config = backbone_config(model_args, tokenizer, max_positions) if None in sources.values() else None
    results = {
        name: run_one(name, model_args, panm_args, data_args, training_args, tokenizer, sources[name] or config, data)
        for name in names
    }
    summary = {
        "subset": data_args.subset, "tasks": parse_tasks(data_args.tasks), "split_ratio": data_args.split_ratio,
        "num_train": len(sets["train"] or []),
        "num_test": sum(len(questions) for questions in {**sets["eval"], **sets["test"]}.values()),
        "split_lengths": sets["split_lengths"], "max_steps": training_args.max_steps,
        "num_train_epochs": training_args.num_train_epochs,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "learning_rate": training_args.learning_rate, "seed": training_args.seed,
        "model_args": {**asdict(model_args), **asdict(panm_args)}, "data_args": asdict(data_args),
        "device": "cuda" if torch.cuda.is_available() else "cpu", "results": results,
    }  # fmt: skip
    write_results(training_args, summary)
    if training_args.process_index == 0:
        for name, result in results.items():
            if "accuracy" in result:
                print(f"{name}: accuracy {result['accuracy']:.1f}%, mean error {result['mean_error']:.1f}%, "
                      f"failed tasks {result['failed_tasks']}/{len(result['per_task_accuracy'])}")  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
