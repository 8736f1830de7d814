"""Tests for the PANM algorithmic-reasoning task generators."""

from __future__ import annotations

import pytest
import torch

from research import (
    END_FEATURE,
    EXTRA_FEATURE,
    NUM_TOKENS,
    START_FEATURE,
    TASKS,
    AlgorithmicBatch,
    copy_targets,
    drecall_targets,
    idsort_targets,
    make_batch,
    mix_targets,
    psort_targets,
    random_pairing,
    reverse_targets,
    symbols_to_tokens,
    task_spec,
    tokens_to_symbols,
)


def _seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _one(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([tokens]), torch.tensor([len(tokens)])


def _lengths(batch: AlgorithmicBatch) -> torch.Tensor:
    return (batch.input_tokens != -100).sum(dim=1)  # (batch,)


# --------------------------------------------------------------------------- hand-checked rules


def test_symbols_roundtrip() -> None:
    assert symbols_to_tokens("~!@#$%^&*(") == list(range(10))
    assert symbols_to_tokens("$( %") == [4, 9, 5]
    assert tokens_to_symbols(torch.tensor([4, 5, -100])) == "$%"
    with pytest.raises(ValueError, match="text"):
        symbols_to_tokens("abc")


def test_copy_hand_example() -> None:
    tokens = torch.tensor([[3, 1, 4], [5, 9, -100]])
    lengths = torch.tensor([3, 2])
    assert copy_targets(tokens, lengths).tolist() == [[3, 1, 4], [5, 9, -100]]


def test_reverse_matches_paper_example() -> None:
    tokens, lengths = _one(symbols_to_tokens("$%&&$%^@%#"))
    assert tokens_to_symbols(reverse_targets(tokens, lengths)[0]) == "#%@^%$&&%$"
    padded = torch.tensor([[3, 1, 4], [5, 9, -100]])
    assert reverse_targets(padded, torch.tensor([3, 2])).tolist() == [[4, 1, 3], [9, 5, -100]]


def test_mix_follows_paper_text_on_its_example() -> None:
    # The text's rule on the Chat-GPT table's input: x_1 = x_5 = '$', so every step is '$'
    # (the table's "true output" $%$&$%$@$# copies x_t at even steps; see mix_targets).
    tokens, lengths = _one(symbols_to_tokens("$%&&$%^@%#"))
    assert tokens_to_symbols(mix_targets(tokens, lengths)[0]) == "$$$$$$$$$$"


def test_mix_worked_example_middle_on_odd_steps_first_on_even() -> None:
    # x_1 != x_ceil(L/2) and no x_t repeats them, so each branch is pinned: odd t -> middle, even t -> x_1.
    tokens = torch.tensor([[3, 1, 4, 1, 5], [7, 2, 8, 6, -100]])
    lengths = torch.tensor([5, 4])
    assert mix_targets(tokens, lengths).tolist() == [[4, 3, 4, 3, 4], [2, 7, 2, 7, -100]]
    # At L = 20 (2(L+1)) the middle is x_10: y = x_10 x_1 x_10 x_1 ...
    long = torch.arange(20).remainder(10).unsqueeze(0)  # x_t = (t-1) mod 10
    assert mix_targets(long, torch.tensor([20]))[0].tolist() == [9, 0] * 10


def test_drecall_matches_paper_example() -> None:
    tokens, lengths = _one(symbols_to_tokens("$(&&$#^@%#"))
    query_index = torch.tensor([8])  # the only '%'; L = 10 is even: start at its left neighbour '@'
    labels = drecall_targets(tokens, lengths, query_index)
    assert tokens_to_symbols(labels[0]) == "@%#"
    assert labels[0, 3:].tolist() == [-100] * 7


def test_drecall_worked_examples_odd_right_even_left() -> None:
    tokens, lengths = _one([3, 1, 4, 1, 5])  # L = 5, odd: query 4 (x_3) -> x_4 x_5
    assert drecall_targets(tokens, lengths, torch.tensor([2])).tolist() == [[1, 5, -100, -100, -100]]
    tokens, lengths = _one([2, 7, 1, 8])  # L = 4, even: query 1 (x_3) -> x_2 x_3 x_4
    assert drecall_targets(tokens, lengths, torch.tensor([2])).tolist() == [[7, 1, 8, -100]]
    padded = torch.tensor([[3, 1, 4], [5, 9, -100]])  # odd L = 3 query x_1; even L = 2 query x_2
    labels = drecall_targets(padded, torch.tensor([3, 2]), torch.tensor([0, 1]))
    assert labels.tolist() == [[1, 4, -100], [5, 9, -100]]


def test_psort_worked_example() -> None:
    tokens = torch.tensor([[3, 1, 4], [5, 9, -100]])
    scores = torch.tensor([[0.5, -1.2, 0.1], [2.0, 1.0, -9.0]])
    labels = psort_targets(tokens, torch.tensor([3, 2]), scores)
    assert labels.tolist() == [[1, 4, 3], [9, 5, -100]]


def test_idsort_paper_example() -> None:
    tokens, lengths = _one([3, 1, 4, 1])
    partner = torch.tensor([[3, 2, 1, 0]])  # x1<->x4, x2<->x3  =>  y = x4 x3 x2 x1
    assert idsort_targets(tokens, lengths, partner).tolist() == [[1, 4, 1, 3]]


@pytest.mark.parametrize("length", [1, 2, 5, 8, 9])
def test_random_pairing_is_involution(length: int) -> None:
    lengths = torch.tensor([length, max(1, length - 1)])
    partner, pair_id = random_pairing(lengths, 9, _seeded(length))
    for row, n in enumerate(lengths.tolist()):
        p = partner[row, :n]
        assert sorted(p.tolist()) == list(range(n))
        assert torch.equal(p[p], torch.arange(n))  # partner of partner is self
        fixed = int((p == torch.arange(n)).sum())
        assert fixed == n % 2  # exactly one unpaired token iff n is odd
        assert torch.equal(pair_id[row, :n], pair_id[row, p])
        assert len(set(pair_id[row, :n].tolist())) == (n + 1) // 2


# --------------------------------------------------------------------------- make_batch


def test_copy_batch_hand_decoded() -> None:
    batch = make_batch("copy", 2, 3, generator=_seeded(5))
    tokens = batch.input_tokens
    assert batch.inputs.shape == (2, 5, 12)
    assert batch.inputs.dtype == torch.float32
    assert batch.attention_mask.dtype == torch.long
    assert torch.equal(batch.labels, tokens)
    expected = torch.zeros(2, 5, 12)
    expected[:, 0, START_FEATURE] = 1.0
    expected[:, 4, END_FEATURE] = 1.0
    for row in range(2):
        for k in range(3):
            expected[row, k + 1, int(tokens[row, k])] = 1.0
    assert torch.equal(batch.inputs, expected)
    assert batch.attention_mask.tolist() == [[1] * 5, [1] * 5]


def test_copy_reversed_equals_reverse_same_seed() -> None:
    for length in (7, (2, 9)):
        copy = make_batch("copy", 16, length, generator=_seeded(3))
        rev = make_batch("reverse", 16, length, generator=_seeded(3))
        assert torch.equal(copy.input_tokens, rev.input_tokens)
        assert torch.equal(copy.inputs, rev.inputs)
        for row, n in enumerate(_lengths(copy).tolist()):
            assert torch.equal(copy.labels[row, :n].flip(0), rev.labels[row, :n])
    assert not torch.equal(copy.labels, rev.labels)


def test_mix_batch_follows_rule() -> None:
    batch = make_batch("mix", 32, (1, 12), generator=_seeded(4))
    for row, n in enumerate(_lengths(batch).tolist()):
        x = batch.input_tokens[row].tolist()
        expected = [x[(n + 1) // 2 - 1] if t % 2 == 1 else x[0] for t in range(1, n + 1)]
        assert batch.labels[row, :n].tolist() == expected


def test_drecall_batch_query_unique_and_answer() -> None:
    batch = make_batch("drecall", 64, (2, 20), generator=_seeded(6))
    lengths = _lengths(batch) - 1  # input_tokens also holds the query
    assert batch.labels.shape == (64, 20)
    assert batch.inputs.shape == (64, 23, 13)
    for row, n in enumerate(lengths.tolist()):
        x = batch.input_tokens[row, :n].tolist()
        query = int(batch.input_tokens[row, n])
        assert x.count(query) == 1
        j = x.index(query)
        start = j - 1 if n % 2 == 0 else j + 1
        assert 0 <= start < n
        target = batch.labels[row].tolist()
        assert target == x[start:] + [-100] * (20 - (n - start))
        # The query slot (after the tokens, before END) carries the token and the flag.
        query_slot = batch.inputs[row, n + 1]
        assert int(query_slot[:NUM_TOKENS].argmax()) == query
        assert query_slot[EXTRA_FEATURE] == 1.0
        assert batch.inputs[row, :, EXTRA_FEATURE].sum() == 1.0
        assert batch.inputs[row, n + 2, END_FEATURE] == 1.0
        assert batch.attention_mask[row].sum() == n + 3


def test_drecall_length_two_is_well_defined() -> None:
    batch = make_batch("drecall", 50, 2, generator=_seeded(0))
    x = batch.input_tokens
    assert torch.equal(x[:, 2], x[:, 1])  # even length: query is the 2nd token, target x_1 x_2
    assert torch.equal(batch.labels, x[:, :2])
    assert bool((x[:, 0] != x[:, 1]).all())


def test_psort_labels_sorted_by_score_features() -> None:
    batch = make_batch("psort", 32, (1, 11), generator=_seeded(8))
    scores_seen = False
    for row, n in enumerate(_lengths(batch).tolist()):
        slots = batch.inputs[row, 1 : n + 1]
        scores = slots[:, EXTRA_FEATURE]
        tokens = slots[:, :NUM_TOKENS].argmax(dim=1)
        assert torch.equal(tokens, batch.input_tokens[row, :n])
        expected = tokens[torch.argsort(scores)]
        assert torch.equal(batch.labels[row, :n], expected)
        assert bool((batch.inputs[row, n + 1 :, EXTRA_FEATURE] == 0).all())
        scores_seen = scores_seen or bool((scores != 0).all())
    assert scores_seen


def test_idsort_label_source_shares_id() -> None:
    id_dim = 4
    batch = make_batch("idsort", 24, (1, 11), generator=_seeded(9), id_dim=id_dim)
    assert batch.inputs.shape == (24, 13, 12 + id_dim)
    for row, n in enumerate(_lengths(batch).tolist()):
        ids = batch.inputs[row, 1 : n + 1, EXTRA_FEATURE:]  # (n, id_dim)
        same = (torch.cdist(ids, ids) < 1e-6).long()  # (n, n)
        counts = same.sum(dim=1)
        assert int((counts == 1).sum()) == n % 2  # one unpaired token iff n is odd
        assert bool(((counts == 1) | (counts == 2)).all())
        eye = torch.eye(n, dtype=torch.long)
        source = torch.where(counts == 1, torch.arange(n), (same - eye).argmax(dim=1))
        assert torch.equal(batch.labels[row, :n], batch.input_tokens[row, source])


def test_idsort_not_identity() -> None:
    batch = make_batch("idsort", 16, 10, generator=_seeded(1))
    assert not torch.equal(batch.labels, batch.input_tokens)


def test_tuple_lengths_mask_and_padding() -> None:
    for task in TASKS:
        lo, hi = (2, 7)
        batch = make_batch(task, 40, (lo, hi), generator=_seeded(11))
        extra = 1 if task == "drecall" else 0
        lengths = _lengths(batch) - extra
        assert int(lengths.min()) >= lo and int(lengths.max()) <= hi
        assert len(set(lengths.tolist())) > 1
        assert batch.inputs.shape[1] == hi + 2 + extra
        slots = torch.arange(hi + 2 + extra)
        expected_mask = (slots.unsqueeze(0) <= (lengths + 1 + extra).unsqueeze(1)).long()
        assert torch.equal(batch.attention_mask, expected_mask)
        padding = batch.attention_mask == 0
        assert bool((batch.inputs[padding] == 0).all())
        rows = torch.arange(40)
        assert bool((batch.inputs[rows, lengths + 1 + extra, END_FEATURE] == 1).all())
        assert batch.inputs[:, :, END_FEATURE].sum() == 40
        assert bool((batch.inputs[:, 0, START_FEATURE] == 1).all())
        steps = torch.arange(hi)
        target_lengths = lengths
        if task == "drecall":  # the target runs from the query's neighbour to x_L
            query_index = (batch.input_tokens[:, :hi] == batch.input_tokens[rows, lengths].unsqueeze(1)).long()
            start = query_index.argmax(dim=1) + torch.where(lengths % 2 == 0, -1, 1)  # (batch,)
            target_lengths = lengths - start
        pad_steps = steps.unsqueeze(0) >= target_lengths.unsqueeze(1)
        assert batch.labels.shape == (40, hi)
        assert bool((batch.labels[pad_steps] == -100).all())
        assert bool((batch.labels[~pad_steps] >= 0).all())
        assert bool((batch.input_tokens[:, :lo] >= 0).all())


def test_same_seed_same_batch_different_seed_differs() -> None:
    for task in TASKS:
        a = make_batch(task, 8, (2, 10), generator=_seeded(21))
        b = make_batch(task, 8, (2, 10), generator=_seeded(21))
        c = make_batch(task, 8, (2, 10), generator=_seeded(22))
        for name in ("inputs", "attention_mask", "labels", "input_tokens"):
            assert torch.equal(getattr(a, name), getattr(b, name))
        assert not torch.equal(a.inputs, c.inputs)


def test_unknown_task_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match="task.*copy"):
        task_spec("sort")
    with pytest.raises(ValueError, match="task.*idsort"):
        make_batch("sort", 2, 3)
    with pytest.raises(ValueError, match="length"):
        make_batch("copy", 2, (5, 3))
    with pytest.raises(ValueError, match="length"):
        make_batch("drecall", 2, 1)
    with pytest.raises(ValueError, match="length"):
        make_batch("copy", 2, True)
    with pytest.raises(ValueError, match="length"):
        make_batch("copy", 2, (5,))
    with pytest.raises(ValueError, match="batch_size"):
        make_batch("copy", 0, 3)
    with pytest.raises(ValueError, match="id_dim"):
        make_batch("idsort", 2, 3, id_dim=0)


def test_task_specs_match_paper() -> None:
    assert task_spec("copy").test_lengths == (9, 10, 20, 40, 80)
    assert task_spec("drecall").train_length == 9
    assert task_spec("psort").test_lengths == (10, 11, 21, 41, 81)
    assert task_spec("idsort", id_dim=5).feature_dim == 17
    assert task_spec("drecall").train_length_range == (2, 9)
    assert task_spec("mix").train_length_range == (1, 9)


@pytest.mark.parametrize("task", TASKS)
def test_shapes_for_every_test_length(task: str) -> None:
    spec = task_spec(task)
    extra = 1 if task == "drecall" else 0
    for length in spec.test_lengths:
        batch = make_batch(task, 2, length, generator=_seeded(length))
        assert batch.inputs.shape == (2, length + 2 + extra, spec.feature_dim)
        assert batch.attention_mask.shape == (2, length + 2 + extra)
        assert bool((batch.attention_mask == 1).all())
        assert batch.labels.shape == (2, length)
        assert batch.input_tokens.shape == (2, length + extra)
        real = batch.labels != -100
        assert bool((batch.labels[real] < NUM_TOKENS).all()) and bool((batch.labels[real] >= 0).all())
        assert bool(real.all()) if task != "drecall" else bool(real[:, 0].all())


def test_device_argument_moves_every_tensor() -> None:
    batch = make_batch("psort", 2, 4, generator=_seeded(0), device="cpu")
    same = make_batch("psort", 2, 4, generator=_seeded(0))
    assert torch.equal(batch.inputs, same.inputs)
    moved = batch.to("meta")
    assert {t.device.type for t in (moved.inputs, moved.labels, moved.input_tokens)} == {"meta"}
    assert moved.attention_mask.device.type == "meta"


def test_mix_table_rule_diagnostic_copies_x_t_on_even_steps() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "length_generalization" / "mix_table_rule.py"
    spec = importlib.util.spec_from_file_location("mix_table_rule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tokens, lengths = _one([3, 1, 4, 1, 5])
    assert module.table_rule_targets(tokens, lengths).tolist() == [[4, 1, 4, 1, 4]]
    tokens, lengths = _one(symbols_to_tokens("$%&&$%^@%#"))  # the paper's Chat-GPT table row
    assert tokens_to_symbols(module.table_rule_targets(tokens, lengths)[0]) == "$%$&$%$@$#"
