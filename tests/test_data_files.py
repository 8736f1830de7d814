"""Damaged or incomplete data files get a ValueError naming the file (and question), not a raw error."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from length_split import load_local_pairs
from utils_qa import length_split, load_squad_examples, prepare_train_features

ROOT = Path(__file__).resolve().parents[1]

CONTEXT = "the red cat sat on the old stone"


def squad(qas: list[dict], context: str = CONTEXT) -> dict:
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}


def question(question_id: str = "q1", **fields) -> dict:
    return {"id": question_id, "question": "what sat?", "answers": [{"text": "red cat", "answer_start": 4}], **fields}


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def names(path: Path) -> str:
    return re.escape(repr(str(path)))


# -- SQuAD ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("answers", [[], None])
def test_question_without_gold_answer_names_file_and_question(tmp_path, answers):
    record = question("q-no-answer")
    if answers is None:
        del record["answers"]
    else:
        record["answers"] = answers
    path = write_json(tmp_path / "squad.json", squad([question("q-ok"), record]))
    with pytest.raises(ValueError, match=f"{names(path)}.*'q-no-answer'.*no gold answer"):
        load_squad_examples(path)


def test_empty_data_list_names_the_file(tmp_path):
    path = write_json(tmp_path / "empty.json", {"version": "1.1", "data": []})
    with pytest.raises(ValueError, match=f"{names(path)} holds no questions"):
        load_squad_examples(path)


def test_missing_squad_fields_name_file_and_place(tmp_path):
    document = squad([question()])
    del document["data"][0]["paragraphs"][0]["context"]
    path = write_json(tmp_path / "nocontext.json", document)
    with pytest.raises(ValueError, match=rf"{names(path)}.*data\[0\]\.paragraphs\[0\].*'context'"):
        load_squad_examples(path)
    path = write_json(tmp_path / "list.json", [question()])
    with pytest.raises(ValueError, match=f"{names(path)} is not in SQuAD format"):
        load_squad_examples(path)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("notgzip.json.gz", json.dumps(squad([question()])).encode(), "cannot be read as a gzip file"),
        ("truncated.json.gz", gzip.compress(json.dumps(squad([question()])).encode())[:-12], "cannot be read"),
        ("truncated.json", json.dumps(squad([question()])).encode()[:-5], "is not valid JSON"),
        ("latin1.json", json.dumps(squad([question()]), ensure_ascii=False).replace("red", "r\xe9d").encode("latin-1"),
         "is not valid UTF-8"),
    ],
)  # fmt: skip
def test_damaged_squad_files_name_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{names(path)}.*{message}"):
        load_squad_examples(path)


def test_train_windows_without_answer_name_the_question():
    from test_qa import wordpiece_tokenizer

    records = [{"id": "q1", "context": CONTEXT, "question": "what sat?", "answers": {"text": [], "answer_start": []}}]
    tokenizer = wordpiece_tokenizer(records)
    batch = {key: [record[key] for record in records] for key in records[0]}
    with pytest.raises(ValueError, match="'q1' has no gold answer"):
        prepare_train_features(batch, tokenizer, max_seq_length=32, doc_stride=8)


def test_length_split_without_a_test_part_says_so(tmp_path):
    path = write_json(tmp_path / "one-paragraph.json", squad([question("q1"), question("q2")]))
    with pytest.raises(ValueError, match="leaves no test sample"):
        length_split(load_squad_examples(path), 0.5)


# -- Multi30K (examples/translation) ------------------------------------------------------------------
def test_empty_multi30k_file_is_named_not_reported_missing(tmp_path):
    (tmp_path / "train.en").write_text("a man\ntwo dogs\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "train.de")) + " is empty"):
        load_local_pairs(str(tmp_path), "en", "de")


@pytest.mark.parametrize(
    "name,content,message",
    [("train.de.gz", b"ein Mann\n", "cannot be read"), ("train.de", "ein Mann\n".encode("utf-16"), "not valid UTF-8")],
)
def test_damaged_multi30k_file_is_named(tmp_path, name, content, message):
    (tmp_path / "train.en").write_text("a man\n", encoding="utf-8")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / name)) + f".*{message}"):
        load_local_pairs(str(tmp_path), "en", "de")
