#!/usr/bin/env python
"""Fine-tune BERT and BERT+PANM for extractive QA (SQuAD v1.1), on the paper's length split or your data.

In the style of transformers' ``run_qa.py``: ``HfArgumentParser`` dataclasses, windows
of ``max_seq_length`` tokens with ``doc_stride`` overlap and offset mappings, n-best
post-processing to answer text, official SQuAD v1.1 EM/F1 (``squad_metric.py`` beside this
script), ``--do_train`` / ``--do_eval`` / ``--do_predict``, resuming from the last checkpoint
in ``output_dir``, ``*_results.json`` and a model card per model.

Data, one source:

* ``--data_file``: a SQuAD JSON(.gz) pooled for the paper's length split (Sec. 4.3): sort the
  questions by context length, train on the shorter ``train_fraction``, evaluate on the rest.
  Only the official dev file is available offline (10,570 questions).
* ``--train_file`` / ``--validation_file`` / ``--test_file``: json, jsonl or csv files of
  SQuAD-style records (``utils_qa.load_qa_file``), used as given: train on the first,
  evaluate on the second, predict on the third.
* ``--dataset_name`` (with ``--dataset_config_name``): a dataset with SQuAD's columns
  (``rajpurkar/squad``, or a local folder of such files); its train/validation/test splits
  are used as given.

``--length_split True`` pools the training and validation questions of any source and splits
them by length instead (``--dataset_name rajpurkar/squad --length_split True`` is the paper's
pool of SQuAD train+validation).

``--model both`` trains the plain QA model (``AutoModelForQuestionAnswering``) and the
PANM model (``BertWithPanmForQuestionAnswering``, wrapping an identically initialised
copy of that model, so both start from the same logits) with identical settings, each in
``output_dir/{bert,panm}``, and writes one JSON with both results.

Example (from the repository root)::

    python examples/question_answering/run_qa.py --model both \
        --model_name_or_path bert-base-uncased --data_file ../shared/data/squad/dev-v1.1.json.gz \
        --train_fraction 0.8 --do_train --do_eval --output_dir /tmp/qa --report_to none
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from dataclasses import dataclass, field

import datasets
import torch
import transformers
from huggingface_hub.utils import httpx
from trainer_qa import QuestionAnsweringTrainer
from transformers import (
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    PreTrainedModel,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from utils_qa import (
    length_split,
    load_qa_file,
    load_squad_examples,
    prepare_train_features,
    prepare_validation_features,
)

from panm_hf.memory_config import PanmMemoryConfig
from panm_hf.modeling_panm_qa import BertWithPanmForQuestionAnswering
from panm_hf.pipelines.script_conventions import (
    checkpoint_to_resume,
    gather_from_ranks,
    use_cpu_for_multi_process_launch,
)

logger = logging.getLogger(__name__)
MODEL_CHOICES = ("bert", "panm", "both")
QUESTION_COLUMNS = ("id", "context", "question", "answers")
# TrainingArguments flag -> (the split it needs, the file flag that gives it)
SPLIT_FOR_FLAG = {"do_train": ("train", "train_file"), "do_eval": ("validation", "validation_file"),
                  "do_predict": ("test", "test_file")}  # fmt: skip


@dataclass
class ModelArguments:
    """Which models to train and from which checkpoint; PANM's hyperparameters are `PanmMemoryConfig`'s flags."""

    model_name_or_path: str = field(
        metadata={"help": "Encoder or QA checkpoint (folder or Hub id), e.g. bert-base-uncased (the default backbone)."}
    )
    model: str = field(
        default="both",
        metadata={"help": "bert: the plain QA model; panm: BERT+PANM; both: train and compare the two.",
                  "choices": list(MODEL_CHOICES)},
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder if not the model's."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train from the start even if output_dir holds checkpoints (default: resume from the last)."},
    )


@dataclass
class DataArguments:
    """Where the questions come from, how they are split and windowed."""

    data_file: str | None = field(
        default=None, metadata={"help": "SQuAD v1.1 JSON(.gz) pooled for the length split, e.g. "
                                        "../shared/data/squad/dev-v1.1.json.gz."}
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "A dataset with SQuAD's columns (rajpurkar/squad, or a local folder)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training questions (json, jsonl or csv)."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Evaluation questions with gold answers (json, jsonl or csv)."}
    )
    test_file: str | None = field(
        default=None, metadata={"help": "Questions to answer with --do_predict (json, jsonl or csv; answers optional)."}
    )
    length_split: bool | None = field(
        default=None,
        metadata={"help": "Pool the training and validation questions and split them by context length (the "
                          "paper's split). Default: True for --data_file, False otherwise."},
    )
    train_fraction: float = field(
        default=0.8, metadata={"help": "Length split: train on this shortest-context share (paper: 0.8 or 0.5)."}
    )
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per window, question included."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap between windows of one context."})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "Pad windows to max_seq_length (False: pad per batch, faster on CPU)."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Random subset of this many training windows (CPU budgets)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Random subset of this many evaluation questions (all their windows kept)."}
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Random subset of this many test questions (all their windows kept)."}
    )
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates per window in post-processing."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer in tokens."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    results_file: str | None = field(
        default=None, metadata={"help": "Where to write the JSON results (default: output_dir/qa_results.json)."}
    )

    def __post_init__(self):
        sources = [self.data_file is not None, self.dataset_name is not None, bool(self.given_files())]
        if sum(sources) != 1:
            raise ValueError(
                "Give one data source: --data_file (a SQuAD JSON pooled for the length split), --dataset_name "
                "(e.g. rajpurkar/squad), or --train_file/--validation_file/--test_file (json, jsonl or csv)."
            )
        if self.length_split is None:
            self.length_split = self.data_file is not None
        if self.data_file is not None and not self.length_split:
            raise ValueError(
                "--data_file is a pool for the length split; to use a file as given, pass it as "
                "--train_file/--validation_file/--test_file instead of --length_split False."
            )
        if self.length_split and self.given_files() and not {"train", "validation"} & set(self.given_files()):
            raise ValueError("--length_split True pools --train_file and --validation_file; give one of them.")
        if self.doc_stride >= self.max_seq_length:
            raise ValueError(f"doc_stride ({self.doc_stride}) must be smaller than max_seq_length "
                             f"({self.max_seq_length}).")

    def given_files(self) -> dict[str, str]:
        """Split name -> the file given for it (`train`, `validation`, `test`)."""
        files = {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}
        return {split: path for split, path in files.items() if path is not None}


@dataclass
class QASplits:
    """The questions and windows a run uses; None where the run does not use the split."""

    train: datasets.Dataset | None = None
    eval: datasets.Dataset | None = None
    eval_examples: list[dict] | None = None
    test: datasets.Dataset | None = None
    test_examples: list[dict] | None = None
    summary: dict = field(default_factory=dict)


def check_run(model_args: ModelArguments, training_args: TrainingArguments) -> None:
    """ValueError for a run that asks for nothing, or one checkpoint path for two models."""
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("Nothing to do: pass --do_train, --do_eval and/or --do_predict.")
    if model_args.model == "both" and training_args.resume_from_checkpoint is not None:
        raise ValueError(
            "--resume_from_checkpoint names one checkpoint but --model both trains two; choose --model bert or "
            "panm, or leave the flag out: each model resumes from the last checkpoint in output_dir/<model>."
        )


def load_dataset_splits(name: str, config_name: str | None) -> dict[str, list[dict]]:
    """The train/validation/test splits of a dataset with SQuAD's columns, as question records."""
    loaded = datasets.load_dataset(name, config_name)
    splits = {}
    for split in ("train", "validation", "test"):
        if split not in loaded:
            continue
        missing = [column for column in QUESTION_COLUMNS if column not in loaded[split].column_names]
        if missing:
            raise ValueError(
                f"dataset_name {name!r}: split {split!r} has no column(s) {missing}; run_qa needs SQuAD's columns "
                f"{list(QUESTION_COLUMNS)} (answers as {{'text': [...], 'answer_start': [...]}})."
            )
        splits[split] = loaded[split].to_list()
    return splits


def load_questions(data_args: DataArguments) -> dict[str, list[dict]]:
    """Question records per split (`train`, `validation`, `test`), after the length split if asked."""
    if data_args.data_file is not None:
        given = {"pool": load_squad_examples(data_args.data_file)}
    elif data_args.dataset_name is not None:
        given = load_dataset_splits(data_args.dataset_name, data_args.dataset_config_name)
    else:
        given = {split: load_qa_file(path, f"{split}_file", need_answers=split != "test")
                 for split, path in data_args.given_files().items()}  # fmt: skip
    if not data_args.length_split:
        return given
    pool = [example for split in ("pool", "train", "validation") for example in given.get(split, [])]
    train, test = length_split(pool, data_args.train_fraction)
    return {"train": train, "validation": test, **({"test": given["test"]} if "test" in given else {})}


def check_splits(questions: dict[str, list[dict]], training_args: TrainingArguments) -> None:
    """ValueError naming the flag when a requested step has no questions to work on."""
    for flag, (split, file_flag) in SPLIT_FOR_FLAG.items():
        if getattr(training_args, flag) and not questions.get(split):
            why = " (given, or turned on by an eval_strategy other than 'no')" if flag == "do_eval" else ""
            raise ValueError(
                f"--{flag}{why} needs {split} questions: pass --{file_flag}, a --dataset_name with a {split!r} "
                "split" + (", or --data_file for the length split." if split != "test" else ".")
            )


def sample_questions(examples: list[dict], limit: int | None, seed: int) -> list[dict]:
    if limit is None or limit >= len(examples):
        return examples
    return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), limit))]


def windows(examples: list[dict], prepare, tokenizer, data_args: DataArguments, desc: str) -> datasets.Dataset:
    """`max_seq_length` windows of the questions (`prepare_train_features` or `prepare_validation_features`)."""
    window_kwargs = {"tokenizer": tokenizer, "max_seq_length": data_args.max_seq_length,
                     "doc_stride": data_args.doc_stride, "pad_to_max_length": data_args.pad_to_max_length}
    return datasets.Dataset.from_list(examples).map(
        prepare, batched=True, remove_columns=list(examples[0]), fn_kwargs=window_kwargs,
        num_proc=data_args.preprocessing_num_workers, desc=desc,
    )


def window_splits(questions, tokenizer, data_args: DataArguments, training_args: TrainingArguments) -> QASplits:
    """Window the splits this run uses; `summary` records their sizes (and the length split's boundary)."""
    seed, result, summary = training_args.seed, QASplits(), {}
    if training_args.do_train:
        result.train = windows(questions["train"], prepare_train_features, tokenizer, data_args, "Training windows")
        summary.update(train_questions=len(questions["train"]), train_windows=len(result.train))
        if data_args.max_train_samples is not None and data_args.max_train_samples < len(result.train):
            result.train = result.train.shuffle(seed=seed).select(range(data_args.max_train_samples))
        summary["train_windows_used"] = len(result.train)
    if training_args.do_eval:
        result.eval_examples = sample_questions(questions["validation"], data_args.max_eval_samples, seed)
        result.eval = windows(result.eval_examples, prepare_validation_features, tokenizer, data_args,
                              "Evaluation windows")  # fmt: skip
        summary.update(eval_questions=len(result.eval_examples), eval_windows=len(result.eval))
    if training_args.do_predict:
        result.test_examples = sample_questions(questions["test"], data_args.max_predict_samples, seed)
        result.test = windows(result.test_examples, prepare_validation_features, tokenizer, data_args, "Test windows")
        summary.update(predict_questions=len(result.test_examples), predict_windows=len(result.test))
    if data_args.length_split:
        words = [[len(example["context"].split()) for example in questions[split]] for split in ("train", "validation")]
        summary.update(train_fraction=data_args.train_fraction, max_train_context_words=max(words[0]),
                       min_eval_context_words=min(words[1]))  # fmt: skip
    result.summary = summary
    return result


def build_model(name: str, model_args: ModelArguments, panm_args: PanmMemoryConfig) -> PreTrainedModel:
    """The plain QA model, or PANM wrapped around an identically initialised one (call after `set_seed`).

    A saved PANM model (`BertWithPanmForQuestionAnswering`) is used as it is for `panm`.
    """
    qa_model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path)
    is_panm = isinstance(qa_model, BertWithPanmForQuestionAnswering)
    if name == "bert" and is_panm:
        raise ValueError(
            f"--model_name_or_path {model_args.model_name_or_path!r} is a PANM model; evaluate or train it with "
            "--model panm (the plain model would drop its PANM weights)."
        )
    if name == "bert" or is_panm:
        return qa_model
    return BertWithPanmForQuestionAnswering.from_backbone(qa_model, **dataclasses.asdict(panm_args))


def parameter_checksum(model: torch.nn.Module) -> float:
    """The sum of all parameters: equal on every DDP rank iff the ranks stay in sync."""
    return sum(float(p.detach().double().sum()) for p in model.parameters())


def gather_checksums(model: torch.nn.Module) -> list[float]:
    """Every rank's `parameter_checksum`, in rank order (a collective: call it on all ranks)."""
    return gather_from_ranks(parameter_checksum(model))


def write_json(trainer: QuestionAnsweringTrainer, name: str, content) -> None:
    """Write `content` to output_dir/`name` from the main process."""
    if trainer.is_world_process_zero():
        os.makedirs(trainer.args.output_dir, exist_ok=True)
        with open(os.path.join(trainer.args.output_dir, name), "w", encoding="utf-8") as handle:
            json.dump(content, handle, indent=1)


def write_model_card(trainer: QuestionAnsweringTrainer, model_args: ModelArguments, data_args: DataArguments) -> None:
    """`trainer.create_model_card`, offline: a local checkpoint is named by its absolute path, which is no valid
    Hub id, so the card's Hub lookup (of the base model's license) stops before the network."""
    path = model_args.model_name_or_path
    train_data = data_args.dataset_name or data_args.data_file or data_args.train_file or data_args.validation_file
    card = {"tasks": "question-answering", "finetuned_from": os.path.abspath(path) if os.path.isdir(path) else path,
            "dataset": os.path.basename(train_data.rstrip("/"))}  # fmt: skip
    if data_args.dataset_name is not None and not os.path.isdir(data_args.dataset_name):
        card.update(dataset_tags=data_args.dataset_name, dataset=data_args.dataset_name,
                    dataset_args=data_args.dataset_config_name)  # fmt: skip
    try:
        trainer.create_model_card(**card)
    except (OSError, httpx.HTTPError) as error:  # a Hub id's lookup without network
        logger.warning("No model card written (%s).", error)


def train(trainer: QuestionAnsweringTrainer, checkpoint: str | None, num_windows: int) -> dict:
    output = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()  # with the tokenizer (processing_class)
    metrics = {**output.metrics, "train_samples": num_windows}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return {"train_runtime_s": round(metrics["train_runtime"], 1), "train_loss": output.training_loss,
            "train_steps": output.global_step, "resumed_from": checkpoint}  # fmt: skip


def evaluate(trainer: QuestionAnsweringTrainer) -> dict:
    metrics = {**trainer.evaluate(), "eval_samples": len(trainer.eval_dataset)}
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    write_json(trainer, "predictions.json", trainer.last_predictions)
    return {"exact_match": metrics["eval_exact_match"], "f1": metrics["eval_f1"],
            "eval_runtime_s": round(metrics["eval_runtime"], 1)}  # fmt: skip


def predict(trainer: QuestionAnsweringTrainer, data: QASplits) -> dict:
    metrics = {**trainer.predict(data.test, data.test_examples).metrics, "predict_samples": len(data.test)}
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    write_json(trainer, "test_predictions.json", trainer.last_predictions)
    return {key: metrics[f"test_{key}"] for key in ("exact_match", "f1") if f"test_{key}" in metrics}


def run_model(name: str, model_args, panm_args, data_args, training_args, data: QASplits, tokenizer) -> tuple:
    """Train, evaluate and predict with one model in output_dir/`name`; returns (its results, its trainer)."""
    set_seed(training_args.seed)
    model = build_model(name, model_args, panm_args)
    args = dataclasses.replace(training_args, output_dir=os.path.join(training_args.output_dir, name))
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    trainer = QuestionAnsweringTrainer(
        model=model, args=args, train_dataset=data.train, eval_dataset=data.eval, eval_examples=data.eval_examples,
        data_collator=collator, processing_class=tokenizer, n_best_size=data_args.n_best_size,
        max_answer_length=data_args.max_answer_length,
    )
    entry = {"class": type(model).__name__, "num_parameters": model.num_parameters()}
    if args.do_train:
        entry.update(train(trainer, checkpoint_to_resume(args, model_args), len(data.train)))
        write_model_card(trainer, model_args, data_args)
    if args.do_eval:
        entry.update(evaluate(trainer))
    if args.do_predict:
        entry.update({f"test_{key}": value for key, value in predict(trainer, data).items()})
    checksums = gather_checksums(trainer.model)
    entry.update(rank_checksums=checksums, ranks_in_sync=all(c == checksums[0] for c in checksums))
    logger.info("%s: %s", name, entry)
    return entry, trainer


def settings(model_args, panm_args, data_args, training_args) -> dict:
    source = data_args.data_file or data_args.dataset_name or data_args.given_files()
    return {"model_name_or_path": model_args.model_name_or_path, "data": source,
            "length_split": data_args.length_split, "max_seq_length": data_args.max_seq_length,
            "doc_stride": data_args.doc_stride, "learning_rate": training_args.learning_rate,
            "num_train_epochs": training_args.num_train_epochs, "max_steps": training_args.max_steps,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "world_size": training_args.world_size, "seed": training_args.seed,
            "panm": dataclasses.asdict(panm_args)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments (from `argv` or the command line), train/evaluate/predict, return and write the results."""
    use_cpu_for_multi_process_launch()
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, TrainingArguments))
    model_args, panm_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for quiet in (logger, logging.getLogger(checkpoint_to_resume.__module__)):  # replicas stay quiet
        quiet.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    check_run(model_args, training_args)

    with training_args.main_process_first(desc="loading the questions"):
        questions = load_questions(data_args)
    check_splits(questions, training_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    data = window_splits(questions, tokenizer, data_args, training_args)
    logger.info("data: %s", data.summary)

    results = {"split": data.summary, "settings": settings(model_args, panm_args, data_args, training_args),
               "models": {}}  # fmt: skip
    names = ("bert", "panm") if model_args.model == "both" else (model_args.model,)
    for name in names:
        results["models"][name], trainer = run_model(
            name, model_args, panm_args, data_args, training_args, data, tokenizer
        )
    if trainer.is_world_process_zero():
        results_file = data_args.results_file or os.path.join(training_args.output_dir, "qa_results.json")
        os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
        with open(results_file, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
        logger.info("results written to %s", results_file)
    return results


if __name__ == "__main__":
    main()
