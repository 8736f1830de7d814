"""Pointer-based addressing modes (paper, Sec. 2.3.2).

Mode 1 dereferences each Mode-1 pointer: ``*p^a_{t,h} = M w^a_{t,h}``.
Mode 2 attends over ``M`` with a query made from the Mode-1 values,
``q_t = g^c([*p^a_{t,1..H^a}])`` (Eqs. 4-6), one query per Mode-2 head.
Both run over every decoding step at once. Two optional content reads go beyond the
paper's equations (``content_read``): one queried by the decoder state ``z_t`` (all steps
at once) and one queried by the Controller's own state ``h^c_{t-1}`` (the authors' code; the
Controller runs it one step at a time).
"""

from __future__ import annotations

import torch
from torch import nn

from panm_hf.kernels.linear_rows import mlp

from .addressing import address_codes
from .attention import AttentionScorer, masked_softmax
from .memory_config import PanmMemoryConfig


def mode1_read(address_weights: torch.Tensor, memory_states: torch.Tensor) -> torch.Tensor:
    """Dereference pointers: `(batch, steps, units, slots)` x `(batch, slots, dim)` -> rows `(batch*steps, units*dim)`.

    One `bmm` over all steps and units (an einsum adds permutes and copies around it, forward and backward);
    the values come as one row per (sample, step), the layout the Mode-2 query MLP and the Controller read."""
    batch, steps, units, slots = address_weights.shape
    weights = address_weights.reshape(batch, steps * units, slots)  # (batch, steps*units, slots)
    return torch.bmm(weights, memory_states).reshape(batch * steps, -1)  # (batch*steps, units*dim)


class Mode2Reader(nn.Module):
    """`H^c` content attention heads over `M`, queried by the Mode-1 values.

    Args:
        config: the PANM hyperparameters; reads `num_pointer_units` (`H^a`: the query MLP reads all
            Mode-1 values), `num_mode2_heads` (`H^c`), `mlp_hidden_size` (width of `g^c`) and the scoring.
        memory_dim: size of a memory slot `d_m`.
    """

    def __init__(self, config: PanmMemoryConfig, *, memory_dim: int):
        super().__init__()
        self.num_heads = config.num_mode2_heads
        self.query_mlp = nn.Sequential(
            nn.Linear(config.num_pointer_units * memory_dim, config.mlp_hidden_size),
            nn.ReLU(),
            nn.Linear(config.mlp_hidden_size, self.num_heads * memory_dim),
        )
        self.scorer = AttentionScorer(config, dim=memory_dim)

    def forward(
        self, mode1_values: torch.Tensor, memory_states: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mode-2 reads for every step.

        Args:
            mode1_values: `(batch*steps, units*dim)` the Mode-1 values, one row per (sample, step).
            memory_states: `(batch, slots, dim)`.
            attention_mask: `(batch, slots)` bool, or `(batch, steps, slots)` for a per-step (causal) mask.

        Returns:
            `(values (batch*steps, heads*dim), weights (batch, steps*heads, slots))`: rows like the input, and
            the attention of step `t`, head `h` at row `t*heads + h`.
        """
        batch, heads = memory_states.shape[0], self.num_heads
        queries = mlp(self.query_mlp, mode1_values)  # (batch*steps, heads*dim)
        queries = queries.reshape(batch, -1, memory_states.shape[-1])  # (batch, steps*heads, dim)
        read = self.scorer.fused(queries, "mode2_read", per_step=attention_mask.dim() != 2, memory=memory_states)
        if read is not None:  # one kernel (C on CPU, Triton on the CUDA path)
            scale = self.scorer.inverse_temperature if self.scorer.scoring == "cosine" else None
            values, weights = read(queries, memory_states, attention_mask, scale)[:2]
            return values.reshape(mode1_values.shape[0], -1), weights  # (batch*steps, heads*dim), (b, t*h, slots)
        queries = self.scorer.prepare_queries(queries)
        keys = self.scorer.prepare_keys(memory_states)  # (batch, slots, dim)
        # one bmm each for all steps and heads (einsums add permutes and copies around them)
        scores = torch.bmm(queries, keys.transpose(1, 2))  # (batch, steps*heads, slots)
        mask = attention_mask[:, None, :] if attention_mask.dim() == 2 else attention_mask.repeat_interleave(heads, 1)
        weights = masked_softmax(scores, mask)  # (batch, steps*heads, slots)
        values = torch.bmm(weights, memory_states)  # (batch, steps*heads, dim)
        return values.reshape(mode1_values.shape[0], -1), weights  # (batch*steps, heads*dim)


class DecoderContentReader(nn.Module):
    """Beyond the paper's equations: content attention over `M` queried by the decoder state `z_t`.

    Every PANM read in the paper depends only on (step, `p_B`, `p_E`, `M`), never on what has
    been decoded: the Pointer Units see no content and Mode 2 is queried by Mode-1 values. On a
    Transformer decoder those reads are a fixed positional schedule the cross-attention already
    covers. The authors' released code adds a Bahdanau attention over `M` inside the Controller;
    this reader queries it with `z_t` instead of the Controller state, so a teacher-forced
    sequence still runs in one pass. The Pointer Units still see no content (principle II).

    Args:
        config: the PANM hyperparameters (the scoring).
        memory_dim: size of a memory slot `d_m`.
        decoder_input_size: size of `z_t`.
    """

    def __init__(self, config: PanmMemoryConfig, *, memory_dim: int, decoder_input_size: int):
        super().__init__()
        self.query = nn.Linear(decoder_input_size, memory_dim)
        self.scorer = AttentionScorer(config, dim=memory_dim)
        self.address_bits = config.address_bits
        # content_read_keys: "memory", or a key term from each slot's distance to the last real slot, added to
        # the slot ("end_distance") or alone ("end_distance_only")
        self.keys_kind = config.content_read_keys
        self.end_distance_key = nn.Linear(config.address_bits, memory_dim) if self.keys_kind != "memory" else None

    def end_distance_codes(self, attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`(batch, slots)` mask -> `(batch, slots, bits)` binary codes of each slot's count of real slots after
        it (`p_E - j` for a real slot; any padding side); padding slots get codes too, which the mask hides."""
        mask = attention_mask.long()
        distance = mask.sum(dim=-1, keepdim=True) - mask.cumsum(dim=-1)  # (batch, slots), >= 0
        return address_codes(distance, self.address_bits, dtype)  # (batch, slots, bits)

    def keys(self, memory_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """`(batch, slots, dim)` `M`, `(batch, slots)` mask -> the read's keys `(batch, slots, dim)` when they are not
        `M` (`content_read_keys`), else None. `PanmMemory.bind` computes them once per memory."""
        if self.end_distance_key is None:
            return None
        if attention_mask.dim() != 2:
            raise ValueError(
                f"content_read_keys={self.keys_kind!r} needs one memory per sample (PanmForSeq2SeqLM); a causal "
                'per-step mask has no fixed last slot. Use content_read_keys="memory".'
            )
        codes = self.end_distance_codes(attention_mask, memory_states.dtype)  # (batch, slots, bits)
        keys = self.end_distance_key(codes)  # (batch, slots, dim)
        return keys if self.keys_kind == "end_distance_only" else memory_states + keys

    def forward(
        self,
        decoder_states: torch.Tensor,
        memory_states: torch.Tensor,
        attention_mask: torch.Tensor,
        keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(batch, steps, dec)`, `(batch, slots, dim)`, `(batch, slots)` or a per-step (causal) mask
        `(batch, steps, slots)`, optional keys `(batch, slots, dim)` from `keys` (computed here when the
        configuration needs them and none are given) -> `(values (batch, steps, 1, dim), weights (batch, steps, 1,
        slots))`.

        The same read as a Mode-2 head's, so it runs the same C kernel where that one runs; with end-distance
        keys the kernel scores the keys and one matmul takes the values from `M`."""
        queries = self.query(decoder_states.to(memory_states.dtype))  # (batch, steps, dim)
        if self.end_distance_key is not None and (keys is None or attention_mask.dim() != 2):
            keys = self.keys(memory_states, attention_mask)
        keys = memory_states if keys is None else keys
        read = self.scorer.fused(queries, "mode2_read", per_step=attention_mask.dim() != 2, memory=keys)
        if read is not None:  # one kernel (C on CPU, Triton on the CUDA path)
            scale = self.scorer.inverse_temperature if self.scorer.scoring == "cosine" else None
            values, weights = read(queries, keys, attention_mask, scale)[:2]
            if keys is not memory_states:  # the kernel's values are over the keys; the read's are over M
                values = torch.bmm(weights, memory_states)  # (batch, steps, dim)
            return values.unsqueeze(2), weights.unsqueeze(2)
        queries = self.scorer.prepare_queries(queries)
        keys = self.scorer.prepare_keys(keys)  # (batch, slots, dim)
        scores = torch.bmm(queries, keys.transpose(1, 2))  # (batch, steps, slots); einsums add permutes and copies
        mask = attention_mask[:, None, :] if attention_mask.dim() == 2 else attention_mask  # (batch, 1|steps, slots)
        weights = masked_softmax(scores, mask)
        values = torch.bmm(weights, memory_states)  # (batch, steps, dim)
        return values.unsqueeze(2), weights.unsqueeze(2)


class ControllerContentReader(nn.Module):
    """Beyond the paper's equations, after the authors' code: Bahdanau attention over `M` queried by
    the Controller's previous state `h^c_{t-1}`.

    The authors' Controller (thaihungle/PANM, `baselines/panm.py`) is an attentional GRU decoder: at
    every step its state scores every memory slot additively, `v . relu(W [h^c_{t-1}; M_i])`, and the
    attended value joins the GRU input and the output layer. Because the read at step `t` depends on
    what the Controller read and emitted before, it is a lookup driven by the decoded history (what
    Priority Sort's "the next-larger score" needs) even when the Controller has no decoder input
    (`z_t = 0`). The Pointer Units still see no content (principle II). The price is a per-step loop:
    `Controller` runs its GRU one step at a time when this reader is on.

    Scores are `v . tanh(W_k M_i + W_q h)` (Bahdanau's form; the authors use ReLU on a concatenation,
    the same family), with an attention width equal to `d_m`.

    Args:
        hidden_size: size of the Controller state `h^c`.
        memory_dim: size of a memory slot `d_m`.
    """

    def __init__(self, *, hidden_size: int, memory_dim: int):
        super().__init__()
        self.key = nn.Linear(memory_dim, memory_dim)
        self.query = nn.Linear(hidden_size, memory_dim, bias=False)
        self.score = nn.Linear(memory_dim, 1, bias=False)

    def forward(
        self, hidden: torch.Tensor, keys: torch.Tensor, memory_states: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: `hidden (batch, hidden)`, `keys = self.key(M) (batch, slots, dim)`, `M`, mask
        `(batch, slots)` -> `(values (batch, dim), weights (batch, slots))`."""
        energies = torch.tanh(keys + self.query(hidden).unsqueeze(1))  # (batch, slots, dim)
        weights = masked_softmax(self.score(energies).squeeze(-1), attention_mask)  # (batch, slots)
        values = torch.bmm(weights.unsqueeze(1), memory_states).squeeze(1)  # (batch, dim)
        return values, weights
