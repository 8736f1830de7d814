"""Synthetic algorithmic-reasoning tasks of the PANM paper (Sec. 3.1 and Appendix).

Six seeded, fully vectorised batch generators over the tokens ``0..9``:
``copy``, ``reverse``, ``mix`` (content-free) and ``drecall`` (Dynamic Recall),
``psort`` (Priority Sort), ``idsort`` (ID Sort) (content-based). The paper writes
tokens as the symbols ``~!@#$%^&*(`` for ``0..9`` (see :data:`PAPER_SYMBOLS`).

Slot layout (one feature vector per memory slot, right-padded)::

    slot 0            START delimiter
    slots 1 .. L      the L input tokens x_1 .. x_L
    slot L + 1        drecall only: the QUERY slot
    next slot         END delimiter
    remaining slots   padding: all-zero features, attention_mask 0

So a sample of ``L`` tokens uses ``L + 2`` slots (``L + 3`` for drecall), and a
batch has ``hi + 2`` (``hi + 3``) slots where ``hi`` is the longest requested length.

Feature layout (``feature_dim`` columns)::

    [0:10]   one-hot token (token slots, and the drecall query slot)
    [10]     START flag (1 on slot 0)
    [11]     END flag (1 on the END slot)
    [12]     drecall: QUERY flag (1 on the query slot only)
    [12]     psort:   priority score ~ N(0, 1) (token slots only)
    [12:12+id_dim]  idsort: id vector ~ N(0, I), shared by the two tokens of a pair

``feature_dim`` is 12 for copy/reverse/mix, 13 for drecall/psort and
``12 + id_dim`` for idsort. ``input_tokens[:, k]`` is the token shown in slot
``k + 1`` (for drecall the query token therefore sits at ``input_tokens[i, L_i]``);
padding is ``-100``. ``labels`` are token ids, ``-100`` where padded; they have
``hi`` steps for every task (drecall's target is shorter than its input: from the query's
neighbour to ``x_L``, see :func:`drecall_targets`).

Randomness is drawn in a fixed order (lengths if ``length`` is a tuple, then tokens,
then task extras) from the given ``torch.Generator``, so one seed gives one batch and
``copy``/``reverse``/``mix`` with the same seed see the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TASKS = ("copy", "reverse", "mix", "drecall", "psort", "idsort")

NUM_TOKENS = 10
START_FEATURE = 10
END_FEATURE = 11
EXTRA_FEATURE = 12
BASE_FEATURE_DIM = 12
PAD_LABEL = -100
PAPER_SYMBOLS = "~!@#$%^&*("

_TRAIN_LENGTH = {"copy": 9, "reverse": 9, "mix": 9, "drecall": 9, "psort": 10, "idsort": 10}
# Result tables of the paper: L, L+1 and three longer lengths (80 and 81 are the 8x modes).
_TEST_LENGTHS = {
    9: (9, 10, 20, 40, 80),
    10: (10, 11, 21, 41, 81),
}
_MIN_LENGTH = {"drecall": 2}


@dataclass
class AlgorithmicBatch:
    """One batch of an algorithmic task.

    Args:
        inputs: `(batch, input_slots, feature_dim)` float32 slot features.
        attention_mask: `(batch, input_slots)` long, 1 = real slot, 0 = right padding.
        labels: `(batch, target_steps)` long token ids 0..9, -100 where padded.
        input_tokens: `(batch, num_tokens)` long raw tokens shown in slots 1.., -100 padding.
    """

    inputs: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    input_tokens: torch.Tensor

    def to(self, device: torch.device | str) -> AlgorithmicBatch:
        """Return a copy of the batch with every tensor moved to `device`."""
        return AlgorithmicBatch(
            inputs=self.inputs.to(device),
            attention_mask=self.attention_mask.to(device),
            labels=self.labels.to(device),
            input_tokens=self.input_tokens.to(device),
        )


@dataclass(frozen=True)
class TaskSpec:
    """Paper settings of one task.

    Args:
        name: task name, one of `TASKS`.
        train_length: `L`; training sequences have 1..L tokens (2..L for drecall).
        test_lengths: the paper's five test lengths as in its result tables:
            `(9, 10, 20, 40, 80)` for L = 9 and `(10, 11, 21, 41, 81)` for L = 10.
        feature_dim: width of the slot features produced by `make_batch`.
    """

    name: str
    train_length: int
    test_lengths: tuple[int, ...]
    feature_dim: int

    @property
    def min_length(self) -> int:
        """Smallest supported number of tokens (drecall needs a neighbour of the query)."""
        return _MIN_LENGTH.get(self.name, 1)

    @property
    def train_length_range(self) -> tuple[int, int]:
        """`(min_length, train_length)`, usable directly as `make_batch(length=...)`."""
        return (self.min_length, self.train_length)


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"Unknown task={task!r}; pass one of TASKS={TASKS}.")
    return task


def _feature_dim(task: str, id_dim: int) -> int:
    if task in ("drecall", "psort"):
        return BASE_FEATURE_DIM + 1
    if task == "idsort":
        return BASE_FEATURE_DIM + id_dim
    return BASE_FEATURE_DIM


def task_spec(name: str, *, id_dim: int = 8) -> TaskSpec:
    """Paper settings (train length, five test lengths, feature width) of a task.

    Args:
        name: one of `TASKS`.
        id_dim: id-vector width, only used for the feature width of `"idsort"`.

    Returns:
        The task's `TaskSpec`.
    """
    _check_task(name)
    if id_dim < 1:
        raise ValueError(f"id_dim must be >= 1, got id_dim={id_dim}; pass a positive width.")
    length = _TRAIN_LENGTH[name]
    return TaskSpec(name, length, _TEST_LENGTHS[length], _feature_dim(name, id_dim))


def symbols_to_tokens(text: str) -> list[int]:
    """Map the paper's symbols `~!@#$%^&*(` to tokens 0..9 (spaces are ignored)."""
    bad = [c for c in text if c not in PAPER_SYMBOLS and not c.isspace()]
    if bad:
        raise ValueError(
            f"text={text!r} has symbols {bad} outside PAPER_SYMBOLS={PAPER_SYMBOLS!r}."
        )
    return [PAPER_SYMBOLS.index(c) for c in text if not c.isspace()]


def tokens_to_symbols(tokens: list[int] | torch.Tensor) -> str:
    """Inverse of `symbols_to_tokens`; padding (`-100`) is dropped."""
    values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return "".join(PAPER_SYMBOLS[t] for t in values if t != PAD_LABEL)


# ---------------------------------------------------------------------------
# Target rules. All take `tokens` (batch, max_len) with -100 padding and
# `lengths` (batch,) and return labels with -100 beyond each sample's length.
# ---------------------------------------------------------------------------


def _valid(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    return steps.unsqueeze(0) < lengths.unsqueeze(1)  # (batch, max_len)


def _gather_tokens(
    tokens: torch.Tensor, lengths: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    valid = _valid(tokens, lengths)  # (batch, max_len)
    safe = torch.where(valid, index, torch.zeros_like(index))  # (batch, max_len)
    out = tokens.gather(1, safe)  # (batch, max_len)
    return out.masked_fill(~valid, PAD_LABEL)


def copy_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Copy: `y_t = x_t`.

    Example: `x = 3 1 4` -> `y = 3 1 4`.

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.

    Returns:
        `(batch, max_len)` labels.
    """
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    return _gather_tokens(tokens, lengths, steps.expand_as(tokens))  # (batch, max_len)


def reverse_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse: `y_t = x_{L+1-t}` (each sample reversed within its own length).

    Example: `x = 3 1 4` -> `y = 4 1 3`; paper: `$%&&$%^@%#` -> `#%@^%$&&%$`.

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.

    Returns:
        `(batch, max_len)` labels.
    """
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    index = lengths.unsqueeze(1) - 1 - steps.unsqueeze(0)  # (batch, max_len)
    return _gather_tokens(tokens, lengths, index)


def mix_targets(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mix (1-based t): odd `t` -> `y_t = x_{ceil(L/2)}`; even `t` -> `y_t = x_1`; `L` output steps.

    This is the rule of the paper's text (Sec. 3.1: "if t is odd, y_t = x_{ceil(L/2)}; if t is
    even, y_t = x_1"; the appendix adds nothing on Mix). The worked example of the paper's
    Chat-GPT table contradicts its even branch::

        x = $ % & & $ % ^ @ % #   (L = 10, x_1 = x_5 = $)
        y = $ % $ & $ % $ @ $ #   (the table's "true output": even steps x_t)
        y = $ $ $ $ $ $ $ $ $ $   (the text's rule)

    We follow the text, because the paper's own Mix table only fits it: PANM scores
    100 / 100 / 98 / 54 / 54 at L .. 8(L+1), a floor of 54 at 4(L+1) and 8(L+1) = the even half
    (x_1, which no length moves) right plus a few odd steps; under the table's reading the even
    half is a Copy, on which the same PANM scores 52 / 36 at 4(L+1) / 8(L+1), so 54 at 8(L+1)
    could not happen. (Until issue 15 this function used the table's reading.)

    Worked example: `x = 3 1 4 1 5` (L = 5, `x_ceil(5/2) = x_3 = 4`, `x_1 = 3`) ->
    `y = 4 3 4 3 4`; `x = 7 2 8 6` (L = 4, `x_2 = 2`) -> `y = 2 7 2 7`.

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.

    Returns:
        `(batch, max_len)` labels.
    """
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    middle = ((lengths + 1) // 2 - 1).unsqueeze(1)  # (batch, 1), 0-based ceil(L/2)
    odd_step = (steps % 2 == 0).unsqueeze(0)  # (1, max_len), 1-based t odd
    index = torch.where(odd_step, middle, torch.zeros_like(middle))  # (batch, max_len)
    return _gather_tokens(tokens, lengths, index)


def drecall_target_index(query_index: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """0-based position of the first Dynamic Recall target: left of the query if L is even, else right.

    Args:
        query_index: `(batch,)` 0-based position of the (unique) query token in the input.
        lengths: `(batch,)` number of real tokens per sample.

    Returns:
        `(batch,)` long positions.
    """
    return torch.where(lengths % 2 == 0, query_index - 1, query_index + 1)


def drecall_targets(
    tokens: torch.Tensor, lengths: torch.Tensor, query_index: torch.Tensor
) -> torch.Tensor:
    """Dynamic Recall: from the query's neighbour to the end of the input.

    The paper's appendix: "an arbitrary input token is chosen as the query and is added to the
    end of the input sequence. Depending on the length of the input, a.k.a, odd or even, the
    first target token will be on the left or right of the query, following its succeeding
    tokens in the input." We read: the query is a token value that occurs once among
    `x_1..x_L` (at `x_q`); the first target token is its left neighbour `x_{q-1}` if `L` is even,
    its right neighbour `x_{q+1}` if `L` is odd (the side the Chat-GPT table's example shows for
    L = 10), and the target goes on with the tokens that follow it in the input, to `x_L`. So the
    target has `L - q + 2` (even L) or `L - q` (odd L) tokens; labels are -100 after it.

    Why this reading (issue 15): a one-token target cannot give the paper's baselines their
    table. With a unique query our content attention solved it at every length (100% up to
    8(L+1); the paper's content attention: 27 at 2(L+1)); with a non-unique query the ambiguity
    caps any model at about 74% at L, below the paper's 88-92. The multi-token target is a Copy
    that starts at a content-chosen slot, so the baselines fall with length like on Copy
    (an issue-15 probe: content attention 27 / 18 / 15 at 2 / 4 / 8(L+1), paper 27 / 17 / 13).
    The Chat-GPT table's example lists one "true output" token, the first one.

    Worked example (the paper's)::

        x = $ ( & & $ # ^ @ % #,  query %   (L = 10, even)
        % occurs once, at x_9; left neighbour x_8 = @  ->  y = @ % #   (x_8 x_9 x_10)

    Small ones: `x = 3 1 4 1 5`, query `4` (`x_3`, L = 5 odd) -> `y = 1 5`;
    `x = 2 7 1 8`, query `1` (`x_3`, L = 4 even) -> `y = 7 1 8`.

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.
        query_index: `(batch,)` 0-based position of the query's occurrence.

    Returns:
        `(batch, max_len)` labels.
    """
    start = drecall_target_index(query_index, lengths)  # (batch,)
    steps = torch.arange(tokens.shape[1], device=tokens.device)  # (max_len,)
    index = start.unsqueeze(1) + steps.unsqueeze(0)  # (batch, max_len)
    return _gather_tokens(tokens, lengths - start, index)


def psort_targets(
    tokens: torch.Tensor, lengths: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    """Priority Sort: the tokens ordered by ascending priority score; `L` output steps.

    The paper's appendix: "each input token is associated with a priority score sampled from
    the standard normal distribution. The target output will be tokens from the input sequence
    sorted ascending by their the score." The score is the slot's feature 12; `L = 10`, so the
    test lengths are 10 / 11 / 21 / 41 / 81 (the paper's P. Sort table). Nothing is ambiguous
    here; the generator was checked against the text in issue 15 and left unchanged.

    Worked example: `x = 3 1 4` with scores `0.5 -1.2 0.1` -> `y = 1 4 3` (scores
    `-1.2 < 0.1 < 0.5`).

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.
        scores: `(batch, max_len)` float priority scores (padding ignored).

    Returns:
        `(batch, max_len)` labels.
    """
    valid = _valid(tokens, lengths)  # (batch, max_len)
    keys = scores.masked_fill(~valid, float("inf"))  # (batch, max_len), padding sorts last
    order = torch.argsort(keys, dim=1, stable=True)  # (batch, max_len)
    return _gather_tokens(tokens, lengths, order)


def idsort_targets(
    tokens: torch.Tensor, lengths: torch.Tensor, partner: torch.Tensor
) -> torch.Tensor:
    """ID Sort: `y_i` is the token sharing an id with `x_i`, i.e. `x_{partner[i]}`.

    Example (paper): `x_1,x_4` share an id, `x_2,x_3` share another ->
    `y = x_4 x_3 x_2 x_1`; so `x = 3 1 4 1` with `partner = 3 2 1 0` -> `y = 1 4 1 3`.
    For odd `L` one token is unpaired: it has its own id and maps to itself, e.g.
    `x = 3 1 4` with `partner = 2 1 0` -> `y = 4 1 3`.

    Args:
        tokens: `(batch, max_len)` long tokens, -100 padding.
        lengths: `(batch,)` number of real tokens per sample.
        partner: `(batch, max_len)` 0-based position of each token's id partner.

    Returns:
        `(batch, max_len)` labels.
    """
    return _gather_tokens(tokens, lengths, partner)


def random_pairing(
    lengths: torch.Tensor, max_len: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random perfect pairing of each sample's positions `0..L-1` (one left over if L is odd).

    A random permutation of the real positions is cut into consecutive pairs
    `(perm[0], perm[1]), (perm[2], perm[3]), ...`; for odd `L` the last element
    `perm[L-1]` is its own partner. Padding positions are their own partners.

    Args:
        lengths: `(batch,)` number of real tokens per sample.
        max_len: padded length.
        generator: source of randomness.

    Returns:
        `partner` `(batch, max_len)` long, and `pair_id` `(batch, max_len)` long, the index
        `0..ceil(L/2)-1` of each position's pair (padding gets `ceil(max_len/2)-1` or below).
    """
    batch = lengths.shape[0]
    device = lengths.device
    steps = torch.arange(max_len, device=device)  # (max_len,)
    valid = steps.unsqueeze(0) < lengths.unsqueeze(1)  # (batch, max_len)
    keys = torch.rand(batch, max_len, generator=generator, device=device)  # (batch, max_len)
    perm = torch.argsort(keys.masked_fill(~valid, 2.0), dim=1)  # (batch, max_len), real first
    mate = steps ^ 1  # (max_len,), rank of the other element of each pair
    own = (mate.unsqueeze(0) >= lengths.unsqueeze(1)) | ~valid  # (batch, max_len)
    mate = torch.where(own, steps.unsqueeze(0), mate.unsqueeze(0))  # (batch, max_len)
    partner = torch.empty_like(perm).scatter_(1, perm, perm.gather(1, mate))  # (batch, max_len)
    ranks_pair = (steps // 2).expand(batch, max_len)  # (batch, max_len)
    pair_id = torch.empty_like(perm).scatter_(1, perm, ranks_pair)  # (batch, max_len)
    return partner, pair_id


# ---------------------------------------------------------------------------
# Sampling and encoding
# ---------------------------------------------------------------------------


def _parse_length(length: int | tuple[int, int], task: str) -> tuple[int, int]:
    if type(length) is int:
        lo = hi = length
    elif (
        isinstance(length, (tuple, list))
        and len(length) == 2
        and all(type(v) is int for v in length)
    ):
        lo, hi = length
    else:
        raise ValueError(
            f"length must be an int or a (lo, hi) tuple of ints, got length={length!r}."
        )
    minimum = _MIN_LENGTH.get(task, 1)
    if lo < minimum or hi < lo:
        raise ValueError(
            f"length={length!r} is invalid for task={task!r}: need {minimum} <= lo <= hi "
            f"(drecall needs >= 2 tokens so the query has a neighbour)."
        )
    return lo, hi


def _sample_lengths(
    length: int | tuple[int, int],
    lo: int,
    hi: int,
    batch_size: int,
    generator: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    if isinstance(length, int):
        return torch.full((batch_size,), hi, dtype=torch.long, device=device)
    return torch.randint(lo, hi + 1, (batch_size,), generator=generator, device=device)


def _sample_drecall(
    tokens: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a query position with a neighbour on the answer side and make its value unique."""
    batch, max_len = tokens.shape
    valid = _valid(tokens, lengths)  # (batch, max_len)
    even = (lengths % 2 == 0).long()  # (batch,)
    u = torch.rand(batch, generator=generator, device=tokens.device)  # (batch,)
    # Even L: query in 1..L-1 (answer on the left); odd L: query in 0..L-2 (answer on the right).
    query_index = even + (u * (lengths - 1)).floor().long().clamp(max=lengths - 2)  # (batch,)
    query = tokens.gather(1, query_index.unsqueeze(1))  # (batch, 1)
    shift = torch.randint(
        1, NUM_TOKENS, (batch, max_len), generator=generator, device=tokens.device
    )  # (batch, max_len)
    steps = torch.arange(max_len, device=tokens.device)  # (max_len,)
    duplicate = (tokens == query) & valid & (steps.unsqueeze(0) != query_index.unsqueeze(1))
    tokens = torch.where(duplicate, (tokens + shift) % NUM_TOKENS, tokens)  # (batch, max_len)
    return tokens, query_index


def _encode(
    slot_tokens: torch.Tensor, num_slot_tokens: torch.Tensor, feature_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """START + tokens + END features and the attention mask; extras are filled by the caller."""
    batch, width = slot_tokens.shape
    device = slot_tokens.device
    slots = width + 2
    valid = _valid(slot_tokens, num_slot_tokens)  # (batch, width)
    one_hot = torch.nn.functional.one_hot(slot_tokens.clamp(min=0), NUM_TOKENS)  # (b, w, 10)
    one_hot = one_hot.float() * valid.unsqueeze(-1).float()  # (batch, width, 10)
    inputs = torch.zeros(batch, slots, feature_dim, device=device)  # (batch, slots, features)
    inputs[:, 1 : width + 1, :NUM_TOKENS] = one_hot
    inputs[:, 0, START_FEATURE] = 1.0
    end_slot = num_slot_tokens + 1  # (batch,)
    rows = torch.arange(batch, device=device)  # (batch,)
    inputs[rows, end_slot, END_FEATURE] = 1.0
    positions = torch.arange(slots, device=device)  # (slots,)
    attention_mask = (positions.unsqueeze(0) <= end_slot.unsqueeze(1)).long()  # (batch, slots)
    return inputs, attention_mask


def make_batch(
    task: str,
    batch_size: int,
    length: int | tuple[int, int],
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    id_dim: int = 8,
) -> AlgorithmicBatch:
    """Sample a batch of one algorithmic task (layout in the module docstring).

    Example (copy, `length=3`, tokens `3 1 4`): `inputs` has 5 slots
    `START, 3, 1, 4, END` of 12 features, `attention_mask = 1 1 1 1 1`,
    `labels = 3 1 4`. With `length=(2, 3)` a 2-token sample `5 9` gets slots
    `START, 5, 9, END, pad`, mask `1 1 1 1 0`, labels `5 9 -100`.

    Args:
        task: one of `TASKS`.
        batch_size: number of samples (>= 1).
        length: tokens per sample; an int for a fixed length, or `(lo, hi)` to draw each
            sample's length uniformly in `[lo, hi]` (tensors are padded to `hi`).
            drecall needs lengths >= 2.
        generator: source of all randomness; the same seed gives the same batch.
        device: device of the returned tensors (default: the generator's device, else CPU).
        id_dim: width of the idsort id vectors.

    Returns:
        An `AlgorithmicBatch`.
    """
    _check_task(task)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got batch_size={batch_size!r}.")
    if isinstance(id_dim, bool) or not isinstance(id_dim, int) or id_dim < 1:
        raise ValueError(f"id_dim must be a positive int, got id_dim={id_dim!r}.")
    lo, hi = _parse_length(length, task)
    work = generator.device if generator is not None else torch.device("cpu")
    feature_dim = _feature_dim(task, id_dim)

    lengths = _sample_lengths(length, lo, hi, batch_size, generator, work)  # (batch,)
    tokens = torch.randint(
        0, NUM_TOKENS, (batch_size, hi), generator=generator, device=work
    )  # (batch, hi)
    valid = _valid(tokens, lengths)  # (batch, hi)
    tokens = tokens.masked_fill(~valid, PAD_LABEL)  # (batch, hi)

    if task == "drecall":
        tokens, query_index = _sample_drecall(tokens, lengths, generator)
        labels = drecall_targets(tokens, lengths, query_index)  # (batch, hi)
        query = tokens.gather(1, query_index.unsqueeze(1))  # (batch, 1)
        padded = torch.cat([tokens, torch.full_like(query, PAD_LABEL)], dim=1)  # (batch, hi+1)
        rows = torch.arange(batch_size, device=work)  # (batch,)
        padded[rows, lengths] = query.squeeze(1)
        inputs, attention_mask = _encode(padded, lengths + 1, feature_dim)
        inputs[rows, lengths + 1, EXTRA_FEATURE] = 1.0  # query flag
        input_tokens = padded
    else:
        inputs, attention_mask = _encode(tokens, lengths, feature_dim)
        input_tokens = tokens
        if task == "copy":
            labels = copy_targets(tokens, lengths)
        elif task == "reverse":
            labels = reverse_targets(tokens, lengths)
        elif task == "mix":
            labels = mix_targets(tokens, lengths)
        elif task == "psort":
            scores = torch.randn(batch_size, hi, generator=generator, device=work)  # (batch, hi)
            labels = psort_targets(tokens, lengths, scores)
            inputs[:, 1 : hi + 1, EXTRA_FEATURE] = scores * valid.float()
        else:  # idsort
            partner, pair_id = random_pairing(lengths, hi, generator)
            labels = idsort_targets(tokens, lengths, partner)
            num_pairs = (hi + 1) // 2
            ids = torch.randn(
                batch_size, num_pairs, id_dim, generator=generator, device=work
            )  # (batch, pairs, id_dim)
            index = pair_id.unsqueeze(-1).expand(batch_size, hi, id_dim)  # (batch, hi, id_dim)
            slot_ids = ids.gather(1, index) * valid.unsqueeze(-1).float()  # (batch, hi, id_dim)
            inputs[:, 1 : hi + 1, EXTRA_FEATURE:] = slot_ids

    batch = AlgorithmicBatch(
        inputs=inputs, attention_mask=attention_mask, labels=labels, input_tokens=input_tokens
    )
    return batch.to(device) if device is not None else batch
