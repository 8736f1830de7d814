"""Dyck-n next-symbol prediction (paper, Sec. 3.2 "Dyck Language Recognition" and its appendix).

The paper follows Suzgun et al. (2019, "Memory-augmented recurrent neural networks can learn
generalized Dyck languages", code `suzgunmirac/marnns`): the input is a Dyck-n string read one
symbol at a time; after each symbol the target is the **set** of symbols that may come next,
a multi-hot vector over the `2n` brackets. An opening bracket of any type may always come next;
the closing bracket matching the innermost open bracket may come next when one is open.
Worked example (D2, vocabulary ``()[]``), input ``([])``::

    prefix   (     ([     ([]    ([])
    next     ( ) [ ( [ ]  ( ) [  ( [
    y_t      1101  1011   1101   1010      (columns: ( ) [ ])

No end-of-string symbol is predicted (as in marnns' `lineToTensorSigmoid`). A sequence counts as
correct only if every output at every step is right after thresholding at 0.5 (marnns'
`test_model`); :func:`sequence_accuracy` computes that.

Tokens: bracket type `k` opens as token `2k` and closes as token `2k + 1`, so token ids follow
the vocabulary string (``"()[]{}"[:2n]``, marnns' pair order); :data:`PAD` marks padding.

**Sampler.** The paper draws strings from the PCFG `S -> (_i S )_i` (prob `p/n`) `| S S` (`q`) `| eps`
with marnns' `p = 0.5, q = 0.25`, keeping lengths in a window. That PCFG is critical (its mean
length is infinite), so drawing strings of one exact long test length (8L = 160 for D3) by
rejection costs millions of draws. :func:`sample_dyck` instead draws each string uniformly among
the Dyck-n strings of its requested length (optionally with a maximum nesting depth): the
bracket *shape* uniformly among Dyck paths of that length, then each pair's type uniformly.
Vectorised over the batch: one loop over positions, with the number of completions of each
(remaining length, depth) state deciding whether to open or close.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VOCABULARY = "()[]{}<>"  # marnns' first pairs: ( ) [ ] { } < >
PAD = -1


@dataclass
class DyckBatch:
    """A right-padded batch of Dyck-n strings and their next-symbol targets.

    Attributes:
        tokens: `(batch, steps)` long, token ids `0..2n-1`, :data:`PAD` after each string's end.
        lengths: `(batch,)` long, the strings' lengths.
        targets: `(batch, steps, 2n)` float multi-hot: symbols allowed after `tokens[:, :t+1]`.
        mask: `(batch, steps)` bool, True on real steps.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor


def _check_pairs(num_pairs: int) -> None:
    if not isinstance(num_pairs, int) or not 1 <= num_pairs <= len(VOCABULARY) // 2:
        raise ValueError(f"num_pairs must be an integer in 1..{len(VOCABULARY) // 2} (got {num_pairs!r}).")


def completion_counts(max_length: int, max_depth: int) -> torch.Tensor:
    """`counts[r, d]`: bracket shapes of length `r` that start at depth `d`, end at depth 0 and never
    go below 0 or above `max_depth`. `(max_length + 1, max_depth + 2)` float64; column `max_depth + 1`
    is all zero (so the recursion can look one deeper). Catalan-sized: float64 holds them to length ~1000.
    """
    counts = torch.zeros(max_length + 1, max_depth + 2, dtype=torch.float64)
    counts[0, 0] = 1.0
    for remaining in range(1, max_length + 1):
        previous = counts[remaining - 1]
        counts[remaining, : max_depth + 1] = previous[1 : max_depth + 2]  # open: depth d -> d + 1
        counts[remaining, 1 : max_depth + 1] += previous[0:max_depth]  # close: depth d -> d - 1
    return counts


def sample_dyck(
    lengths: torch.Tensor,
    num_pairs: int,
    *,
    max_depth: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one Dyck-n string per requested length, uniformly among those strings.

    Args:
        lengths: `(batch,)` even integers >= 2.
        num_pairs: `n`, the number of bracket types.
        max_depth: largest nesting depth allowed; None for no limit beyond the length.
        generator: torch.Generator for reproducible draws.

    Returns:
        `(batch, max(lengths))` long token ids, right-padded with :data:`PAD`.
    """
    _check_pairs(num_pairs)
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.numel() == 0:
        raise ValueError(
            f"lengths must be a non-empty 1-d integer tensor (got {lengths.dtype} {tuple(lengths.shape)})."
        )
    if bool((lengths < 2).any()) or bool((lengths % 2).any()):
        raise ValueError(f"every length must be an even integer >= 2 (got {sorted(set(lengths.tolist()))}).")
    lengths = lengths.long()
    longest = int(lengths.max())
    depth_limit = longest // 2 if max_depth is None else max_depth
    if not isinstance(depth_limit, int) or depth_limit < 1:
        raise ValueError(f"max_depth must be an integer >= 1 or None (got {max_depth!r}).")
    counts = completion_counts(longest, depth_limit)  # (remaining, depth)
    batch = lengths.shape[0]
    rows = torch.arange(batch)
    tokens = torch.full((batch, longest), PAD, dtype=torch.long)
    stack = torch.zeros(batch, depth_limit + 1, dtype=torch.long)  # open types; stack[:, d - 1] is depth d's
    depth = torch.zeros(batch, dtype=torch.long)
    for position in range(longest):
        remaining = (lengths - position).clamp(min=0)  # (batch,)
        active = remaining > 0
        total = counts[remaining, depth]  # completions from here
        after_open = counts[(remaining - 1).clamp(min=0), depth + 1]
        # P(open) = completions after opening / all completions (0 where nothing is left to write).
        p_open = torch.where(total > 0, after_open / total.clamp(min=1e-300), torch.zeros_like(total))
        draw = torch.rand(batch, generator=generator, dtype=torch.float64)
        bracket = torch.randint(num_pairs, (batch,), generator=generator)
        opens = active & (draw < p_open)
        closes = active & ~opens
        top = stack[rows, (depth - 1).clamp(min=0)]  # (batch,) type of the innermost open bracket
        level = depth.clamp(max=depth_limit)  # where an opening bracket goes on the stack
        stack[rows, level] = torch.where(opens, bracket, stack[rows, level])
        tokens[:, position] = torch.where(opens, 2 * bracket, torch.where(closes, 2 * top + 1, tokens[:, position]))
        depth = depth + opens.long() - closes.long()
    return tokens


def next_symbol_targets(tokens: torch.Tensor, num_pairs: int) -> torch.Tensor:
    """The multi-hot set of symbols allowed after each prefix (Suzgun et al.'s output).

    `(batch, steps)` token ids (:data:`PAD` after the end) -> `(batch, steps, 2n)` float: every opening
    bracket is allowed; the closing bracket of the innermost open bracket is allowed when the prefix
    leaves one open. Padded steps get all zeros. The prefixes must be balanced-so-far (never close
    more than is open, never close the wrong type); a ValueError names the first that is not.
    """
    _check_pairs(num_pairs)
    real = tokens != PAD
    is_open = real & (tokens % 2 == 0)
    step = torch.where(is_open, 1, torch.where(real, -1, 0))
    depth = step.cumsum(dim=-1)  # (batch, steps) depth after each symbol
    # The innermost open bracket after prefix t opened at the last s <= t with an opening bracket
    # that took the depth to depth[t] (depth[s] == depth[t]); positions (batch, t, s).
    steps = tokens.shape[-1]
    earlier = torch.ones(steps, steps, dtype=torch.bool).tril()  # (t, s): s <= t
    candidates = earlier & is_open.unsqueeze(1) & (depth.unsqueeze(1) == depth.unsqueeze(2))  # (batch, t, s)
    positions = torch.arange(steps)
    opened_at = torch.where(candidates, positions, -1).amax(dim=-1)  # (batch, t), -1 when nothing is open
    innermost = (tokens.gather(1, opened_at.clamp(min=0)) // 2).clamp(min=0)  # (batch, t) type of that bracket
    # A closing bracket must match the innermost bracket open before it.
    before = torch.cat([torch.full_like(innermost[:, :1], -1), torch.where(opened_at >= 0, innermost, -1)[:, :-1]], 1)
    bad = real & ((depth < 0) | (~is_open & (tokens // 2 != before)))
    if bool(bad.any()):
        row, col = bad.nonzero()[0].tolist()
        raise ValueError(f"row {row} is not a Dyck prefix at position {col} (an unmatched closing bracket).")
    targets = torch.zeros(*tokens.shape, 2 * num_pairs)
    targets[..., 0::2] = 1.0  # any opening bracket may come next
    close = torch.nn.functional.one_hot(innermost, num_pairs).float() * (opened_at >= 0).unsqueeze(-1)  # (batch, t, n)
    targets[..., 1::2] = close
    return targets * real.unsqueeze(-1)


def make_dyck_batch(
    lengths: torch.Tensor, num_pairs: int, *, max_depth: int | None = None, generator: torch.Generator | None = None
) -> DyckBatch:
    """`sample_dyck` plus its targets and mask."""
    tokens = sample_dyck(lengths, num_pairs, max_depth=max_depth, generator=generator)
    return DyckBatch(
        tokens=tokens,
        lengths=torch.as_tensor(lengths).long(),
        targets=next_symbol_targets(tokens, num_pairs),
        mask=tokens != PAD,
    )


def sequence_accuracy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence correctness (marnns' metric): every output of every real step right at threshold 0.5.

    `logits`, `targets` `(batch, steps, 2n)`, `mask` `(batch, steps)` -> `(batch,)` bool.
    """
    wrong = ((logits >= 0) != (targets >= 0.5)).any(dim=-1) & mask  # (batch, steps)
    return ~wrong.any(dim=-1)


def to_strings(tokens: torch.Tensor) -> list[str]:
    """Token ids -> bracket strings (padding dropped)."""
    return ["".join(VOCABULARY[t] for t in row if t != PAD) for row in tokens.tolist()]


def from_strings(strings: list[str]) -> torch.Tensor:
    """Bracket strings -> right-padded token ids; ValueError on a symbol outside the vocabulary."""
    width = max(map(len, strings))
    tokens = torch.full((len(strings), width), PAD, dtype=torch.long)
    for row, text in enumerate(strings):  # test and display helper (strings, not the training path)
        for col, symbol in enumerate(text):
            if symbol not in VOCABULARY:
                raise ValueError(f"{symbol!r} in {text!r} is not a bracket of {VOCABULARY!r}.")
            tokens[row, col] = VOCABULARY.index(symbol)
    return tokens


__all__ = [
    "PAD",
    "VOCABULARY",
    "DyckBatch",
    "completion_counts",
    "from_strings",
    "make_dyck_batch",
    "next_symbol_targets",
    "sample_dyck",
    "sequence_accuracy",
    "to_strings",
]
