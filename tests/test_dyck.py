"""The Dyck-n generator and targets (research/dyck.py): balance, limits, the target on worked examples."""

from __future__ import annotations

import collections

import pytest
import torch

from research.dyck import (
    PAD,
    completion_counts,
    from_strings,
    make_dyck_batch,
    next_symbol_targets,
    sample_dyck,
    sequence_accuracy,
    to_strings,
)


def _reference_targets(text: str, num_pairs: int) -> list[list[float]]:
    """Suzgun et al.'s definition written with an explicit stack: after each symbol, all openers,
    plus the closer of the innermost open bracket."""
    vocabulary = "()[]{}<>"[: 2 * num_pairs]
    stack, rows = [], []
    for symbol in text:
        index = vocabulary.index(symbol)
        if index % 2 == 0:
            stack.append(index // 2)
        else:
            assert stack and stack.pop() == index // 2
        row = [1.0 if k % 2 == 0 else 0.0 for k in range(2 * num_pairs)]
        if stack:
            row[2 * stack[-1] + 1] = 1.0
        rows.append(row)
    return rows


def _balanced(text: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{", ">": "<"}, []
    for symbol in text:
        if symbol in pairs:
            if not stack or stack.pop() != pairs[symbol]:
                return False
        else:
            stack.append(symbol)
    return not stack


def _max_depth(text: str) -> int:
    depth = deepest = 0
    for symbol in text:
        depth += 1 if symbol in "([{<" else -1
        deepest = max(deepest, depth)
    return deepest


def test_targets_of_the_worked_example():
    # D2, "([])": after "(" -> ( ) [ ; after "([" -> ( [ ] ; after "([]" -> ( ) [ ; after "([])" -> ( [
    targets = next_symbol_targets(from_strings(["([])"]), num_pairs=2)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 0], [1, 0, 1, 0]], dtype=torch.float)
    assert torch.equal(targets[0], expected)


@pytest.mark.parametrize("num_pairs", [2, 3])
def test_targets_match_an_explicit_stack_and_padding_is_zero(num_pairs):
    generator = torch.Generator().manual_seed(3)
    lengths = torch.tensor([2, 8, 14, 30])
    batch = make_dyck_batch(lengths, num_pairs, generator=generator)
    for row, text in enumerate(to_strings(batch.tokens)):
        length = len(text)
        assert torch.equal(batch.targets[row, :length], torch.tensor(_reference_targets(text, num_pairs)))
        assert not batch.targets[row, length:].any() and not batch.mask[row, length:].any()
        assert batch.mask[row, :length].all()


@pytest.mark.parametrize("num_pairs", [1, 2, 3])
def test_every_string_is_balanced_with_its_requested_length(num_pairs):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 41, (300,), generator=generator) * 2
    tokens = sample_dyck(lengths, num_pairs, generator=generator)
    strings = to_strings(tokens)
    assert [len(s) for s in strings] == lengths.tolist()
    assert all(_balanced(s) for s in strings)
    assert set("".join(strings)) <= set("()[]{}"[: 2 * num_pairs])
    assert (tokens[torch.arange(tokens.shape[1]) >= lengths.unsqueeze(-1)] == PAD).all()


def test_depth_limit_holds_and_is_reached():
    generator = torch.Generator().manual_seed(1)
    strings = to_strings(sample_dyck(torch.full((400,), 40), 2, max_depth=3, generator=generator))
    depths = [_max_depth(s) for s in strings]
    assert max(depths) == 3 and all(_balanced(s) and len(s) == 40 for s in strings)


def test_shapes_are_uniform_and_every_type_appears():
    # The 5 Dyck-1 strings of length 6 are drawn about equally often (14,000 draws: about 2,800 each).
    generator = torch.Generator().manual_seed(2)
    counts = collections.Counter(to_strings(sample_dyck(torch.full((14_000,), 6), 1, generator=generator)))
    assert len(counts) == 5 and min(counts.values()) > 2_600 and max(counts.values()) < 3_000
    types = collections.Counter("".join(to_strings(sample_dyck(torch.full((200,), 10), 3, generator=generator))))
    assert all(types[symbol] > 150 for symbol in "([{")


def test_completion_counts_are_catalan_numbers_and_respect_the_depth_limit():
    counts = completion_counts(12, 6)
    assert counts[0::2, 0].tolist() == [1, 1, 2, 5, 14, 42, 132]  # C_0 .. C_6
    assert completion_counts(8, 1)[8, 0] == 1  # only ()()()()
    assert completion_counts(6, 2)[6, 0] == 4  # ((())) excluded


def test_same_seed_same_strings():
    lengths = torch.tensor([4, 10, 20])
    first = sample_dyck(lengths, 2, generator=torch.Generator().manual_seed(7))
    again = sample_dyck(lengths, 2, generator=torch.Generator().manual_seed(7))
    other = sample_dyck(lengths, 2, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="even integer"):
        sample_dyck(torch.tensor([3]), 2)
    with pytest.raises(ValueError, match="num_pairs"):
        sample_dyck(torch.tensor([4]), 0)
    with pytest.raises(ValueError, match="position 2"):
        next_symbol_targets(from_strings(["([)]"]), 2)
    with pytest.raises(ValueError, match="position 0"):
        next_symbol_targets(from_strings([")("]), 2)
    with pytest.raises(ValueError, match="not a bracket"):
        from_strings(["(a)"])


def test_sequence_accuracy_needs_every_output_right():
    targets = next_symbol_targets(from_strings(["()", "[]"]), 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    logits = targets * 8 - 4  # exactly right
    assert sequence_accuracy(logits, targets, mask).tolist() == [True, True]
    logits[1, 0, 3] = -logits[1, 0, 3]  # one wrong bit in row 1
    assert sequence_accuracy(logits, targets, mask).tolist() == [True, False]
    mask[1, 0] = False  # a padded step does not count
    assert sequence_accuracy(logits, targets, mask).tolist() == [True, True]
