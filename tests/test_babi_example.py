"""The bAbI example: the data reader, the length split, the metric, and an end-to-end run on a tiny slice."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_babi import (
    BabiQuestion,
    babi_scores,
    length_split,
    parse_tasks,
    read_babi_file,
    task_files,
    word_tokenizer,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "babi" / "run_babi.py"
DATA_DIR = ROOT.parent / "shared" / "data" / "babi"


STORY = (
    "1 Mary moved to the bathroom.\n"
    "2 John went to the hallway.\n"
    "3 Where is Mary? \tbathroom\t1\n"
    "4 Daniel went back to the hallway.\n"
    "5 Where is Daniel?\thallway\t4\n"
    "1 The office is east of the hallway.\n"
    "2 How do you go from the hallway to the office?\te,s\t1\n"
)


def _write(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(text)
    return path


def test_reader_keeps_statements_before_each_question_and_restarts_stories(tmp_path):
    questions = read_babi_file(_write(tmp_path / "qa1_x_train.txt.gz", STORY), task=1)
    assert [q.question for q in questions] == ["Where is Mary?", "Where is Daniel?",
                                               "How do you go from the hallway to the office?"]  # fmt: skip
    # question lines are not story; the second story does not see the first one
    assert questions[1].story == ["Mary moved to the bathroom.", "John went to the hallway.",
                                  "Daniel went back to the hallway."]  # fmt: skip
    assert questions[2].story == ["The office is east of the hallway."]
    assert questions[0].source == "mary moved to the bathroom . john went to the hallway . where is mary ?"
    assert (questions[0].target, questions[2].target) == ("bathroom", "e , s")
    assert {q.task for q in questions} == {1}


def test_reader_raises_on_a_bad_path_or_a_damaged_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_babi_file(tmp_path / "missing.txt.gz", task=1)
    bad = _write(tmp_path / "bad.txt.gz", "1 Mary moved.\n2 Where is Mary?\tbathroom\n")
    with pytest.raises(ValueError, match=r"bad\.txt\.gz, line 2"):
        read_babi_file(bad, task=1)
    no_id = _write(tmp_path / "noid.txt.gz", "Mary moved.\n")
    with pytest.raises(ValueError, match=r"noid\.txt\.gz, line 1: expected 'ID text'"):
        read_babi_file(no_id, task=1)
    plain = tmp_path / "plain.txt.gz"
    plain.write_text(STORY)
    with pytest.raises(ValueError, match="not a readable gzipped"):
        read_babi_file(plain, task=1)
    with pytest.raises(ValueError, match="is not a folder"):
        task_files(tmp_path, "en", 1)
    with pytest.raises(ValueError, match="--subset"):
        task_files(tmp_path, "fr", 1)


def test_length_split_puts_the_longest_questions_in_test():
    questions = [BabiQuestion(1, ["a b ."] * n, "where ?", "x") for n in (3, 1, 4, 2, 5)]
    train, test = length_split(questions, 0.6)
    assert [len(q.story) for q in train] == [1, 2, 3] and [len(q.story) for q in test] == [4, 5]
    with pytest.raises(ValueError, match="train_fraction"):
        length_split(questions, 1.0)


def test_scores_are_exact_match_per_task_with_failed_tasks():
    questions = [BabiQuestion(1, [], "q", "a"), BabiQuestion(1, [], "q", "b"), BabiQuestion(2, [], "q", "s,e")]
    scores = babi_scores(["a", "c", "s , e"], questions)
    assert scores["per_task_accuracy"] == {1: 50.0, 2: 100.0}
    assert scores["accuracy"] == pytest.approx(200 / 3)
    assert scores["mean_error"] == 25.0 and scores["failed_tasks"] == 1


def test_tasks_flag_and_tokenizer():
    assert parse_tasks("all") == list(range(1, 21)) and parse_tasks("3,1,3") == [1, 3]
    for bad in ("0", "21", "one", ""):
        with pytest.raises(ValueError, match="--tasks"):
            parse_tasks(bad)
    tokenizer = word_tokenizer(["mary went to the kitchen . where is mary ?", "kitchen"])
    ids = tokenizer("where is john ?", max_length=3, truncation=True)["input_ids"]
    # left truncation keeps the end of the input (the question) and its </s>
    assert tokenizer.convert_ids_to_tokens(ids) == ["<unk>", "?", "</s>"]


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/babi is not available")
def test_reads_the_shared_data():
    from run_babi import load_task

    questions = load_task(DATA_DIR, "en", 1)
    assert len(questions) == 2000  # 1,000 training + 1,000 test questions
    assert questions[0].story == ["Mary moved to the bathroom.", "John went to the hallway."]
    assert questions[0].target == "bathroom"
    with pytest.raises(ValueError, match="use --subset en"):
        task_files(DATA_DIR, "en-10k", 3)  # the one file missing from shared/data


@pytest.mark.smoke
@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/babi is not available")
def test_smoke_run_scores_both_models(tmp_path):
    command = [sys.executable, str(SCRIPT), "--data_dir", str(DATA_DIR), "--output_dir", str(tmp_path),
               "--model", "both", "--smoke", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["tasks"] == [1, 2] and summary["num_test"] == 16
    for task in ("1", "2"):  # the test questions are longer than every training question of their task
        assert summary["split_lengths"][task]["test_min_words"] >= summary["split_lengths"][task]["train_max_words"]
    for name in ("transformer", "panm"):
        scores = summary["results"][name]
        assert set(scores["per_task_accuracy"]) == {"1", "2"}
        assert 0.0 <= scores["accuracy"] <= 100.0 and scores["train_loss"] > 0
    assert summary["results"]["panm"]["num_parameters"] != summary["results"]["transformer"]["num_parameters"]
