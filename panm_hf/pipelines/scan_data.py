"""SCAN's length cut-off protocol, its word vocabulary and its scoring, shared by the SCAN and causal-LM examples.

The cut-off protocol of Newman et al. 2020 / Csordas et al. 2021 on SCAN's `tasks.txt`: commands whose action
sequence has at most L actions form the training range, a fixed 10% of it (NumPy `RandomState(1234)`, as
Csordas et al.'s `scan_length_resplit`) is held out as an i.i.d. set, and every longer command is the test set
(L = 22 is SCAN's standard length split). Scoring is greedy exact match overall and per target length, with
the EOS diagnosis of every wrong output: stopped early, ran late, or right length with wrong content.
"""

from __future__ import annotations

import argparse
import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
CUTOFFS = (22, 24, 25, 26, 27, 28, 30, 32, 33, 36, 40)  # the paper's Table 3
HELDOUT_SEED = 1234  # Csordas et al.'s scan_length_resplit
TASKS_FILE = "tasks.txt.gz"


@dataclass
class ScanSplit:
    """Commands and action sequences (space-separated words) of one set."""

    commands: list[str]
    actions: list[str]

    def subset(self, limit: int | None, seed: int) -> ScanSplit:
        if limit is None or limit >= len(self.commands):
            return self
        keep = np.sort(np.random.RandomState(seed).permutation(len(self.commands))[:limit])
        return ScanSplit([self.commands[i] for i in keep], [self.actions[i] for i in keep])


def diagnosis_parser(description: str) -> argparse.ArgumentParser:
    """The SCAN diagnosis scripts' shared command line (`examples/scan/`): the run folders `run_scan.py` wrote,
    `--data_dir` (SCAN's tasks file) and `--output` (a JSON file for the rows); each script adds its own flags."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders written by run_scan.py")
    parser.add_argument("--data_dir", type=Path, default=Path("../shared/data/scan"))
    parser.add_argument("--output", type=Path, default=None, help="write the rows to this JSON file")
    return parser


def read_tasks(path: Path) -> ScanSplit:
    """`IN: <command> OUT: <actions>` lines of SCAN's gzipped tasks file; ValueError naming a damaged line."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist; --data_dir must hold SCAN's {TASKS_FILE} (see shared/data/scan).")
    commands, actions = [], []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            head, sep, tail = line.strip().partition(" OUT: ")
            if not sep or not head.startswith("IN: "):
                raise ValueError(f"{path}, line {number}: expected 'IN: <command> OUT: <actions>', got {line!r}.")
            commands.append(head[len("IN: ") :])
            actions.append(tail)
    if not commands:
        raise ValueError(f"{path} holds no commands.")
    return ScanSplit(commands, actions)


def cutoff_split(tasks: ScanSplit, cutoff: int, heldout_fraction: float) -> tuple[ScanSplit, ScanSplit, ScanSplit]:
    """(train, i.i.d. held-out, test): at most `cutoff` actions train, 10% of them held out, longer ones test."""
    lengths = np.array([len(a.split()) for a in tasks.actions])  # (num_commands,)
    short, long = np.flatnonzero(lengths <= cutoff), np.flatnonzero(lengths > cutoff)
    if len(short) == 0 or len(long) == 0:
        raise ValueError(f"--cutoff {cutoff} leaves an empty training or test set; SCAN's outputs have 1-48 actions.")
    order = np.random.RandomState(HELDOUT_SEED).permutation(len(short))
    num_heldout = int(round(heldout_fraction * len(short)))
    heldout, train = np.sort(short[order[:num_heldout]]), np.sort(short[order[num_heldout:]])

    def pick(indices):
        return ScanSplit([tasks.commands[i] for i in indices], [tasks.actions[i] for i in indices])

    return pick(train), pick(heldout), pick(long)


def load_cutoff_split(data_dir: str | Path, cutoff: int, heldout_fraction: float = 0.1):
    """`cutoff_split` of `<data_dir>/tasks.txt.gz`: (train, i.i.d. held-out, test)."""
    return cutoff_split(read_tasks(Path(data_dir) / TASKS_FILE), cutoff, heldout_fraction)


def word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the words of `texts`; every sequence ends with `</s>`."""
    words = sorted({word for text in texts for word in text.split()})
    vocab = {token: index for index, token in enumerate([PAD, UNK, BOS, EOS, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS
    )


def score(predictions: list[str], split: ScanSplit) -> dict:
    """Exact match overall and per target length, and the EOS diagnosis of the wrong outputs."""
    target_lengths = [len(a.split()) for a in split.actions]
    predicted_lengths = [len(p.split()) for p in predictions]
    correct = [p == a for p, a in zip(predictions, split.actions)]
    outcome = Counter()
    by_length: dict[int, list] = {}
    for ok, predicted, target in zip(correct, predicted_lengths, target_lengths):
        outcome[
            "correct" if ok else "early" if predicted < target else "late" if predicted > target else "content"
        ] += 1
        by_length.setdefault(target, []).append((ok, predicted))
    total = len(predictions)
    return {
        "exact_match": 100.0 * sum(correct) / total,
        "num_examples": total,
        # share of all examples: right; stopped early; ran late; right length, wrong content
        "eos_diagnosis": {key: 100.0 * outcome[key] / total for key in ("correct", "early", "late", "content")},
        "per_length": {
            str(length): {
                "count": len(items),
                "exact_match": 100.0 * sum(ok for ok, _ in items) / len(items),
                "mean_predicted_length": float(np.mean([predicted for _, predicted in items])),
            }
            for length, items in sorted(by_length.items())
        },
    }
