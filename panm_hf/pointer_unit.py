"""The Pointer Units (paper, Eqs. 1-3): content-free pointer manipulation.

``H^a`` GRUs, one per Mode-1 pointer, run as one grouped recurrence: every step
is a single batched GRU update and a single batched address attention for all
units. Each unit ``h`` reads its previous pointer ``p_{t-1,h}`` (a soft b-bit
address), updates its hidden state, attends over ``g^a_h(A)`` and emits
``p_{t,h} = A w_{t,h}``. Only addresses enter this module, never memory content
(principle II): its forward takes no memory tensor at all.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import AttentionScorer, masked_softmax


class GroupedLinear(nn.Module):
    """`groups` independent linear maps applied in one einsum: `(..., groups, in)` -> `(..., groups, out)`."""

    def __init__(self, groups: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(groups, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(groups, out_features))
        self.reset_parameters()

    def reset_parameters(self, bound: float | None = None) -> None:
        # nn.Linear's default init per group unless a bound is given (GRU init).
        bound = bound if bound is not None else 1.0 / math.sqrt(self.weight.shape[1])
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...gi,gio->...go", inputs, self.weight) + self.bias


class GroupedGRUCell(nn.Module):
    """`groups` independent GRU cells (PyTorch's GRUCell equations) updated in one step."""

    def __init__(self, groups: int, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_gates = GroupedLinear(groups, input_size, 3 * hidden_size)
        self.hidden_gates = GroupedLinear(groups, hidden_size, 3 * hidden_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        self.input_gates.reset_parameters(bound)
        self.hidden_gates.reset_parameters(bound)

    def forward(self, inputs: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """`inputs (batch, groups, input_size)`, `hidden (batch, groups, hidden)` -> new hidden."""
        reset_i, update_i, new_i = self.input_gates(inputs).chunk(3, dim=-1)
        reset_h, update_h, new_h = self.hidden_gates(hidden).chunk(3, dim=-1)
        reset = torch.sigmoid(reset_i + reset_h)
        update = torch.sigmoid(update_i + update_h)
        candidate = torch.tanh(new_i + reset * new_h)
        return (1.0 - update) * candidate + update * hidden


class PointerUnits(nn.Module):
    """`H^a` Pointer Units sharing one grouped recurrence.

    Args:
        num_pointer_units: `H^a`.
        address_bits: `b`, the size of a pointer.
        hidden_size: size of each Pointer Unit GRU (paper: 256).
        mlp_hidden_size: hidden width of the address MLP `g^a` (paper: 128).
        scoring: `"dot"` or `"cosine"` (see `panm_hf.attention`).
        cosine_inverse_temperature: initial inverse temperature for `"cosine"`.
    """

    def __init__(
        self,
        *,
        num_pointer_units: int,
        address_bits: int,
        hidden_size: int,
        mlp_hidden_size: int,
        scoring: str,
        cosine_inverse_temperature: float = 15.0,
    ):
        super().__init__()
        self.num_pointer_units = num_pointer_units
        self.hidden_size = hidden_size
        self.cell = GroupedGRUCell(num_pointer_units, address_bits, hidden_size)
        # g^a: one MLP per unit mapping an address code into that unit's key space.
        self.address_mlp = nn.Sequential(
            GroupedLinear(num_pointer_units, address_bits, mlp_hidden_size),
            nn.ReLU(),
            GroupedLinear(num_pointer_units, mlp_hidden_size, hidden_size),
        )
        self.scorer = AttentionScorer(
            scoring=scoring, dim=hidden_size, cosine_inverse_temperature=cosine_inverse_temperature
        )

    def address_keys(self, address_bank: torch.Tensor) -> torch.Tensor:
        """`g^a_h(A[n])` for every unit and slot, computed once per batch.

        `(batch, slots, bits)` -> `(batch, units, slots, hidden)`, already normalised for scoring.
        """
        per_unit = address_bank.unsqueeze(-2).expand(-1, -1, self.num_pointer_units, -1)  # (batch, slots, units, bits)
        keys = self.address_mlp(per_unit)  # (batch, slots, units, hidden)
        return self.scorer.prepare_keys(keys.transpose(1, 2))  # (batch, units, slots, hidden)

    def step(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        address_bank: torch.Tensor,
        address_keys: torch.Tensor,
        slot_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pointer update for all units (Eqs. 1-3).

        Args:
            pointers: `(batch, units, bits)` previous pointers `p_{t-1}`.
            hidden: `(batch, units, hidden)` previous GRU states `h_{t-1}`.
            address_bank: `(batch, slots, bits)`.
            address_keys: `(batch, units, slots, hidden)` from `address_keys`.
            slot_mask: `(batch, 1, slots)` boolean.

        Returns:
            `(weights (batch, units, slots), new pointers, new hidden)`.
        """
        hidden = self.cell(pointers, hidden)  # (batch, units, hidden)
        queries = self.scorer.prepare_queries(hidden).unsqueeze(-2)  # (batch, units, 1, hidden)
        scores = (queries @ address_keys.transpose(-1, -2)).squeeze(-2)  # (batch, units, slots)
        weights = masked_softmax(scores, slot_mask)
        pointers = weights @ address_bank  # (batch, units, bits)
        return weights, pointers, hidden

    def forward(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        address_bank: torch.Tensor,
        address_keys: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run `num_steps` pointer updates; the only sequential loop of PANM.

        Returns:
            `(weights (batch, steps, units, slots), final pointers, final hidden)`.
        """
        slot_mask = attention_mask.unsqueeze(1)  # (batch, 1, slots)
        all_weights = []
        for _ in range(num_steps):
            weights, pointers, hidden = self.step(pointers, hidden, address_bank, address_keys, slot_mask)
            all_weights.append(weights)
        return torch.stack(all_weights, dim=1), pointers, hidden
