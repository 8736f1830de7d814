"""SQuAD-format data for extractive QA: loading, the paper's length split, windows, answers.

Kept beside ``run_qa.py`` (as transformers keeps its ``utils_qa.py``); used by it,
``trainer_qa.py`` and the tests:

* ``load_squad_examples`` flattens the official nested JSON (plain or ``.gz``) into one
  record per question, in the column layout of the Hub's ``squad`` dataset.
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

import gzip
import json
import os
import zlib
from collections.abc import Sequence

import numpy as np

from panm_hf import splits


def load_squad_examples(path: str | os.PathLike) -> list[dict]:
    """Read an official SQuAD v1.1 JSON file (optionally gzipped) into flat question records.

    Args:
        path: `dev-v1.1.json`, `dev-v1.1.json.gz` or any file in that format.

    Returns:
        A list of `{"id", "title", "context", "question", "answers": {"text": [...],
        "answer_start": [...]}}` dicts in file order.

    Raises:
        ValueError: naming the file (and the question id) when the file is missing, unreadable
            (bad gzip, bad UTF-8, bad JSON), not in SQuAD layout, holds no question, or a
            question has no gold answer.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"data_file {path!r} does not exist; pass the path of a SQuAD-format JSON(.gz) file.")
    document = _read_json(path)
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"data_file {path!r} is not in SQuAD format: it has no top-level 'data' list.")
    examples = []
    for article_index, article in enumerate(data):
        where = f"data[{article_index}]"
        for paragraph_index, paragraph in enumerate(_squad_field(article, "paragraphs", list, path, where)):
            where = f"data[{article_index}].paragraphs[{paragraph_index}]"
            context = _squad_field(paragraph, "context", str, path, where)
            for qa in _squad_field(paragraph, "qas", list, path, where):
                examples.append(_question_record(qa, article, context, path, where))
    if not examples:
        raise ValueError(
            f"data_file {path!r} holds no questions (its 'data' list is empty or has no 'qas'); "
            "pass a SQuAD v1.1 file with at least one question."
        )
    return examples


def _read_json(path: str):
    # Damaged files raise with the file's name instead of a bare gzip/codec/JSON error.
    compressed = path.endswith(".gz")
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except UnicodeDecodeError as error:
        raise ValueError(f"data_file {path!r} is not valid UTF-8 ({error}); save it as UTF-8 JSON.") from error
    except json.JSONDecodeError as error:
        raise ValueError(
            f"data_file {path!r} is not valid JSON ({error}); check that the download or copy is complete."
        ) from error
    except (OSError, EOFError, zlib.error) as error:
        kind = "gzip file" if compressed else "file"
        raise ValueError(
            f"data_file {path!r} cannot be read as a {kind} ({error}); check that it is complete"
            + (" and really gzipped (or drop the .gz suffix)." if compressed else ".")
        ) from error


def _squad_field(record, name: str, kind: type, path: str, where: str):
    if not isinstance(record, dict) or not isinstance(record.get(name), kind):
        raise ValueError(
            f"data_file {path!r} is not in SQuAD format: {where} has no {kind.__name__} {name!r} "
            "(expected data/paragraphs/qas as in SQuAD v1.1)."
        )
    return record[name]


def _question_record(qa, article: dict, context: str, path: str, where: str) -> dict:
    question_id = qa.get("id") if isinstance(qa, dict) else None
    if question_id is None:
        raise ValueError(f"data_file {path!r}: a question in {where} has no 'id'; every SQuAD question needs one.")
    where = f"question {question_id!r} in {where}"
    question = _squad_field(qa, "question", str, path, where)
    answers = qa.get("answers")
    if not isinstance(answers, list) or not answers:
        raise ValueError(
            f"data_file {path!r}: {where} has no gold answer ('answers' is missing or empty); SQuAD v1.1 "
            "training and scoring need at least one. Drop the question (e.g. SQuAD v2's unanswerable ones)."
        )
    for answer in answers:
        if not (isinstance(answer, dict) and isinstance(answer.get("text"), str)
                and isinstance(answer.get("answer_start"), int)):  # fmt: skip
            raise ValueError(
                f"data_file {path!r}: {where} has an answer without a string 'text' and an integer "
                f"'answer_start' (got {answer!r})."
            )
    return {
        "id": question_id,
        "title": article.get("title", ""),
        "context": context,
        "question": question,
        "answers": {
            "text": [answer["text"] for answer in answers],
            "answer_start": [answer["answer_start"] for answer in answers],
        },
    }


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
    "length_split",
    "load_squad_examples",
    "postprocess_qa_predictions",
    "prepare_train_features",
    "prepare_validation_features",
]
