"""What the Trainer example scripts (translation, math, bAbI, SCAN; QA in part) share as transformers' examples.

In the style of transformers' ``run_translation.py`` / ``run_qa.py``: ``--model_name_or_path`` (a pretrained
encoder-decoder checkpoint, wrapped with ``PanmForSeq2SeqLM.from_backbone`` for the PANM model, with its own
tokenizer), ``--train_file`` / ``--validation_file`` / ``--test_file`` (json, jsonl or csv, used as given),
``--do_train`` / ``--do_eval`` / ``--do_predict``, resuming from the last checkpoint in each model's folder,
``trainer.log_metrics`` / ``save_metrics`` / ``save_state``, an offline model card, and the ``accelerate launch``
CPU switch. Installed with the package (``panm_hf.pipelines``), so the scripts import it without path edits;
it needs the ``examples`` extra.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass, field

import torch
from huggingface_hub.utils import httpx
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, Seq2SeqTrainer
from transformers.trainer_utils import get_last_checkpoint

from panm_hf import PanmForSeq2SeqLM

logger = logging.getLogger(__name__)
DO_FLAGS = ("do_train", "do_eval", "do_predict")
FILE_EXTENSIONS = (".json", ".jsonl", ".csv")
# the examples keep no checkpoints unless --save_strategy asks for them (their budgets are short)
TRAINING_DEFAULTS = {"save_strategy": "no", "eval_strategy": "no"}
WEIGHT_AVERAGE_DIR = "weight_average"  # the averaged model's folder inside a model's output folder


@dataclass
class ScriptArguments:
    """The flags every example shares: a pretrained checkpoint, local data files, resuming."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A pretrained encoder-decoder (folder or Hub id), used as the backbone with its own "
                          "tokenizer instead of a random one built from the flags; a saved PANM model is used as is."},
    )  # fmt: skip
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train from the start even if a model's folder holds checkpoints (default: resume)."},
    )
    train_file: str | None = field(default=None, metadata={"help": "Training pairs (json, jsonl or csv)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation pairs (json, jsonl or csv)."})
    test_file: str | None = field(default=None, metadata={"help": "Pairs for --do_predict (json, jsonl or csv)."})
    source_column: str | None = field(
        default=None,
        metadata={"help": "The files' source column; comma-separated columns are joined by a space "
                          "(default: the example's, see its README)."},
    )  # fmt: skip
    target_column: str | None = field(default=None, metadata={"help": "The files' target column."})

    def given_files(self) -> dict[str, str]:
        """Split name -> the file given for it (`train`, `validation`, `test`)."""
        files = {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}
        return {split: path for split, path in files.items() if path is not None}


def use_cpu_for_multi_process_launch() -> None:
    """`accelerate launch --multi_gpu` on a machine without GPUs: Trainer needs use_cpu to build a gloo
    process group over the CPU processes; without it every process silently trains alone."""
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os.environ["ACCELERATE_USE_CPU"] = "true"


def gather_from_ranks(value) -> list:
    """`value` from every rank, in rank order (a collective: call it on all ranks); `[value]` outside DDP."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [value]
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def steps_given(argv: list[str]) -> bool:
    """Whether the command line (or its one JSON file) names any of --do_train/--do_eval/--do_predict."""
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(argv[0], encoding="utf-8") as handle:
            return any(flag in json.load(handle) for flag in DO_FLAGS)
    return any(arg.lstrip("-").split("=")[0] in DO_FLAGS for arg in argv)


def apply_default_steps(training_args, argv: list[str], default: tuple[str, ...]) -> None:
    """Without any --do_* flag the example runs its protocol (`default`, e.g. train then evaluate)."""
    if not steps_given(argv):
        for flag in default:
            setattr(training_args, flag, True)


def check_run(script_args: ScriptArguments, training_args, model: str) -> None:
    """ValueError for one checkpoint path given for two models."""
    if model == "both" and training_args.resume_from_checkpoint is not None:
        raise ValueError(
            "--resume_from_checkpoint names one checkpoint but --model both trains two; choose one --model, or "
            "leave the flag out: each model resumes from the last checkpoint in output_dir/<model>."
        )


def read_records(path: str, flag: str) -> list[dict]:
    """The rows of a json (a list, or {"data": [...]}), jsonl or csv file; ValueError naming `flag` when unreadable."""
    if not path.endswith(FILE_EXTENSIONS):
        raise ValueError(f"--{flag} {path!r} must end in one of {FILE_EXTENSIONS}.")
    if not os.path.isfile(path):
        raise ValueError(f"--{flag} {path!r} does not exist.")
    with open(path, encoding="utf-8", newline="") as handle:
        if path.endswith(".csv"):
            return list(csv.DictReader(handle))
        text = handle.read()
    if path.endswith(".json"):
        try:
            loaded = json.loads(text)
            return loaded["data"] if isinstance(loaded, dict) and "data" in loaded else loaded
        except json.JSONDecodeError:
            pass  # a .json file of JSON lines, as `datasets` reads it too
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            records.extend([json.loads(line)] if line.strip() else [])
        except json.JSONDecodeError as error:
            raise ValueError(f"--{flag} {path!r}: line {number} is not valid JSON ({error}).") from error
    return records


def flatten_translation(record: dict) -> dict:
    """HF's wmt layout ({"translation": {"en": ..., "de": ...}}) as plain language columns."""
    nested = record.get("translation")
    return {**record, **nested} if isinstance(nested, dict) else record


def pick_columns(record: dict, candidates: tuple[str, ...], flag: str, path: str) -> list[str]:
    """The first candidate spec ("a" or "a,b") whose columns all exist in `record`, as a list of columns."""
    for spec in candidates:
        columns = [column.strip() for column in spec.split(",")]
        if all(column in record for column in columns):
            return columns
    raise ValueError(
        f"{path!r} has columns {sorted(record)}; expected {' or '.join(map(repr, candidates))}. "
        f"Name yours with --{flag} (comma-separated columns are joined by a space)."
    )


def text_of(record: dict, columns: list[str]) -> str:
    """The columns' values joined by a space (a list value, e.g. a bAbI story, joined first)."""
    values = [record[column] for column in columns]
    return " ".join(" ".join(map(str, v)) if isinstance(v, list) else str(v) for v in values).strip()


def read_file_pairs(path: str, flag: str, sources: tuple[str, ...], targets: tuple[str, ...]) -> tuple[list, list]:
    """(source texts, target texts) of one data file, columns chosen from the candidate specs."""
    records = [flatten_translation(record) for record in read_records(path, flag)]
    if not records:
        raise ValueError(f"--{flag} {path!r} holds no rows.")
    source_columns = pick_columns(records[0], sources, "source_column", path)
    target_columns = pick_columns(records[0], targets, "target_column", path)
    return [text_of(r, source_columns) for r in records], [text_of(r, target_columns) for r in records]


def load_file_pairs(script_args: ScriptArguments, sources: tuple[str, ...], targets: tuple[str, ...]) -> dict:
    """Split -> (sources, targets) for each given file; --source_column/--target_column override the defaults."""
    sources = (script_args.source_column,) if script_args.source_column else sources
    targets = (script_args.target_column,) if script_args.target_column else targets
    return {split: read_file_pairs(path, f"{split}_file", sources, targets)
            for split, path in script_args.given_files().items()}  # fmt: skip


def check_sets(training_args, available: set[str], needs: dict[str, str]) -> None:
    """ValueError when a requested step has no data: `needs` maps a do_* flag to the set it uses."""
    for flag, split in needs.items():
        if getattr(training_args, flag) and split not in available:
            why = " (given, or turned on by an eval_strategy other than 'no')" if flag == "do_eval" else ""
            file_flag = {"train": "train_file", "eval": "validation_file", "test": "test_file"}[split]
            raise ValueError(f"--{flag}{why} needs {split} data: pass --{file_flag} (or --data_dir).")


def model_source(name: str, script_args: ScriptArguments, training_args) -> str | None:
    """Where model `name` is loaded from: --model_name_or_path, else (evaluating without training) the model
    a training run saved in output_dir/`name`; None builds a random backbone from the flags."""
    if script_args.model_name_or_path is not None:
        return script_args.model_name_or_path
    if training_args.do_train:
        return None
    saved = os.path.join(training_args.output_dir, name)
    if not os.path.isfile(os.path.join(saved, "config.json")):
        raise ValueError(
            f"Evaluating without --do_train needs a model: pass --model_name_or_path, or train one first "
            f"(nothing saved in {saved})."
        )
    return saved


def load_tokenizer(path: str):
    """The checkpoint's tokenizer; ValueError naming the flag when it has none usable for seq2seq."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError(f"The tokenizer of --model_name_or_path {path!r} needs pad and eos tokens.")
    return tokenizer


def load_pretrained(name: str, path: str, panm_kwargs: dict) -> PreTrainedModel:
    """Model `name` ("transformer" or "panm") from a checkpoint; PANM wraps it with `from_backbone`,
    a saved PANM model is used as it is."""
    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    is_panm = isinstance(model, PanmForSeq2SeqLM)
    if name == "transformer" and is_panm:
        raise ValueError(
            f"--model_name_or_path {path!r} is a PANM model; evaluate or train it with --model panm "
            "(the plain model would drop its PANM weights)."
        )
    if name == "panm" and not is_panm:
        model = PanmForSeq2SeqLM.from_backbone(model, **panm_kwargs)
    model.accepts_loss_kwargs = False  # see seq2seq.build_model
    return model


def checkpoint_to_resume(args, script_args: ScriptArguments) -> str | None:
    """--resume_from_checkpoint, else the last `checkpoint-*` in the model's folder unless --overwrite_output_dir."""
    if args.resume_from_checkpoint is not None:
        return args.resume_from_checkpoint
    if script_args.overwrite_output_dir or not os.path.isdir(args.output_dir):
        return None
    last_checkpoint = get_last_checkpoint(args.output_dir)
    if last_checkpoint is not None:
        logger.info("Resuming from %s (pass --overwrite_output_dir to train from the start).", last_checkpoint)
    return last_checkpoint


def log_and_save(trainer: Seq2SeqTrainer, split: str, metrics: dict) -> None:
    """`trainer.log_metrics` and `save_metrics` (`<split>_results.json`, merged into `all_results.json`)."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)


def train(trainer: Seq2SeqTrainer, script_args: ScriptArguments, num_samples: int, dataset: str) -> dict:
    """Train (resuming where asked or found), save the model, its metrics, state and model card; with a weight
    average (`--weight_average_decay`), save the averaged model too, in `<output_dir>/weight_average`."""
    checkpoint = checkpoint_to_resume(trainer.args, script_args)
    output = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()  # with the tokenizer (processing_class)
    if getattr(trainer, "weight_average", None) is not None:  # loads with from_pretrained like the model
        with trainer.weight_average_swapped_in():
            trainer.save_model(os.path.join(trainer.args.output_dir, WEIGHT_AVERAGE_DIR))
    log_and_save(trainer, "train", {**output.metrics, "train_samples": num_samples})
    trainer.save_state()
    write_model_card(trainer, script_args.model_name_or_path, dataset)
    return {"train_loss": output.training_loss, "train_steps": output.global_step, "resumed_from": checkpoint,
            "train_seconds": round(output.metrics["train_runtime"], 1)}  # fmt: skip


def write_model_card(trainer: Seq2SeqTrainer, model_name_or_path: str | None, dataset: str) -> None:
    """`trainer.create_model_card`, offline: a local checkpoint is named by its absolute path, which is no valid
    Hub id, so the card's Hub lookup (of the base model's license) stops before the network."""
    path = model_name_or_path
    finetuned_from = os.path.abspath(path) if path is not None and os.path.isdir(path) else path
    try:
        trainer.create_model_card(tasks="text2text-generation", finetuned_from=finetuned_from,
                                  dataset=os.path.basename(dataset.rstrip("/")))  # fmt: skip
    except (OSError, httpx.HTTPError) as error:  # a Hub id's lookup without network
        logger.warning("No model card written (%s).", error)


def write_results(training_args, summary: dict, name: str = "results.json") -> None:
    """Write the run's summary to output_dir/`name` from the main process only."""
    if training_args.process_index == 0:
        os.makedirs(training_args.output_dir, exist_ok=True)
        with open(os.path.join(training_args.output_dir, name), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
