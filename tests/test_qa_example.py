"""run_qa.py as transformers' example scripts behave: local files, do_* flags, resume, metrics, model card, DDP."""

from __future__ import annotations

import csv
import json
import os
import random
import socket
import subprocess
import sys

import pytest
import run_qa
import torch
from safetensors.torch import load_file
from test_qa import EXAMPLE_DIR, REPO, WORDS, tiny_bert_config, wordpiece_tokenizer
from transformers import BertForQuestionAnswering
from utils_qa import load_qa_file

RUN_QA = os.path.join(EXAMPLE_DIR, "run_qa.py")


def squad_records(num_contexts: int = 8, seed: int = 0) -> list[dict]:
    """Flat SQuAD-style records (the Hub `squad` layout): two questions per random-word context."""
    rng = random.Random(seed)
    records = []
    for p in range(num_contexts):
        words = [rng.choice(WORDS) for _ in range(6 + 3 * p)]
        for q in range(2):
            start = rng.randrange(len(words) - 2)
            char_start = len(" ".join(words[:start])) + (1 if start else 0)
            records.append({
                "id": f"p{p}q{q}", "title": f"a{p}", "context": " ".join(words),
                "question": f"what follows {words[max(start - 1, 0)]} ?",
                "answers": {"text": [" ".join(words[start : start + 2])], "answer_start": [char_start]},
            })  # fmt: skip
    return records


def write_jsonl(path, records) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)
    return str(path)


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    """A tiny pretrained BERT-for-QA folder (save_pretrained, WordPiece tokenizer) and train/validation/test jsonl."""
    root = tmp_path_factory.mktemp("qa_files")
    records = squad_records()
    tokenizer = wordpiece_tokenizer(records)
    torch.manual_seed(0)
    BertForQuestionAnswering(tiny_bert_config(vocab_size=len(tokenizer))).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    unanswered = [{key: value for key, value in record.items() if key != "answers"} for record in records[12:]]
    return {
        "model": str(root / "model"),
        "train": write_jsonl(root / "train.jsonl", records[:10]),
        "validation": write_jsonl(root / "validation.jsonl", records[10:14]),
        "test": write_jsonl(root / "test.jsonl", unanswered),
        "records": records,
    }


def qa_args(qa_files, output_dir, *extra: str, model: str = "bert") -> list[str]:
    return [
        "--model", model, "--model_name_or_path", qa_files["model"], "--output_dir", str(output_dir),
        "--max_seq_length", "48", "--doc_stride", "16", "--pad_to_max_length", "False",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--report_to", "none",
        "--disable_tqdm", "True", "--dataloader_pin_memory", "False", "--address_bits", "7",
        "--pointer_hidden_size", "16", "--controller_hidden_size", "16", "--mlp_hidden_size", "16", *extra,
    ]  # fmt: skip


def checkpoints(folder) -> list[str]:
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(name for name in names if name.startswith("checkpoint-"))


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# -- data files ----------------------------------------------------------------------------------
def test_load_qa_file_reads_every_layout_alike(tmp_path):
    records = squad_records(num_contexts=2)
    with open(tmp_path / "list.json", "w", encoding="utf-8") as handle:
        json.dump(records, handle)
    with open(tmp_path / "data.json", "w", encoding="utf-8") as handle:
        json.dump({"data": records}, handle)
    nested = [{"title": r["title"], "paragraphs": [{"context": r["context"], "qas": [
        {"id": r["id"], "question": r["question"],
         "answers": [{"text": r["answers"]["text"][0], "answer_start": r["answers"]["answer_start"][0]}]}]}]}
        for r in records]  # fmt: skip
    with open(tmp_path / "nested.json", "w", encoding="utf-8") as handle:
        json.dump({"version": "1.1", "data": nested}, handle)
    with open(tmp_path / "rows.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows({**r, "answers": json.dumps(r["answers"])} for r in records)
    for name in ("list.json", "data.json", "nested.json", "rows.csv"):
        assert load_qa_file(tmp_path / name, "train_file") == records, name
    assert load_qa_file(write_jsonl(tmp_path / "rows.jsonl", records), "train_file") == records


def test_load_qa_file_errors_name_flag_file_and_record(tmp_path):
    records = squad_records(num_contexts=1)
    unanswered = write_jsonl(
        tmp_path / "unanswered.jsonl", [{**records[0], "answers": {"text": [], "answer_start": []}}]
    )
    with pytest.raises(ValueError, match=r"validation_file '.*unanswered.jsonl'.*'p0q0'.*no gold answer"):
        load_qa_file(unanswered, "validation_file")
    assert load_qa_file(unanswered, "test_file", need_answers=False)[0]["answers"]["text"] == []
    twice = write_jsonl(tmp_path / "twice.jsonl", [records[0], records[0]])
    with pytest.raises(ValueError, match=r"train_file .*'p0q0' is used twice"):
        load_qa_file(twice, "train_file")
    (tmp_path / "broken.jsonl").write_text(json.dumps(records[0]) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train_file .*broken.jsonl.*line 2 is not valid JSON"):
        load_qa_file(tmp_path / "broken.jsonl", "train_file")
    no_context = write_jsonl(tmp_path / "no_context.jsonl", [{k: v for k, v in records[0].items() if k != "context"}])
    with pytest.raises(ValueError, match=r"line 1 has no 'context'"):
        load_qa_file(no_context, "train_file")
    (tmp_path / "questions.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train_file .*questions.txt' must end in one of .*jsonl"):
        load_qa_file(tmp_path / "questions.txt", "train_file")


def test_a_question_too_long_for_the_window_names_the_flags(qa_files):
    from transformers import AutoTokenizer
    from utils_qa import prepare_validation_features

    tokenizer = AutoTokenizer.from_pretrained(qa_files["model"])
    record = {**qa_files["records"][0], "question": " ".join(WORDS)}  # about 20 tokens
    batch = {key: [value] for key, value in record.items()}
    windows = prepare_validation_features(batch, tokenizer, max_seq_length=64, doc_stride=16)
    assert len(windows["input_ids"]) >= 1
    # without the check the fast tokenizer fails here with a bare Exception (or, batched, a Rust panic)
    with pytest.raises(ValueError, match=r"question 'p0q0' has \d+ tokens.*--max_seq_length, lower --doc_stride"):
        prepare_validation_features(batch, tokenizer, max_seq_length=32, doc_stride=16)


def test_dataset_name_reads_a_local_dataset_folder_as_given(qa_files, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "my_squad"
    folder.mkdir()
    parts = {"train": [r for r in qa_files["records"] if r["id"].endswith("q0")],
             "validation": [r for r in qa_files["records"] if r["id"].endswith("q1")]}  # fmt: skip
    for split, records in parts.items():
        write_jsonl(folder / f"{split}.jsonl", records)
    splits = run_qa.load_dataset_splits(str(folder), None)
    assert set(splits) == {"train", "validation"}
    assert [r["id"] for r in splits["validation"]] == [r["id"] for r in parts["validation"]]
    assert splits["train"][0]["answers"] == parts["train"][0]["answers"]
    (tmp_path / "no_answers").mkdir()
    write_jsonl(tmp_path / "no_answers" / "train.jsonl", [{"id": "x", "context": "c", "question": "q"}])
    with pytest.raises(ValueError, match=r"split 'train' has no column\(s\) \['answers'\]"):
        run_qa.load_dataset_splits(str(tmp_path / "no_answers"), None)


@pytest.mark.parametrize("name", ["squad", "rajpurkar/squad"])
def test_dataset_name_takes_hub_names_and_uses_their_splits_as_given(name):
    data_args = run_qa.DataArguments(dataset_name=name, dataset_config_name="plain_text")
    assert data_args.length_split is False
    assert run_qa.DataArguments(dataset_name=name, length_split=True).length_split is True


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "Give one data source"),
        (["--data_file", "a.json", "--dataset_name", "rajpurkar/squad"], "Give one data source"),
        (["--data_file", "a.json", "--length_split", "False"], "pass it as --train_file"),
        (["--test_file", "t.jsonl", "--length_split", "True"], "pools --train_file and --validation_file"),
    ],
)
def test_data_arguments_name_the_flag_and_the_fix(qa_files, tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        run_qa.main(qa_args(qa_files, tmp_path, "--do_eval", *extra))


def test_requested_steps_need_their_split(qa_files, tmp_path):
    with pytest.raises(ValueError, match="--do_predict needs test questions: pass --test_file"):
        run_qa.main(qa_args(qa_files, tmp_path, "--validation_file", qa_files["validation"], "--do_predict"))
    with pytest.raises(ValueError, match="--do_eval .*eval_strategy.* needs validation questions"):
        run_qa.main(qa_args(qa_files, tmp_path, "--train_file", qa_files["train"], "--do_train",
                            "--eval_strategy", "steps"))  # fmt: skip
    with pytest.raises(ValueError, match="Nothing to do"):
        run_qa.main(qa_args(qa_files, tmp_path, "--train_file", qa_files["train"]))
    with pytest.raises(ValueError, match="--model both trains two"):
        run_qa.main(qa_args(qa_files, tmp_path, "--train_file", qa_files["train"], "--do_train",
                            "--resume_from_checkpoint", str(tmp_path), model="both"))  # fmt: skip


# -- do_eval / do_predict without training -------------------------------------------------------
def test_do_eval_alone_evaluates_the_given_model_and_does_not_train(qa_files, tmp_path):
    results = run_qa.main(qa_args(
        qa_files, tmp_path, "--validation_file", qa_files["validation"], "--test_file", qa_files["test"],
        "--do_eval", "--do_predict", "--save_strategy", "steps", "--save_steps", "1",
    ))  # fmt: skip
    entry = results["models"]["bert"]
    assert "train_steps" not in entry and "train_questions" not in results["split"]
    # the weights are the checkpoint's, and nothing was trained or saved
    expected = sum(float(t.double().sum()) for t in load_file(os.path.join(qa_files["model"], "model.safetensors"))
                   .values())  # fmt: skip
    assert entry["rank_checksums"] == [pytest.approx(expected, rel=0, abs=1e-6)]
    out = tmp_path / "bert"
    assert checkpoints(out) == [] and not (out / "model.safetensors").exists()
    assert not (out / "train_results.json").exists()
    # the Trainer's metric files, and the answers
    eval_metrics = read_json(out / "eval_results.json")
    assert eval_metrics["eval_f1"] == entry["f1"] and eval_metrics["eval_samples"] == results["split"]["eval_windows"]
    assert set(read_json(out / "predictions.json")) == {r["id"] for r in qa_files["records"][10:14]}
    test_answers = read_json(out / "test_predictions.json")
    assert set(test_answers) == {r["id"] for r in qa_files["records"][12:]}
    contexts = {r["id"]: r["context"] for r in qa_files["records"]}
    assert all(answer in contexts[key] for key, answer in test_answers.items())
    predict_metrics = read_json(out / "predict_results.json")  # the test file has no answers: no EM/F1
    assert (
        "test_f1" not in predict_metrics and predict_metrics["predict_samples"] == results["split"]["predict_windows"]
    )
    assert {**eval_metrics, **predict_metrics}.items() <= read_json(out / "all_results.json").items()
    assert read_json(tmp_path / "qa_results.json") == json.loads(json.dumps(results))


# -- train, checkpoints, resume ------------------------------------------------------------------
def test_train_on_files_saves_checkpoints_and_resumes(qa_files, tmp_path):
    files = ["--train_file", qa_files["train"], "--validation_file", qa_files["validation"]]
    common = [*files, "--do_train", "--lr_scheduler_type", "constant", "--learning_rate", "1e-3",
              "--save_strategy", "steps", "--save_steps", "2"]  # fmt: skip
    first = run_qa.main(qa_args(qa_files, tmp_path / "run", *common, "--max_steps", "2", "--do_eval",
                                "--eval_strategy", "steps", "--eval_steps", "2", "--do_predict",
                                "--test_file", qa_files["validation"]))  # fmt: skip
    out = tmp_path / "run" / "bert"
    assert first["models"]["bert"]["train_steps"] == 2 and first["models"]["bert"]["resumed_from"] is None
    # answered test questions are scored: the validation file as test file scores as in evaluation
    assert first["models"]["bert"]["test_f1"] == first["models"]["bert"]["f1"]
    assert checkpoints(out) == ["checkpoint-2"]
    # eval_strategy from the command line is honoured: an evaluation at step 2 during training
    assert [e["step"] for e in read_json(out / "trainer_state.json")["log_history"] if "eval_f1" in e] == [2]
    assert read_json(out / "train_results.json")["train_samples"] == first["split"]["train_windows"] == 10
    card = (out / "README.md").read_text(encoding="utf-8")  # the model card, written offline
    assert f"fine-tuned version of [{qa_files['model']}]" in card and "train.jsonl dataset" in card

    second = run_qa.main(qa_args(qa_files, tmp_path / "run", *common, "--max_steps", "4"))
    assert second["models"]["bert"]["resumed_from"] == str(out / "checkpoint-2")
    assert second["models"]["bert"]["train_steps"] == 4 and checkpoints(out) == ["checkpoint-2", "checkpoint-4"]
    assert read_json(out / "trainer_state.json")["global_step"] == 4
    # resuming gives the weights of an uninterrupted 4-step run
    straight = run_qa.main(qa_args(qa_files, tmp_path / "straight", *common, "--max_steps", "4"))
    assert straight["models"]["bert"]["resumed_from"] is None
    resumed, uninterrupted = (load_file(folder / "bert" / "model.safetensors") for folder in
                              (tmp_path / "run", tmp_path / "straight"))  # fmt: skip
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in resumed.items():
        torch.testing.assert_close(tensor, uninterrupted[name])
    assert not torch.equal(
        resumed["qa_outputs.weight"],
        load_file(os.path.join(qa_files["model"], "model.safetensors"))["qa_outputs.weight"],
    )

    chosen = str(tmp_path / "straight" / "bert" / "checkpoint-2")  # --resume_from_checkpoint names one
    explicit = run_qa.main(qa_args(qa_files, tmp_path / "explicit", *common, "--max_steps", "4",
                                   "--resume_from_checkpoint", chosen))  # fmt: skip
    assert explicit["models"]["bert"]["resumed_from"] == chosen
    assert explicit["models"]["bert"]["rank_checksums"] == straight["models"]["bert"]["rank_checksums"]

    again = run_qa.main(qa_args(qa_files, tmp_path / "run", *common, "--max_steps", "2", "--overwrite_output_dir",
                                "True"))  # fmt: skip
    assert again["models"]["bert"]["resumed_from"] is None and again["models"]["bert"]["train_steps"] == 2


# -- two processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.smoke
def test_accelerate_launch_two_cpu_processes_train_in_sync(qa_files, tmp_path):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--machine_rank", "0", "--main_process_port", str(free_port()),
              "--mixed_precision", "no", "--dynamo_backend", "no", RUN_QA]  # fmt: skip
    args = qa_args(qa_files, tmp_path, "--train_file", qa_files["train"], "--validation_file", qa_files["validation"],
                   "--do_train", "--do_eval", "--num_train_epochs", "1", "--per_device_train_batch_size", "2",
                   "--save_strategy", "no", model="both")  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(launch + args, capture_output=True, text=True, env=env, cwd=REPO, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("results written to") + result.stderr.count("results written to") == 1  # rank 0
    results = read_json(tmp_path / "qa_results.json")
    assert results["settings"]["world_size"] == 2
    per_rank = -(-results["split"]["train_windows"] // 2)  # each rank trains on half the windows ...
    for name in ("bert", "panm"):
        entry = results["models"][name]
        assert entry["train_steps"] == -(-per_rank // 2)  # ... 2 per batch: 3 steps for 10 windows (alone: 5)
        assert len(entry["rank_checksums"]) == 2 and entry["ranks_in_sync"], entry["rank_checksums"]
        assert 0.0 <= entry["exact_match"] <= entry["f1"] <= 100.0
