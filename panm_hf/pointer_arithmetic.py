"""Content-free pointer arithmetic (beyond the paper: `PanmMemoryConfig.pointer_update="shift"`).

The paper's Pointer Unit moves a pointer only by attending over the address bank
(Eq. 2). With binary codes the unit's score profile over all ``2^b`` addresses
repeats with a short period (docs/results/demo.md measures it), so beyond the
training window its weight spreads over look-alike addresses.

Here each Pointer Unit chooses, from its own hidden state ``h^a_t``, a distribution
``s_t`` over ``2K + 2`` moves: the signed steps ``K, ..., -K`` applied to its previous
address attention, and the paper's attention ``w^att_t`` (jumps such as "to the
middle" still need it):

    w~_t[j] = sum_k s_t[k] w_{t-1}[j - k] + s_t[att] w^att_t[j]
    w_t     = w~_t^gamma / sum(w~_t^gamma)

A step is the same at every address, so "one slot further" means the same thing at
address 5 and at address 500. The sharpening exponent ``gamma >= 1`` (learned, one
per unit, as in the NTM's location addressing) keeps repeated steps from blurring the
pointer. Only addresses reach ``h^a_t``: principle II holds. Slots are bound to
consecutive addresses, so a step over slots is the same step over addresses
(principle I); weight moved past either end of the sequence is dropped.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def shift_candidates(weights: torch.Tensor, reach: int) -> torch.Tensor:
    """Address attention moved by each step `K, K - 1, ..., -K` (largest first).

    Args:
        weights: `(rows, slots)` previous address attention `w_{t-1}`.
        reach: `K`.

    Returns:
        `(rows, 2K + 1, slots)`; row `i` is `weights` moved by `K - i` slots: `out[:, i, j] =
        weights[j - (K - i)]`. Weight that would leave `[0, slots)` is dropped, nothing wraps around.
    """
    slots = weights.shape[-1]
    padded = F.pad(weights, (reach, reach))  # (rows, slots + 2K); padded[K + j] = weights[j]
    return padded.unfold(-1, slots, 1)  # (rows, 2K + 1, slots), a view: window i starts at padded[i]


def sharpen(weights: torch.Tensor, gamma: torch.Tensor, mask_bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`w^gamma / sum(w^gamma)` over the real slots, as one softmax of `gamma log w`.

    Args:
        weights: `(..., slots)` non-negative weights.
        gamma: `(..., 1)` exponents `>= 1`.
        mask_bias: `(..., slots)` 0 on real slots, a large negative number on padding.
        mask: `(..., slots)` bool, True for real slots (padding gets exactly zero, all-padding rows too).

    A row whose real slots all have zero weight comes out uniform over them.
    """
    # The clamp keeps log finite (and its gradient w.r.t. gamma) where the weight is exactly 0.
    log_weights = torch.log(weights.clamp_min(torch.finfo(weights.dtype).tiny))
    return torch.softmax(torch.addcmul(mask_bias, gamma, log_weights), dim=-1) * mask
