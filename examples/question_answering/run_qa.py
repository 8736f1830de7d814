#!/usr/bin/env python
"""Fine-tune BERT and BERT+PANM on SQuAD v1.1 with the paper's length split.

In the style of transformers' ``run_qa.py``: ``HfArgumentParser`` dataclasses, windows
of ``max_seq_length`` tokens with ``doc_stride`` overlap and offset mappings, n-best
post-processing to answer text, official SQuAD v1.1 EM/F1 (``squad_metric.py`` beside this script).

The paper's split (Sec. 4.3): pool the questions, sort them by context length, train on
the shorter ``train_fraction`` and test on the rest (0.8/0.2 and 0.5/0.5). Only the
official dev file is available offline, so the pool here is the 10,570 dev questions
(``--data_file``); with network access ``--dataset_name squad`` pools train+validation
from the Hub as the paper does.

``--model both`` trains the plain QA model (``AutoModelForQuestionAnswering``) and the
PANM model (``BertWithPanmForQuestionAnswering``, wrapping an identically initialised
copy of that model, so both start from the same logits) with identical settings, and
writes one JSON with both results.

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
import sys
import time
from dataclasses import dataclass, field

import datasets
import transformers
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trainer_qa import QuestionAnsweringTrainer  # noqa: E402
from utils_qa import (  # noqa: E402
    length_split,
    load_squad_examples,
    prepare_train_features,
    prepare_validation_features,
)

from panm_hf.memory_config import PanmMemoryConfig  # noqa: E402
from panm_hf.modeling_panm_qa import BertWithPanmForQuestionAnswering  # noqa: E402

logger = logging.getLogger(__name__)
MODEL_CHOICES = ("bert", "panm", "both")


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


@dataclass
class DataArguments:
    """Where the questions come from, how they are split and windowed."""

    data_file: str | None = field(
        default=None, metadata={"help": "SQuAD v1.1 JSON(.gz), e.g. ../shared/data/squad/dev-v1.1.json.gz."}
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "'squad' to pool the Hub's train+validation splits (needs network)."}
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
        default=None, metadata={"help": "Random subset of this many test questions (all their windows are kept)."}
    )
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates per window in post-processing."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer in tokens."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    results_file: str | None = field(
        default=None, metadata={"help": "Where to write the JSON results (default: output_dir/qa_results.json)."}
    )

    def __post_init__(self):
        if (self.data_file is None) == (self.dataset_name is None):
            raise ValueError("Give exactly one of --data_file (a SQuAD JSON file) and --dataset_name squad.")
        if self.dataset_name is not None and self.dataset_name != "squad":
            raise ValueError(f"dataset_name={self.dataset_name!r} is not supported; use 'squad' or --data_file.")
        if self.doc_stride >= self.max_seq_length:
            raise ValueError(f"doc_stride ({self.doc_stride}) must be smaller than max_seq_length "
                             f"({self.max_seq_length}).")


def load_question_pool(data_args: DataArguments) -> list[dict]:
    """All questions the length split is drawn from."""
    if data_args.data_file is not None:
        return load_squad_examples(data_args.data_file)
    hub = datasets.load_dataset("squad")
    return [dict(row) for split in ("train", "validation") for row in hub[split]]


def build_model(name: str, model_args: ModelArguments, panm_args: PanmMemoryConfig) -> PreTrainedModel:
    """The plain QA model, or PANM wrapped around an identically initialised one (call after `set_seed`)."""
    qa_model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path)
    if name == "bert":
        return qa_model
    return BertWithPanmForQuestionAnswering.from_backbone(qa_model, **dataclasses.asdict(panm_args))


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments (from `argv` or the command line), train/evaluate, return and write the results."""
    parser = HfArgumentParser((ModelArguments, PanmMemoryConfig, DataArguments, TrainingArguments))
    model_args, panm_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()

    pool = load_question_pool(data_args)
    train_examples, test_examples = length_split(pool, data_args.train_fraction)
    if data_args.max_eval_samples is not None and data_args.max_eval_samples < len(test_examples):
        chosen = sorted(random.Random(training_args.seed).sample(range(len(test_examples)), data_args.max_eval_samples))
        test_examples = [test_examples[i] for i in chosen]
    context_words = [len(ex["context"].split()) for ex in train_examples], [len(ex["context"].split())
                                                                           for ex in test_examples]
    logger.info("length split %.2f: %d training questions (context <= %d words), %d test questions (>= %d words)",
                data_args.train_fraction, len(train_examples), max(context_words[0]), len(test_examples),
                min(context_words[1]))

    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    window_kwargs = {"tokenizer": tokenizer, "max_seq_length": data_args.max_seq_length,
                     "doc_stride": data_args.doc_stride, "pad_to_max_length": data_args.pad_to_max_length}
    columns = list(train_examples[0].keys())
    train_dataset = datasets.Dataset.from_list(train_examples).map(
        prepare_train_features, batched=True, remove_columns=columns, fn_kwargs=window_kwargs,
        num_proc=data_args.preprocessing_num_workers, desc="Windowing training questions",
    )
    num_train_windows = len(train_dataset)
    if data_args.max_train_samples is not None and data_args.max_train_samples < num_train_windows:
        train_dataset = train_dataset.shuffle(seed=training_args.seed).select(range(data_args.max_train_samples))
    eval_dataset = datasets.Dataset.from_list(test_examples).map(
        prepare_validation_features, batched=True, remove_columns=columns, fn_kwargs=window_kwargs,
        num_proc=data_args.preprocessing_num_workers, desc="Windowing test questions",
    )
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)

    names = ("bert", "panm") if model_args.model == "both" else (model_args.model,)
    results = {
        "split": {"train_fraction": data_args.train_fraction, "pool": data_args.data_file or "squad train+validation",
                  "train_questions": len(train_examples), "train_windows": num_train_windows,
                  "train_windows_used": len(train_dataset), "test_questions": len(test_examples),
                  "test_windows": len(eval_dataset), "max_train_context_words": max(context_words[0]),
                  "min_test_context_words": min(context_words[1])},
        "settings": {"model_name_or_path": model_args.model_name_or_path,
                     "max_seq_length": data_args.max_seq_length, "doc_stride": data_args.doc_stride,
                     "learning_rate": training_args.learning_rate, "num_train_epochs": training_args.num_train_epochs,
                     "max_steps": training_args.max_steps,
                     "per_device_train_batch_size": training_args.per_device_train_batch_size,
                     "seed": training_args.seed, "panm": dataclasses.asdict(panm_args)},
        "models": {},
    }
    for name in names:
        set_seed(training_args.seed)
        model = build_model(name, model_args, panm_args)
        args = dataclasses.replace(training_args, output_dir=os.path.join(training_args.output_dir, name))
        trainer = QuestionAnsweringTrainer(
            model=model, args=args, train_dataset=train_dataset if args.do_train else None,
            eval_dataset=eval_dataset, eval_examples=test_examples, data_collator=collator,
            processing_class=tokenizer, n_best_size=data_args.n_best_size,
            max_answer_length=data_args.max_answer_length,
        )
        entry = {"class": type(model).__name__, "num_parameters": model.num_parameters()}
        if args.do_train:
            start = time.time()
            train_output = trainer.train()
            entry.update(train_runtime_s=round(time.time() - start, 1), train_loss=train_output.training_loss,
                         train_steps=train_output.global_step)
            trainer.save_model()
        if args.do_eval:
            metrics = trainer.evaluate()
            entry.update(exact_match=metrics["eval_exact_match"], f1=metrics["eval_f1"],
                         eval_runtime_s=round(metrics["eval_runtime"], 1))
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, "predictions.json"), "w", encoding="utf-8") as handle:
                json.dump(trainer.last_predictions, handle, indent=1)
        results["models"][name] = entry
        logger.info("%s: %s", name, entry)

    results_file = data_args.results_file or os.path.join(training_args.output_dir, "qa_results.json")
    os.makedirs(os.path.dirname(os.path.abspath(results_file)), exist_ok=True)
    with open(results_file, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    logger.info("results written to %s", results_file)
    return results


if __name__ == "__main__":
    main()
