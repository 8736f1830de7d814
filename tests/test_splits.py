"""panm_hf.splits.length_split: the one length split behind the translation and QA examples."""

import pytest

from panm_hf.splits import length_split


def test_sorts_stably_and_cuts_at_the_fraction():
    words = ["a b c", "a", "x y", "a b c d e", "a b", "a b c d"]
    train, test = length_split(words, 0.5, sort_key=lambda s: len(s.split()))
    assert train == ["a", "x y", "a b"]  # equal lengths keep the data order
    assert test == ["a b c", "a b c d", "a b c d e"]


def test_a_group_never_straddles_the_cut():
    # (length, group): the cut after 2 items lands inside group "g2", so it moves to g2's end
    items = [(1, "g1"), (2, "g2"), (2, "g2"), (2, "g2"), (5, "g3"), (6, "g4")]
    train, test = length_split(items, 0.34, sort_key=lambda item: item, group=lambda item: item[1])
    assert train == items[:4] and test == items[4:]
    assert {g for _, g in train}.isdisjoint({g for _, g in test})


def test_at_least_one_training_sample_and_a_test_part_or_a_clear_error():
    train, test = length_split([3, 1, 2], 0.01, sort_key=lambda x: x)
    assert (train, test) == ([1], [2, 3])
    with pytest.raises(ValueError, match="leaves no test sample"):
        length_split([1, 1, 1], 0.5, sort_key=lambda x: x, group=lambda x: x)
    with pytest.raises(ValueError, match="train_fraction"):
        length_split([1, 2], 1.0, sort_key=lambda x: x)
