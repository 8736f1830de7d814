#!/usr/bin/env python
"""What the length split presents to a windowed BERT: the token length of every window, train vs test.

run_qa.py (like transformers' run_qa) cuts each question + context into windows of at most
`--max_seq_length` tokens with `--doc_stride` overlap. A test context longer than any training
context then reaches the model as several windows, each no longer than the longest training
window: the encoder and PANM's memory never see an input longer than in training. This script
measures that on the split run_qa.py uses (same loader, same split, same windowing).

    python examples/question_answering/window_lengths.py --data_file ../shared/data/squad/dev-v1.1.json.gz \
        --model_name_or_path <bert folder> --train_fraction 0.8 --max_seq_length 384
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from transformers import AutoTokenizer
from utils_qa import _tokenize_windows, length_split, load_squad_examples


def windows_with_owners(
    examples: list[dict], tokenizer, max_seq_length: int, doc_stride: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(lengths, owners)`, both `(windows,)`: every window's token count (padding excluded) and the index of
    the question it belongs to, windowed exactly as run_qa.py does."""
    batch = {"question": [example["question"] for example in examples],
             "context": [example["context"] for example in examples]}  # fmt: skip
    encoded = _tokenize_windows(batch, tokenizer, max_seq_length, doc_stride, pad_to_max_length=False)
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    return lengths, np.asarray(encoded["overflow_to_sample_mapping"])


def window_lengths(examples: list[dict], tokenizer, max_seq_length: int, doc_stride: int) -> np.ndarray:
    """Token count (padding excluded) of every window of `examples`, windowed exactly as run_qa.py does."""
    return windows_with_owners(examples, tokenizer, max_seq_length, doc_stride)[0]


def describe(lengths: np.ndarray, num_questions: int, max_seq_length: int) -> dict:
    return {
        "questions": num_questions,
        "windows": int(lengths.size),
        "windows_per_question": round(lengths.size / num_questions, 3),
        "token_length_percentiles_5_50_95_100": [int(np.percentile(lengths, q)) for q in (5, 50, 95, 100)],
        "share_of_windows_at_max_seq_length": round(float(np.mean(lengths == max_seq_length)), 4),
    }


def split_parser(description: str) -> argparse.ArgumentParser:
    """The flags that name a split and its windowing, as run_qa.py takes them (shared with length_buckets.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data_file", required=True)
    parser.add_argument("--model_name_or_path", required=True, help="a tokenizer folder or Hub id")
    parser.add_argument("--train_fraction", type=float, default=0.8)
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--doc_stride", type=int, default=128)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = split_parser(__doc__.split("\n")[0]).parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    train, test = length_split(load_squad_examples(args.data_file), args.train_fraction)
    report = {"train_fraction": args.train_fraction, "max_seq_length": args.max_seq_length}
    lengths = {}
    for name, examples in (("train", train), ("test", test)):
        lengths[name] = window_lengths(examples, tokenizer, args.max_seq_length, args.doc_stride)
        report[name] = describe(lengths[name], len(examples), args.max_seq_length)
    longest_train = int(lengths["train"].max())
    report["share_of_test_windows_longer_than_every_train_window"] = round(
        float(np.mean(lengths["test"] > longest_train)), 4
    )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
