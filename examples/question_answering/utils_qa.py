"""SQuAD-format data for extractive QA: loading, the paper's length split, windows, answers.

Kept beside ``run_qa.py`` (as transformers keeps its ``utils_qa.py``); used by it,
``trainer_qa.py`` and the tests:

* ``load_squad_examples`` flattens the official nested JSON (plain or ``.gz``) into one
  record per question, in the column layout of the Hub's ``squad`` dataset;
  ``load_qa_file`` reads such flat records from json, jsonl or csv (or the nested JSON).
* ``length_split`` is the paper's split (Sec. 4.3 and appendix): pool the questions,
  sort them by context length, train on the shorter fraction, test on the longer.
* ``prepare_train_features`` / ``prepare_validation_features`` cut each
  question+context into ``max_seq_length`` windows with ``doc_stride`` overlap and
  map the answer's characters to tokens through the offset mapping.
* ``postprocess_qa_predictions`` turns per-window start/end logits into one answer
  text per question from the n best start/end pairs inside the context.

The windowing and n-best search follow transformers' ``run_qa`` example.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import os
import zlib
from collections.abc import Sequence

import numpy as np

from panm_hf import splits

QA_FILE_SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz", ".csv")


def load_squad_examples(path: str | os.PathLike, flag: str = "data_file") -> list[dict]:
    """Read an official SQuAD v1.1 JSON file (optionally gzipped) into flat question records.

    Args:
        path: `dev-v1.1.json`, `dev-v1.1.json.gz` or any file in that format.
        flag: the command-line flag that named the file, quoted in errors.

    Returns:
        A list of `{"id", "title", "context", "question", "answers": {"text": [...],
        "answer_start": [...]}}` dicts in file order.

    Raises:
        ValueError: naming the file (and the question id) when the file is missing, unreadable
            (bad gzip, bad UTF-8, bad JSON), not in SQuAD layout, holds no question, or a
            question has no gold answer.
    """
    source = _source(path, flag)
    document = _read_json(os.fspath(path), source)
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"{source} is not in SQuAD format: it has no top-level 'data' list.")
    return _nonempty(_flatten_squad(data, source), source)


def load_qa_file(path: str | os.PathLike, flag: str, need_answers: bool = True) -> list[dict]:
    """Read question records from a json, jsonl or csv file (optionally gzipped json/jsonl).

    Accepted layouts, one record per question as the Hub's `squad` dataset has them (`id`,
    `title` (optional), `context`, `question`, `answers: {"text": [...], "answer_start": [...]}`):

    * `.jsonl`: one record per line;
    * `.json`: a list of records, `{"data": [records]}` (as transformers' run_qa reads), or the
      official nested SQuAD JSON (`data/paragraphs/qas`);
    * `.csv`: one row per question, `answers` holding the JSON of the answers dict.

    Args:
        path: the file.
        flag: the command-line flag that named it (`train_file`, ...), quoted in errors.
        need_answers: every record must have a gold answer (training and scoring need one);
            False lets records (e.g. of a test file) leave `answers` out.

    Returns:
        Flat records in file order, `answers` as `{"text": [...], "answer_start": [...]}` (empty
        lists where a test record has none).

    Raises:
        ValueError: naming the flag, the file and the record when the file is missing, of
            another type, unreadable, or a record lacks a field, has a malformed answer or a
            repeated id.
    """
    source = _source(path, flag)
    path = os.fspath(path)
    if not path.endswith(QA_FILE_SUFFIXES):
        raise ValueError(f"{source} must end in one of {', '.join(QA_FILE_SUFFIXES)}; convert it to SQuAD-style jsonl.")
    if path.endswith(".csv"):
        rows = _read_csv(path, source)
    elif path.endswith((".jsonl", ".jsonl.gz")):
        rows = _read_jsonl(path, source)
    else:
        document = _read_json(path, source)
        data = document.get("data") if isinstance(document, dict) else document
        if isinstance(data, list) and data and isinstance(data[0], dict) and "paragraphs" in data[0]:
            return _nonempty(_flatten_squad(data, source), source)  # the official nested layout
        rows = _json_rows(data, source)
    records = [_flat_record(row, source, where, need_answers) for where, row in rows]
    _check_unique_ids(records, source)
    return _nonempty(records, source)


def _source(path, flag: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} does not exist; pass the path of a SQuAD-format file.")
    return f"{flag} {path!r}"


def _nonempty(examples: list[dict], source: str) -> list[dict]:
    if not examples:
        raise ValueError(f"{source} holds no questions; pass a file with at least one question.")
    return examples


def _read_json(path: str, source: str):
    # Damaged files raise with the file's name instead of a bare gzip/codec/JSON error.
    with _reading(path, source) as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{source} is not valid JSON ({error}); check that the download or copy is complete."
            ) from error


def _read_jsonl(path: str, source: str) -> list[tuple[str, object]]:
    rows = []
    with _reading(path, source) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{source}: line {number} is not valid JSON ({error}); write one record per line."
                ) from error
    return rows


def _read_csv(path: str, source: str) -> list[tuple[str, object]]:
    rows = []
    with _reading(path, source, newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):  # line 1 is the header
            answers = row.get("answers")
            if answers:
                try:
                    row["answers"] = json.loads(answers)
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"{source}: line {number}'s 'answers' is not JSON ({error}); write it as "
                        '{"text": ["..."], "answer_start": [0]}.'
                    ) from error
            else:
                row.pop("answers", None)
            rows.append((f"line {number}", row))
    return rows


def _json_rows(data, source: str) -> list[tuple[str, object]]:
    if not isinstance(data, list):
        raise ValueError(
            f"{source} is neither a list of question records nor a {{'data': [...]}} document; "
            "write SQuAD-style records (one per line as .jsonl, or a JSON list)."
        )
    return [(f"record {index}", row) for index, row in enumerate(data)]


@contextlib.contextmanager
def _reading(path: str, source: str, newline: str | None = None):
    compressed = path.endswith(".gz")
    try:
        if compressed:
            handle = gzip.open(path, "rt", encoding="utf-8")
        else:
            handle = open(path, encoding="utf-8", newline=newline)  # noqa: SIM115  (closed below)
        with handle:
            yield handle
    except UnicodeDecodeError as error:
        raise ValueError(f"{source} is not valid UTF-8 ({error}); save it as UTF-8.") from error
    except (OSError, EOFError, zlib.error) as error:
        kind = "gzip file" if compressed else "file"
        raise ValueError(
            f"{source} cannot be read as a {kind} ({error}); check that it is complete"
            + (" and really gzipped (or drop the .gz suffix)." if compressed else ".")
        ) from error


def _flatten_squad(data: list, source: str) -> list[dict]:
    examples = []
    for article_index, article in enumerate(data):
        where = f"data[{article_index}]"
        for paragraph_index, paragraph in enumerate(_squad_field(article, "paragraphs", list, source, where)):
            where = f"data[{article_index}].paragraphs[{paragraph_index}]"
            context = _squad_field(paragraph, "context", str, source, where)
            for qa in _squad_field(paragraph, "qas", list, source, where):
                examples.append(_question_record(qa, article, context, source, where))
    return examples


def _squad_field(record, name: str, kind: type, source: str, where: str):
    if not isinstance(record, dict) or not isinstance(record.get(name), kind):
        raise ValueError(
            f"{source} is not in SQuAD format: {where} has no {kind.__name__} {name!r} "
            "(expected data/paragraphs/qas as in SQuAD v1.1)."
        )
    return record[name]


def _question_record(qa, article: dict, context: str, source: str, where: str) -> dict:
    question_id = qa.get("id") if isinstance(qa, dict) else None
    if question_id is None:
        raise ValueError(f"{source}: a question in {where} has no 'id'; every SQuAD question needs one.")
    where = f"question {question_id!r} in {where}"
    question = _squad_field(qa, "question", str, source, where)
    answers = qa.get("answers")
    if not isinstance(answers, list) or not answers:
        raise ValueError(
            f"{source}: {where} has no gold answer ('answers' is missing or empty); SQuAD v1.1 "
            "training and scoring need at least one. Drop the question (e.g. SQuAD v2's unanswerable ones)."
        )
    return {
        "id": question_id,
        "title": article.get("title", ""),
        "context": context,
        "question": question,
        "answers": _answers_dict(answers, source, where),
    }


def _flat_record(row, source: str, where: str, need_answers: bool) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{source}: {where} is not a JSON object; each question is one record.")
    for name, kinds in (("id", (str, int)), ("context", str), ("question", str)):
        if not isinstance(row.get(name), kinds) or row[name] == "":
            raise ValueError(
                f"{source}: {where} has no {name!r}; each record needs id, context, question and answers "
                '({"text": [...], "answer_start": [...]}).'
            )
    where = f"question {str(row['id'])!r} ({where})"
    answers = _answers_dict(row.get("answers", {"text": [], "answer_start": []}), source, where)
    if need_answers and not answers["text"]:
        raise ValueError(
            f"{source}: {where} has no gold answer ('answers' is missing or empty); training and scoring "
            "need at least one. Drop the question, or pass the file as --test_file (answers optional)."
        )
    title = row.get("title") or ""
    return {"id": str(row["id"]), "title": str(title), "context": row["context"], "question": row["question"],
            "answers": answers}  # fmt: skip


def _answers_dict(answers, source: str, where: str) -> dict:
    # The Hub's layout ({"text": [...], "answer_start": [...]}) or the official one ([{"text", "answer_start"}]).
    if isinstance(answers, dict):
        pairs = list(zip(answers.get("text") or [], answers.get("answer_start") or []))
        if len(answers.get("text") or []) != len(answers.get("answer_start") or []):
            pairs = None
    else:
        pairs = [(a.get("text"), a.get("answer_start")) if isinstance(a, dict) else (None, None)
                 for a in answers] if isinstance(answers, list) else None  # fmt: skip
    if pairs is None or not all(isinstance(text, str) and isinstance(start, int) for text, start in pairs):
        raise ValueError(
            f"{source}: {where} has an answer without a string 'text' and an integer 'answer_start' "
            f'(got {answers!r}); write answers as {{"text": ["..."], "answer_start": [0]}}.'
        )
    return {"text": [text for text, _ in pairs], "answer_start": [start for _, start in pairs]}


def _check_unique_ids(records: list[dict], source: str) -> None:
    seen = set()
    for record in records:
        if record["id"] in seen:
            raise ValueError(f"{source}: the id {record['id']!r} is used twice; answers are matched by id.")
        seen.add(record["id"])


def length_split(examples: Sequence[dict], train_fraction: float) -> tuple[list[dict], list[dict]]:
    """The paper's length split of questions: train on the shorter contexts, test on the longer.

    `panm_hf.splits.length_split` with questions sorted by the number of whitespace-separated
    words of their context (ties broken by the context text, then the id, so the split is
    deterministic) and grouped by context: the cut moves forward to the end of the current
    paragraph, so no context is in both parts.

    Args:
        examples: flat question records (as `load_squad_examples` returns).
        train_fraction: share of the questions used for training, in (0, 1) (paper: 0.8 or 0.5).

    Returns:
        `(train, test)`; every test context is at least as long as every training context.
    """
    return splits.length_split(
        examples,
        train_fraction,
        sort_key=lambda ex: (len(ex["context"].split()), ex["context"], ex["id"]),
        group=lambda ex: ex["context"],
    )


def _tokenize_windows(examples: dict, tokenizer, max_seq_length: int, doc_stride: int, pad_to_max_length: bool):
    pad_on_right = tokenizer.padding_side == "right"
    # Leading spaces in questions waste window room (run_qa strips them too).
    questions = [question.lstrip() for question in examples["question"]]
    contexts = examples["context"]
    _check_question_room(questions, examples.get("id"), tokenizer, max_seq_length, doc_stride)
    return tokenizer(
        questions if pad_on_right else contexts,
        contexts if pad_on_right else questions,
        truncation="only_second" if pad_on_right else "only_first",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )


def _check_question_room(questions, ids, tokenizer, max_seq_length: int, doc_stride: int) -> None:
    # The fast tokenizer fails with a bare Exception (batched: a Rust PanicException) when a window leaves
    # the context no more than doc_stride tokens; name the question and the flags instead.
    room = max_seq_length - tokenizer.num_special_tokens_to_add(pair=True) - doc_stride
    lengths = [len(token_ids) for token_ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    for index, length in enumerate(lengths):
        if length >= room:
            name = repr(ids[index]) if ids is not None else f"number {index}"
            raise ValueError(
                f"question {name} has {length} tokens, which leaves its context no more than doc_stride "
                f"({doc_stride}) tokens per window of max_seq_length ({max_seq_length}); raise --max_seq_length, "
                "lower --doc_stride or shorten the question."
            )


def prepare_train_features(
    examples: dict, tokenizer, max_seq_length: int = 384, doc_stride: int = 128, pad_to_max_length: bool = True
) -> dict:
    """Windows with `start_positions`/`end_positions` (a batched `datasets.map` function).

    A window that does not contain the (first) gold answer points both positions at the
    `[CLS]` token, as BERT's SQuAD recipe does.

    Args:
        examples: a batch of question records (columns `question`, `context`, `answers`).
        tokenizer: a fast tokenizer (offset mappings are required).
        max_seq_length: tokens per window, question included.
        doc_stride: overlap, in tokens, between consecutive windows of one context.
        pad_to_max_length: pad every window to `max_seq_length` (else pad per batch in the collator).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenizer must be a fast tokenizer (PreTrainedTokenizerFast): offset mappings are needed.")
    tokenized = _tokenize_windows(examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    offset_mapping = tokenized.pop("offset_mapping")
    context_index = 1 if tokenizer.padding_side == "right" else 0
    start_positions, end_positions = [], []
    for window, offsets in enumerate(offset_mapping):
        input_ids = tokenized["input_ids"][window]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        sequence_ids = tokenized.sequence_ids(window)
        answers = examples["answers"][sample_mapping[window]]
        if not answers["text"] or not answers["answer_start"]:
            question_id = examples["id"][sample_mapping[window]] if "id" in examples else sample_mapping[window]
            raise ValueError(
                f"question {question_id!r} has no gold answer (empty 'answers'); training windows need one. "
                "Drop unanswerable questions before windowing."
            )
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        context_tokens = [i for i, sequence_id in enumerate(sequence_ids) if sequence_id == context_index]
        first, last = context_tokens[0], context_tokens[-1]
        if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
            start_positions.append(cls_index)
            end_positions.append(cls_index)
            continue
        # First context token that starts after the answer start, minus one; likewise from the end.
        start = first
        while start <= last and offsets[start][0] <= start_char:
            start += 1
        end = last
        while end >= first and offsets[end][1] >= end_char:
            end -= 1
        start_positions.append(start - 1)
        end_positions.append(end + 1)
    tokenized["start_positions"] = start_positions
    tokenized["end_positions"] = end_positions
    return tokenized


def prepare_validation_features(
    examples: dict, tokenizer, max_seq_length: int = 384, doc_stride: int = 128, pad_to_max_length: bool = True
) -> dict:
    """Windows with `example_id` and an `offset_mapping` that is None outside the context.

    Args: as `prepare_train_features` (the batch needs an `id` column instead of `answers`).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenizer must be a fast tokenizer (PreTrainedTokenizerFast): offset mappings are needed.")
    tokenized = _tokenize_windows(examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    context_index = 1 if tokenizer.padding_side == "right" else 0
    tokenized["example_id"] = [examples["id"][sample] for sample in sample_mapping]
    tokenized["offset_mapping"] = [
        [offset if sequence_id == context_index else None for offset, sequence_id in zip(offsets, sequence_ids)]
        for offsets, sequence_ids in (
            (tokenized["offset_mapping"][window], tokenized.sequence_ids(window))
            for window in range(len(tokenized["input_ids"]))
        )
    ]
    return tokenized


def postprocess_qa_predictions(
    examples: Sequence[dict],
    features: Sequence[dict],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
) -> dict[str, str]:
    """One answer text per question from the windows' start/end logits (n-best search).

    For every window of a question, the `n_best_size` highest start and end logits are
    paired; a pair counts only if both tokens are context tokens (question, special and
    padding tokens have no offset), `end >= start` and the span has at most
    `max_answer_length` tokens. The best-scoring pair (start logit + end logit) over all
    windows gives the answer's character span in the context.

    Args:
        examples: question records with `id` and `context`.
        features: windows with `example_id` and `offset_mapping` (`prepare_validation_features`).
        start_logits, end_logits: `(num_windows, seq_len)`; rows may be padded past a window's length.
        n_best_size: start and end candidates tried per window.
        max_answer_length: longest answer, in tokens.

    Returns:
        question id -> answer text ("" when no valid span exists).
    """
    if len(features) != len(start_logits) or len(features) != len(end_logits):
        raise ValueError(
            f"Got {len(start_logits)} start and {len(end_logits)} end logit rows for {len(features)} features; "
            "pass the predictions of exactly these features, in order."
        )
    windows_by_example: dict[str, list[int]] = {}
    for window, feature in enumerate(features):
        windows_by_example.setdefault(feature["example_id"], []).append(window)
    predictions = {}
    for example in examples:
        context = example["context"]
        best_score, best_text = -np.inf, ""
        for window in windows_by_example.get(example["id"], []):
            offsets = features[window]["offset_mapping"]
            start_row, end_row = start_logits[window], end_logits[window]
            start_candidates = np.argsort(start_row)[::-1][:n_best_size]
            end_candidates = np.argsort(end_row)[::-1][:n_best_size]
            for start in start_candidates:
                for end in end_candidates:
                    if start >= len(offsets) or end >= len(offsets) or offsets[start] is None or offsets[end] is None:
                        continue
                    if end < start or end - start + 1 > max_answer_length:
                        continue
                    score = start_row[start] + end_row[end]
                    if score > best_score:
                        best_score = score
                        best_text = context[offsets[start][0] : offsets[end][1]]
        predictions[example["id"]] = best_text
    return predictions


__all__ = [
    "QA_FILE_SUFFIXES",
    "length_split",
    "load_qa_file",
    "load_squad_examples",
    "postprocess_qa_predictions",
    "prepare_train_features",
    "prepare_validation_features",
]
