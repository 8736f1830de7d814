#!/usr/bin/env python
"""EM and F1 of run_qa.py's predictions by test-question length: where does a model gain or lose?

The length split's test set mixes questions whose windows all fit inside the training range with
questions that have a window longer than every training window (window_lengths.py counts them).
Only the second kind asks a windowed encoder to extrapolate. This script scores each model's
`predictions.json` (written by run_qa.py under `<output_dir>/<model>/`) on the two kinds apart,
and on quantiles of context length in words, so a gain can be placed.

    python examples/question_answering/length_buckets.py --data_file ../shared/data/squad/dev-v1.1.json.gz \
        --model_name_or_path <bert folder> --train_fraction 0.5 --max_seq_length 256 --doc_stride 96 \
        --predictions bert=runs/qa/bert/predictions.json panm=runs/qa/panm/predictions.json
"""

from __future__ import annotations

import json

import numpy as np
from squad_metric import squad_scores
from transformers import AutoTokenizer
from utils_qa import length_split, load_squad_examples
from window_lengths import split_parser, window_lengths, windows_with_owners


def longest_window(examples: list[dict], tokenizer, max_seq_length: int, doc_stride: int) -> np.ndarray:
    """Per question, the token count of its longest window, windowed exactly as run_qa.py does."""
    lengths, owners = windows_with_owners(examples, tokenizer, max_seq_length, doc_stride)  # (windows,) each
    longest = np.zeros(len(examples), dtype=np.int64)  # (questions,)
    np.maximum.at(longest, owners, lengths)
    return longest


def read_predictions(specs: list[str]) -> dict[str, dict[str, str]]:
    """`name=path` pairs -> {name: {question id: answer text}}."""
    predictions = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(
                f"--predictions takes name=path pairs (e.g. bert=runs/qa/bert/predictions.json); got {spec!r}."
            )
        if name in predictions:
            raise ValueError(f"--predictions names {name!r} twice; give each run its own name.")
        try:
            with open(path, encoding="utf-8") as handle:
                answers = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(
                f"--predictions {spec!r}: cannot read {path} as JSON ({error}); pass run_qa's "
                "<output_dir>/<model>/predictions.json."
            ) from error
        if not isinstance(answers, dict) or not all(isinstance(text, str) for text in answers.values()):
            raise ValueError(
                f"--predictions {spec!r}: {path} must map question ids to answer strings, "
                "as run_qa's predictions.json does."
            )
        predictions[name] = answers
    ids = [set(answers) for answers in predictions.values()]
    if any(other != ids[0] for other in ids[1:]):
        raise ValueError(
            "--predictions files answer different questions; compare runs of the same split, seed "
            "and --max_eval_samples."
        )
    return predictions


def score_buckets(buckets: dict[str, list[dict]], predictions: dict[str, dict[str, str]]) -> dict:
    """{bucket: {"questions": n, model: {"exact_match", "f1"}}} over each bucket's questions."""
    report = {}
    for bucket, examples in buckets.items():
        references = {example["id"]: example["answers"]["text"] for example in examples}
        entry = {"questions": len(examples)}
        if references:
            for name, answers in predictions.items():
                entry[name] = {key: round(value, 2) for key, value in squad_scores(answers, references).items()}
        report[bucket] = entry
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = split_parser(__doc__.split("\n")[0])
    parser.add_argument("--predictions", nargs="+", required=True, help="name=path of run_qa's predictions.json")
    parser.add_argument("--num_quantiles", type=int, default=4, help="context-length buckets (in words)")
    parser.add_argument("--output_file", default=None, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
    if args.num_quantiles < 1:
        raise ValueError(f"--num_quantiles must be at least 1 (got {args.num_quantiles}).")

    predictions = read_predictions(args.predictions)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    train, test = length_split(load_squad_examples(args.data_file), args.train_fraction)
    answered = set(next(iter(predictions.values())))
    test = [example for example in test if example["id"] in answered]
    if len(test) != len(answered):
        raise ValueError(
            "some predicted question ids are not in this split's test set; use the run's "
            "--data_file and --train_fraction."
        )

    longest_train = int(window_lengths(train, tokenizer, args.max_seq_length, args.doc_stride).max())
    longest_test = longest_window(test, tokenizer, args.max_seq_length, args.doc_stride)
    beyond = longest_test > longest_train  # (questions,) True where a window is longer than every training one
    buckets = {
        "all windows within the training range": [ex for ex, out in zip(test, beyond) if not out],
        "a window longer than every training window": [ex for ex, out in zip(test, beyond) if out],
    }
    words = np.array([len(example["context"].split()) for example in test])
    edges = np.quantile(words, np.linspace(0.0, 1.0, args.num_quantiles + 1))
    which = np.clip(np.searchsorted(edges, words, side="right") - 1, 0, args.num_quantiles - 1)
    for quantile in range(args.num_quantiles):  # tied word counts can leave a quantile empty: skipped
        inside = which == quantile  # (questions,)
        if inside.any():
            members = [example for example, keep in zip(test, inside) if keep]
            buckets[f"context words {words[inside].min()}-{words[inside].max()}"] = members

    report = {
        "train_fraction": args.train_fraction, "max_seq_length": args.max_seq_length,
        "doc_stride": args.doc_stride, "longest_training_window": longest_train,
        "all questions": score_buckets({"all": test}, predictions)["all"],
        "buckets": score_buckets(buckets, predictions),
    }  # fmt: skip
    print(json.dumps(report, indent=2))
    if args.output_file:
        with open(args.output_file, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return report


if __name__ == "__main__":
    main()
