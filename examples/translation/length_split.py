"""Multi30K loading and the paper's length split (Sec. 3.4, Fig. 3b).

All splits are pooled, sorted by source length, and cut at `split_ratio`: the model
trains on the shortest `split_ratio` of the pairs and is tested on the longest rest,
so every test sentence is at least as long as every training sentence.
"""

from __future__ import annotations

import gzip
import os
import random
import zlib
from dataclasses import dataclass

from panm_hf import splits

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")


@dataclass
class TranslationPairs:
    """Parallel sentences; `sources[i]` translates to `targets[i]`."""

    sources: list[str]
    targets: list[str]

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, indices: list[int]) -> TranslationPairs:
        return TranslationPairs([self.sources[i] for i in indices], [self.targets[i] for i in indices])


def _read_lines(path: str) -> list[str]:
    """The file's lines; ValueError naming the file when it is empty or damaged (bad gzip, bad UTF-8)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            lines = [line.rstrip("\n") for line in handle]
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not valid UTF-8 ({error}); Multi30K's files are UTF-8 text.") from error
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(
            f"{path} cannot be read ({error}); check that the file is complete (and gzipped if .gz)."
        ) from error
    if not lines:
        raise ValueError(f"{path} is empty; restore it from Multi30K (or remove the pair of files of that split).")
    return lines


def _find_file(data_dir: str, split: str, lang: str) -> str | None:
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    return None


def load_local_pairs(data_dir: str, source_lang: str, target_lang: str) -> TranslationPairs:
    """Pool every `{split}.{lang}[.gz]` pair of files in `data_dir` (Multi30K's raw layout)."""
    if not os.path.isdir(data_dir):
        raise ValueError(f"--data_dir {data_dir!r} is not a directory; point it at shared/data/multi30k.")
    sources, targets = [], []
    for split in MULTI30K_SPLITS:
        source_path = _find_file(data_dir, split, source_lang)
        target_path = _find_file(data_dir, split, target_lang)
        if source_path is None or target_path is None:
            continue
        split_sources, split_targets = _read_lines(source_path), _read_lines(target_path)
        if len(split_sources) != len(split_targets):
            raise ValueError(f"{source_path} and {target_path} have different numbers of lines.")
        sources += split_sources
        targets += split_targets
    if not sources:
        raise ValueError(
            f"No '{{split}}.{source_lang}[.gz]' / '{{split}}.{target_lang}[.gz]' files in --data_dir {data_dir!r} "
            f"(looked for splits {MULTI30K_SPLITS})."
        )
    return TranslationPairs(sources, targets)


def load_hub_pairs(dataset_name: str, config_name: str | None, source_lang: str, target_lang: str) -> TranslationPairs:
    """Pool all splits of a Hub dataset with `{lang}` columns or a `translation` dict column."""
    from datasets import load_dataset

    sources, targets = [], []
    for split in load_dataset(dataset_name, config_name).values():
        if "translation" in split.column_names:
            pairs = split["translation"]
            sources += [pair[source_lang] for pair in pairs]
            targets += [pair[target_lang] for pair in pairs]
        elif source_lang in split.column_names and target_lang in split.column_names:
            sources += split[source_lang]
            targets += split[target_lang]
        else:
            raise ValueError(
                f"--dataset_name {dataset_name!r} has columns {split.column_names}; expected "
                f"'{source_lang}'/'{target_lang}' or 'translation'."
            )
    return TranslationPairs(sources, targets)


def length_split(pairs: TranslationPairs, split_ratio: float) -> tuple[TranslationPairs, TranslationPairs]:
    """Sort by source length (whitespace tokens; ties keep data order) and cut at `split_ratio`
    (`panm_hf.splits.length_split`).

    Returns `(train, test)`: the shortest `split_ratio` of the pairs and the longest rest.
    """
    if not 0.0 < split_ratio < 1.0:
        raise ValueError(f"--split_ratio must lie strictly between 0 and 1 (got {split_ratio}); paper: 0.8, 0.5.")
    train, test = splits.length_split(range(len(pairs)), split_ratio, sort_key=lambda i: len(pairs.sources[i].split()))
    return pairs.subset(train), pairs.subset(test)


def hold_out(pairs: TranslationPairs, num_samples: int, seed: int) -> tuple[TranslationPairs, TranslationPairs]:
    """Split off a seeded random `num_samples` pairs: `(rest, held_out)`, both in the original order.

    The held-out pairs come from the training split's lengths, so their perplexity separates
    plain over-fitting from the length shift the test split measures.
    """
    if not 0 < num_samples < len(pairs):
        raise ValueError(
            f"--heldout_samples must lie between 1 and the training split's size minus 1 ({len(pairs) - 1}); "
            f"got {num_samples}."
        )
    chosen = set(random.Random(seed).sample(range(len(pairs)), num_samples))
    rest = [i for i in range(len(pairs)) if i not in chosen]
    return pairs.subset(rest), pairs.subset(sorted(chosen))


def sample(pairs: TranslationPairs, max_samples: int | None, seed: int) -> TranslationPairs:
    """A seeded random subset of at most `max_samples` pairs, in the original order."""
    if max_samples is None or max_samples >= len(pairs):
        return pairs
    indices = sorted(random.Random(seed).sample(range(len(pairs)), max_samples))
    return pairs.subset(indices)
