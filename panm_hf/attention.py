"""Attention scoring shared by the Pointer Units (address attention) and Mode-2 reads.

Two scorings are offered (``PanmMemoryConfig.scoring``):

* ``"dot"``: scaled dot product ``q.k / sqrt(d)``, as in the authors' code.
* ``"cosine"``: cosine similarity times a learnable inverse temperature, the
  paper's Eqs. (2) and (5). Plain cosine lives in [-1, 1], so a softmax over a
  few dozen slots can never be sharp; the temperature starts at
  ``cosine_inverse_temperature`` (15 by default) and is learned.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from panm_hf.kernels.dispatch import Call, fused_op

from .memory_config import PanmMemoryConfig


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that gives padded slots exactly zero weight.

    A row with no valid slot (an all-padding sample) gets all-zero weights rather
    than NaN, so its reads are zero vectors.

    Args:
        scores: `(..., slots)` raw scores.
        mask: boolean `(..., slots)` (broadcastable), True for real slots.
    """
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * mask


def padded(size: int) -> int:
    """`size` rounded up to a power of two, as a Triton block holds it."""
    return 1 << max(size - 1, 0).bit_length()


class AttentionScorer(nn.Module):
    """Scores queries against keys with `config.scoring` (`cosine_inverse_temperature` for `"cosine"`).

    Cosine normalisation runs as one fused kernel forward and one backward (`panm_hf::normalize_rows`,
    C, CPU float32/float64) unless `recurrence_kernel="eager"`, which keeps `nn.functional.normalize` (the
    reference: three ops forward and about ten backward per call).

    Args:
        config: the PANM hyperparameters.
        dim: size of the queries and keys.
    """

    def __init__(self, config: PanmMemoryConfig, *, dim: int):
        super().__init__()
        self.scoring = config.scoring
        self.dim = dim
        self.cosine_inverse_temperature_init = float(config.cosine_inverse_temperature)
        self.recurrence_kernel = config.recurrence_kernel
        if self.scoring == "cosine":
            self.inverse_temperature = nn.Parameter(torch.tensor(self.cosine_inverse_temperature_init))

    def reset_parameters(self) -> None:
        if self.scoring == "cosine":
            with torch.no_grad():
                self.inverse_temperature.fill_(self.cosine_inverse_temperature_init)

    def fused(self, x: torch.Tensor, op: str = "cosine_normalize", *, per_step: bool = False, memory=None):
        """The custom op that runs `op` (`"cosine_normalize"`, or `"mode2_read"` over `memory`) on `x` in one kernel
        (its C kernel on CPU, its Triton port on the CUDA path), or None for plain torch ops, as
        `panm_hf.kernels.dispatch` decides."""
        uniform = self.scoring != "cosine" or x.dtype == self.inverse_temperature.dtype
        tile = 0 if memory is None else padded(memory.shape[1]) * padded(memory.shape[2])  # (slots, dim) of M
        call = Call(self.recurrence_kernel, x.device, x.dtype, uniform=uniform, per_step=per_step, tile=tile)
        return fused_op(op, call)

    def prepare_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Normalise keys once so repeated scoring against them is one matmul."""
        if self.scoring == "cosine":
            if (normalize := self.fused(keys)) is not None:
                return normalize(keys, None)[0]
            return nn.functional.normalize(keys, dim=-1)
        return keys / math.sqrt(self.dim)

    def prepare_queries(self, queries: torch.Tensor) -> torch.Tensor:
        if self.scoring == "cosine":
            if (normalize := self.fused(queries)) is not None:
                return normalize(queries, self.inverse_temperature)[0]
            return nn.functional.normalize(queries, dim=-1) * self.inverse_temperature
        return queries
