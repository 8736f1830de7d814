"""The translation, math, bAbI and SCAN examples as transformers' example scripts behave: a pretrained
checkpoint with its own tokenizer, local data files, do_* flags, checkpoints, resuming, metrics, model card."""

from __future__ import annotations

import importlib
import json
import os
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["jump", "walk", "run", "look", "left", "right", "twice", "thrice", "and", "after"]
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


def record(example: str, source: list[str], target: list[str]) -> dict:
    """One row in the example's default columns (translation: HF's wmt "translation" dict)."""
    src, tgt = " ".join(source), " ".join(target)
    return {
        "translation": {"translation": {"en": src, "de": tgt}},
        "math": {"question": src, "answer": tgt},
        "babi": {"story": source[:-1], "question": source[-1], "answer": tgt},  # a list story, joined
        "scan": {"command": src, "actions": tgt},
    }[example]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny BART saved with `save_pretrained`, its WordLevel tokenizer beside it."""
    folder = tmp_path_factory.mktemp("tiny_bart")
    tokenizer = tiny_tokenizer()
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None,
    )  # fmt: skip
    BartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def write_jsonl(path: Path, example: str, num_rows: int = 12) -> str:
    rng = random.Random(0)
    rows = [[rng.choice(WORDS) for _ in range(2 + i % 4)] for i in range(num_rows)]
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record(example, words, words[::-1])) + "\n" for words in rows)
    return str(path)


def script(example: str):
    """The example's module (its folder is on pytest's `pythonpath`, see pyproject.toml)."""
    return importlib.import_module(f"run_{example}")


LENGTHS = {
    "translation": ["--max_source_length", "24", "--max_target_length", "12"],
    "math": ["--max_source_length", "24", "--max_target_length", "12"],
    "babi": ["--max_source_length", "24", "--max_target_length", "12"],
    "scan": ["--max_new_tokens", "12"],
}


def arguments(checkpoint: str, data: str, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--model", "panm", "--model_name_or_path", checkpoint, "--train_file", data, "--validation_file", data,
        "--output_dir", str(output_dir), "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "12",
        "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--report_to", "none", "--disable_tqdm", "true",
        "--address_bits", "6", "--pointer_hidden_size", "8", "--controller_hidden_size", "8", "--mlp_hidden_size", "8",
        "--save_strategy", "steps", "--save_steps", "2", "--dataloader_pin_memory", "false", *extra,
    ]  # fmt: skip


def checkpoints(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("checkpoint-")) if folder.is_dir() else []


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def losses(metrics: dict) -> dict:
    return {key: value for key, value in metrics.items() if key.endswith("_loss")}


@pytest.mark.parametrize("example", ["translation", "math", "babi", "scan"])
def test_pretrained_checkpoint_files_do_flags_and_resume(example, checkpoint, tmp_path):
    """Train a wrapped pretrained BART on a jsonl file with checkpoints, resume, then evaluate without training."""
    run = script(example)
    data = write_jsonl(tmp_path / "train.jsonl", example)
    out = tmp_path / "run"
    first = run.main(arguments(checkpoint, data, out, *LENGTHS[example], "--do_train", "--do_eval", "--max_steps", "4"))
    entry = first["results"]["panm"]
    assert entry["train_steps"] == 4 and entry["resumed_from"] is None
    model_dir = out / "panm"
    assert checkpoints(model_dir) == ["checkpoint-2", "checkpoint-4"]
    assert read_json(model_dir / "train_results.json")["train_samples"] == 12
    assert losses(read_json(model_dir / "eval_results.json"))  # the Trainer's metric files
    assert f"fine-tuned version of [{checkpoint}]" in (model_dir / "README.md").read_text(encoding="utf-8")
    # the checkpoint's tokenizer (not one built from the data), and its backbone wrapped by PANM
    vocab = read_json(Path(checkpoint) / "tokenizer.json")["model"]["vocab"]
    assert read_json(model_dir / "tokenizer.json")["model"]["vocab"] == vocab
    assert read_json(model_dir / "config.json")["model_type"] == "panm"

    second = run.main(
        arguments(checkpoint, data, out, *LENGTHS[example], "--do_train", "--do_eval", "--max_steps", "6")
    )
    assert second["results"]["panm"]["resumed_from"] == str(model_dir / "checkpoint-4")
    assert (
        second["results"]["panm"]["train_steps"] == 6
        and read_json(model_dir / "trainer_state.json")["global_step"] == 6
    )
    assert checkpoints(model_dir) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]

    # --do_eval alone evaluates the saved model: no training, no checkpoint, the same losses
    weights = load_file(model_dir / "model.safetensors")
    evaluated = tmp_path / "eval"
    only_eval = run.main(arguments(str(model_dir), data, evaluated, *LENGTHS[example], "--do_eval"))
    assert "train_steps" not in only_eval["results"]["panm"]
    assert checkpoints(evaluated / "panm") == [] and not (evaluated / "panm" / "model.safetensors").exists()
    assert not (evaluated / "panm" / "train_results.json").exists()
    for key, value in losses(read_json(model_dir / "eval_results.json")).items():
        assert read_json(evaluated / "panm" / "eval_results.json")[key] == pytest.approx(value, rel=1e-5)
    after = load_file(model_dir / "model.safetensors")
    assert all((after[name] == tensor).all() for name, tensor in weights.items())


def test_data_files_read_every_layout_and_errors_name_the_flag(tmp_path):
    from panm_hf.pipelines import script_conventions as conventions

    rows = [{"question": "what is 1 + 2 ?", "answer": "3"}, {"question": "what is 2 + 2 ?", "answer": "4"}]
    expected = (["what is 1 + 2 ?", "what is 2 + 2 ?"], ["3", "4"])
    (tmp_path / "list.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "data.json").write_text(json.dumps({"data": rows}), encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "rows.csv").write_text("question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in rows))
    for name in ("list.json", "data.json", "rows.jsonl", "rows.csv"):
        assert conventions.read_file_pairs(str(tmp_path / name), "train_file", ("question",), ("answer",)) == expected
    # HF's wmt layout, and a bAbI story given as a list of statements, joined by spaces
    wmt = write_jsonl(tmp_path / "wmt.jsonl", "translation", num_rows=2)
    sources, targets = conventions.read_file_pairs(wmt, "train_file", ("en",), ("de",))
    assert targets == [" ".join(s.split()[::-1]) for s in sources]
    babi = write_jsonl(tmp_path / "babi.jsonl", "babi", num_rows=2)
    assert conventions.read_file_pairs(babi, "train_file", ("story,question", "source"), ("answer",))[0] == sources
    with pytest.raises(ValueError, match=r"columns \['answer', 'question'\]; expected 'command'.*--source_column"):
        conventions.read_file_pairs(str(tmp_path / "rows.jsonl"), "train_file", ("command",), ("answer",))
    (tmp_path / "rows.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--test_file .*rows.txt' must end in one of"):
        conventions.read_records(str(tmp_path / "rows.txt"), "test_file")
    (tmp_path / "broken.jsonl").write_text(json.dumps(rows[0]) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--validation_file .*line 2 is not valid JSON"):
        conventions.read_records(str(tmp_path / "broken.jsonl"), "validation_file")


@pytest.mark.parametrize("example", ["translation", "math", "babi", "scan"])
def test_requested_steps_need_their_data_and_one_checkpoint_per_model(example, checkpoint, tmp_path):
    run = script(example)
    data = write_jsonl(tmp_path / "train.jsonl", example, num_rows=2)
    given = ["--model_name_or_path", checkpoint, "--output_dir", str(tmp_path), "--report_to", "none"]
    with pytest.raises(ValueError, match="--do_predict needs test data: pass --test_file"):
        # (translation's default --eval_strategy epoch would ask for evaluation data first)
        run.main(
            [*given, "--train_file", data, "--do_train", "--do_predict", "--eval_strategy", "no", "--max_steps", "1"]
        )
    with pytest.raises(ValueError, match="--model both trains two"):
        run.main([*given, "--train_file", data, "--do_train", "--model", "both", "--resume_from_checkpoint", data])
    with pytest.raises(ValueError, match="Evaluating without --do_train needs a model"):
        run.main(["--output_dir", str(tmp_path), "--validation_file", data, "--do_eval", "--report_to", "none"])
