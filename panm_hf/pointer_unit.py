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
from torch.nn import functional as F

from panm_hf.kernels.dispatch import Call, decide, require

from .attention import AttentionScorer
from .memory_config import PanmMemoryConfig
from .pointer_arithmetic import sharpen, shift_candidates


class GroupedLinear(nn.Module):
    """`groups` independent linear maps in one batched matmul: `(groups, rows, in)` -> `(groups, rows, out)`.

    Group-major inputs let a single `baddbmm` serve all groups with no per-call copies.
    """

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
        return torch.baddbmm(self.bias.unsqueeze(1), inputs, self.weight)  # (groups, rows, out)


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
        """`inputs (groups, batch, input_size)`, `hidden (groups, batch, hidden)` -> new hidden."""
        reset_i, update_i, new_i = self.input_gates(inputs).chunk(3, dim=-1)
        reset_h, update_h, new_h = self.hidden_gates(hidden).chunk(3, dim=-1)
        reset = torch.sigmoid(reset_i + reset_h)
        update = torch.sigmoid(update_i + update_h)
        candidate = torch.tanh(new_i + reset * new_h)
        return (1.0 - update) * candidate + update * hidden


class ArithmeticHead(GroupedLinear):
    """Per unit, `h^a_t` -> logits of the moves (steps `K..-K`, then "attend"), and a learned sharpening.

    Starts uniform over the steps with the attention's share at `e^-1 / (2K + 1 + e^-1)` (0.11 for
    K = 1), and `gamma = 1 + softplus(0) = 1.69`. With `init="walk"` the base pointer's (unit 0) `+1`
    logit and the end pointer's (unit 1) `-1` logit start at `WALK_BIAS` instead (0.76 of the weight for K = 1).
    """

    WALK_BIAS = 2.0

    def __init__(self, groups: int, in_features: int, reach: int, init: str = "uniform"):
        self.reach, self.init = reach, init  # read by reset_parameters, which the parent's __init__ calls
        super().__init__(groups, in_features, 2 * reach + 2)  # resets the logits' weights (below)
        self.sharpening = nn.Parameter(torch.zeros(groups))  # gamma_h = 1 + softplus(sharpening_h)

    def reset_parameters(self, bound: float | None = None) -> None:
        super().reset_parameters(bound)  # draws as GroupedLinear does, so seeded runs keep their other inits
        nn.init.zeros_(self.weight)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[:, -1] = -1.0
            if self.init == "walk":  # the moves are steps K..-K: step s sits at index K - s
                self.bias[0, self.reach - 1] = self.WALK_BIAS  # base pointer: +1
                if self.bias.shape[0] > 1:
                    self.bias[1, self.reach + 1] = self.WALK_BIAS  # end pointer: -1
            if hasattr(self, "sharpening"):
                self.sharpening.zero_()

    def gamma(self, batch: int) -> torch.Tensor:
        """Sharpening exponents laid out unit-major: `(units*batch, 1, 1)`."""
        gamma = 1.0 + F.softplus(self.sharpening)  # (units,)
        return gamma.repeat_interleave(batch).reshape(-1, 1, 1)  # (units*batch, 1, 1)


class PointerUnits(nn.Module):
    """`H^a` Pointer Units sharing one grouped recurrence.

    Args:
        config: the PANM hyperparameters; reads `num_pointer_units` (`H^a`), `address_bits` (`b`, the
            size of a pointer), `pointer_hidden_size` (each GRU), `mlp_hidden_size` (the address MLP
            `g^a`), the scoring (`panm_hf.attention`), and `pointer_update`: `"attention"` (the paper's
            Eq. 2) or `"shift"` (the paper's attention as one of the moves beside content-free steps
            `-K..K`, `K = shift_range`; see `panm_hf.pointer_arithmetic`); `recurrence_kernel`: whether the
            loop runs step by step (`"eager"`, the reference) or as one fused kernel (`panm_hf.kernels`).
    """

    def __init__(self, config: PanmMemoryConfig):
        super().__init__()
        units, hidden_size = config.num_pointer_units, config.pointer_hidden_size
        self.num_pointer_units = units
        self.hidden_size = hidden_size
        self.pointer_update = config.pointer_update
        self.recurrence_kernel = config.recurrence_kernel
        self.shift_range = config.shift_range
        self.cell = GroupedGRUCell(units, config.address_bits, hidden_size)
        # g^a: one map per unit from an address code into that unit's key space; an MLP (the paper's
        # text) or affine (the authors' code), kept under one name so checkpoints load either way.
        if config.address_key == "linear":
            self.address_mlp = nn.Sequential(GroupedLinear(units, config.address_bits, hidden_size))
        else:
            self.address_mlp = nn.Sequential(
                GroupedLinear(units, config.address_bits, config.mlp_hidden_size),
                nn.ReLU(),
                GroupedLinear(units, config.mlp_hidden_size, hidden_size),
            )
        self.scorer = AttentionScorer(config, dim=hidden_size)
        # "shift": per unit, logits of the 2K + 1 steps, the gate g_t and the sharpening gamma_t.
        self.arithmetic_head = (
            ArithmeticHead(units, hidden_size, self.shift_range, config.shift_init)
            if self.pointer_update == "shift"
            else None
        )
        self._compiled_step = None

    def address_keys(self, address_bank: torch.Tensor) -> torch.Tensor:
        """`g^a_h(A[n])` for every unit and slot, computed once per batch.

        `(batch, slots, bits)` -> `(batch, units, slots, hidden)`, already normalised for scoring.
        """
        batch, slots, bits = address_bank.shape
        rows = address_bank.reshape(1, batch * slots, bits)  # (1, batch*slots, bits)
        rows = rows.expand(self.num_pointer_units, -1, -1)  # (units, batch*slots, bits)
        keys = self.address_mlp(rows)  # (units, batch*slots, hidden)
        normalize = self.scorer.fused(keys) if self.scorer.scoring == "cosine" else None
        if normalize is not None:  # normalised and made batch-major in one kernel
            return normalize(keys, None, batch)[0]  # (batch, units, slots, hidden)
        keys = keys.unflatten(1, (batch, slots)).transpose(0, 1)  # (batch, units, slots, hidden)
        return self.scorer.prepare_keys(keys)

    def step(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        keys: torch.Tensor,
        bank: torch.Tensor,
        mask: torch.Tensor,
        mask_bias: torch.Tensor,
        previous_weights: torch.Tensor | None = None,
        gamma: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One update of all units, unit-major: `pointers (units, batch, bits)`, `hidden (units, batch, hidden)`.

        `keys (units*batch, hidden, slots)`, `bank (units*batch, slots, bits)`, `mask`/`mask_bias
        (units*batch, 1, slots)` are laid out once per call by `forward`; `previous_weights
        (units*batch, 1, slots)` (`w_{t-1}`) and `gamma (units*batch, 1, 1)` are used by `"shift"` only.
        """
        units, batch, size = hidden.shape
        hidden = self.cell(pointers, hidden)  # (units, batch, hidden)
        queries = self.scorer.prepare_queries(hidden)
        queries = queries.reshape(units * batch, 1, size)  # (units*batch, 1, hidden)
        scores = torch.baddbmm(mask_bias, queries, keys)  # (units*batch, 1, slots)
        weights = torch.softmax(scores, dim=-1)  # (units*batch, 1, slots)
        if self.arithmetic_head is not None:  # sharpening ends in the same masking
            weights = self._shift_update(hidden, weights, previous_weights, gamma, mask, mask_bias)
        else:
            weights = weights * mask  # exact zeros on padding, even for all-padding rows
        pointers = torch.bmm(weights, bank).reshape(units, batch, -1)  # (units, batch, bits)
        return weights, pointers, hidden

    def _shift_update(
        self,
        hidden: torch.Tensor,
        attended: torch.Tensor,
        previous_weights: torch.Tensor,
        gamma: torch.Tensor,
        mask: torch.Tensor,
        mask_bias: torch.Tensor,
    ) -> torch.Tensor:
        """`sharpen(sum_k s_k shift_k(w_{t-1}) + s_att w^att, gamma)`, with `s` from `h^a_t` (no memory content)."""
        units, batch, _ = hidden.shape
        logits = self.arithmetic_head(hidden).reshape(units * batch, 1, -1)  # (units*batch, 1, 2K + 2)
        moves = shift_candidates(previous_weights.squeeze(1), self.shift_range)  # (units*batch, 2K + 1, slots)
        moves = torch.cat([moves, attended], dim=1)  # (units*batch, 2K + 2, slots)
        mixed = torch.bmm(torch.softmax(logits, dim=-1), moves)  # (units*batch, 1, slots)
        return sharpen(mixed, gamma, mask_bias, mask)

    def compile_step(self, **compile_kwargs) -> None:
        """Run each step through `torch.compile` (fuses the GRU gates and the masked softmax).

        The loop itself stays in Python; the step is data-independent of memory content, so on GPU
        `mode="reduce-overhead"` also captures it in a CUDA graph.
        """
        self._compiled_step = torch.compile(self.step, **compile_kwargs)

    def fused_unavailable_reason(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        address_bank: torch.Tensor,
        address_keys: torch.Tensor,
        attention_mask: torch.Tensor,
        step_mask: torch.Tensor | None = None,
        anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> str | None:
        """Why `forward` with these arguments cannot run the fused kernel; None when it can."""
        call = self._kernel_call(pointers, hidden, address_bank, address_keys, attention_mask, step_mask, anchors)
        return decide("pointer_recurrence", call).reason

    def _kernel_call(self, pointers, hidden, address_bank, address_keys, attention_mask, step_mask, anchors) -> Call:
        """The loop's call as `panm_hf.kernels.dispatch` sees it."""
        tensors = [pointers, hidden, address_bank, address_keys, *self.cell.parameters(), *self.scorer.parameters()]
        if self.arithmetic_head is not None:
            tensors += list(self.arithmetic_head.parameters())
        return Call(
            self.recurrence_kernel, address_keys.device, address_keys.dtype,
            uniform=len({t.dtype for t in tensors}) == 1 and len({t.device for t in tensors}) == 1,
            per_step=attention_mask.dim() != 2 or step_mask is not None
            or (anchors is not None and self.num_pointer_units > 1),
            compiled_step=self._compiled_step is not None,
        )  # fmt: skip

    def _fused_forward(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        address_bank: torch.Tensor,
        address_keys: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
        previous_weights: torch.Tensor | None,
        kernel: str = "c",
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`forward`'s loop as one kernel (and its backward as one): same arguments and results. `kernel="c"`
        dispatches by device (C on CPU, Triton on CUDA); `"triton"` runs the Triton port on any device."""
        inverse_temperature = self.scorer.inverse_temperature if self.scorer.scoring == "cosine" else None
        input_gates, hidden_gates = self.cell.input_gates, self.cell.hidden_gates
        args = (pointers, hidden, address_keys, address_bank, attention_mask, input_gates.weight, input_gates.bias,
                hidden_gates.weight, hidden_gates.bias, inverse_temperature)  # fmt: skip
        suffix = "_triton" if kernel == "triton" else ""
        if self.arithmetic_head is not None:  # "shift": w_0, the moves' head and the sharpening join the inputs
            head = self.arithmetic_head
            batch, units, slots, _ = address_keys.shape
            self._check_previous_weights(previous_weights, batch, units, slots)
            op = getattr(torch.ops.panm_hf, f"shift_recurrence{suffix}")
            outputs = op(*args, previous_weights.to(address_keys.dtype), head.weight, head.bias, head.sharpening,
                         num_steps)  # fmt: skip
        else:
            outputs = getattr(torch.ops.panm_hf, f"pointer_recurrence{suffix}")(*args, num_steps)
        weights, pointers, hidden = outputs[:3]
        return weights, pointers, hidden  # (batch, steps, units, slots), (batch, units, bits), (batch, units, hidden)

    @staticmethod
    def _check_previous_weights(previous_weights: torch.Tensor | None, batch: int, units: int, slots: int) -> None:
        """A ValueError unless `w_{t-1}` is given as `(batch, units, slots)` (what `"shift"` needs)."""
        if previous_weights is None or tuple(previous_weights.shape) != (batch, units, slots):
            got = None if previous_weights is None else tuple(previous_weights.shape)
            raise ValueError(
                f'pointer_update="shift" needs previous_weights of shape {(batch, units, slots)} '
                f"(PanmState.pointer_weights, set by PanmMemory.initial_state); got {got}."
            )

    @classmethod
    def _unit_major_weights(
        cls, previous_weights: torch.Tensor | None, batch: int, units: int, slots: int
    ) -> torch.Tensor:
        """`w_{t-1}` `(batch, units, slots)` laid out `(units*batch, 1, slots)`; a ValueError when missing."""
        cls._check_previous_weights(previous_weights, batch, units, slots)
        return previous_weights.transpose(0, 1).reshape(units * batch, 1, slots)  # (units*batch, 1, slots)

    @staticmethod
    def _unit_major(
        address_keys: torch.Tensor, address_bank: torch.Tensor, attention_mask: torch.Tensor, num_steps: int
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...], list[torch.Tensor]]:
        """Keys, bank, and per-step masks and mask biases laid out unit-major once, so every step is a few
        batched matmuls with no copies: `(units*batch, hidden, slots)`, `(units*batch, slots, bits)`, and per
        step `(units*batch, 1, slots)` each."""
        batch, units, slots, size = address_keys.shape
        keys = address_keys.transpose(0, 1).reshape(units * batch, slots, size)  # (units*batch, slots, hidden)
        keys = keys.transpose(1, 2)  # (units*batch, hidden, slots)
        bank = address_bank.unsqueeze(0).expand(units, -1, -1, -1)  # (units, batch, slots, bits)
        bank = bank.reshape(units * batch, slots, -1)  # (units*batch, slots, bits)
        if attention_mask.dim() == 3:  # (batch, steps, slots) -> one (units*batch, 1, slots) mask per step
            mask = attention_mask.unsqueeze(0).expand(units, -1, -1, -1)  # (units, batch, steps, slots)
            mask = mask.reshape(units * batch, num_steps, 1, slots).unbind(1)  # steps x (units*batch, 1, slots)
        else:
            mask = attention_mask.unsqueeze(0).expand(units, -1, -1)  # (units, batch, slots)
            mask = mask.reshape(units * batch, 1, slots)  # (units*batch, 1, slots)
            mask = (mask,) * num_steps  # the same mask at every step
        # -65504 (fp16's lowest) stays finite in fp16/bf16/fp32 and zeroes padded slots in the softmax.
        bias_of = {id(m): torch.zeros(m.shape, dtype=keys.dtype, device=keys.device).masked_fill(~m, -65504.0)
                   for m in mask}  # fmt: skip
        return keys, bank, mask, [bias_of[id(m)] for m in mask]

    def forward(
        self,
        pointers: torch.Tensor,
        hidden: torch.Tensor,
        address_bank: torch.Tensor,
        address_keys: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
        previous_weights: torch.Tensor | None = None,
        *,
        step_mask: torch.Tensor | None = None,
        anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run `num_steps` pointer updates (Eqs. 1-3); the only sequential loop of PANM.

        Args:
            pointers: `(batch, units, bits)` previous pointers `p_{t-1}`.
            hidden: `(batch, units, hidden)` previous GRU states `h_{t-1}`.
            address_bank: `(batch, slots, bits)`.
            address_keys: `(batch, units, slots, hidden)` from `address_keys`.
            attention_mask: `(batch, slots)` boolean, or `(batch, steps, slots)` for a mask that
                changes per step (causal decoding: step `t` sees slots `<= t` only).
            previous_weights: `(batch, units, slots)` previous address attention `w_{t-1}`;
                required by `pointer_update="shift"`, ignored otherwise.
            step_mask: `(batch, steps)` bool; a False step leaves every unit's state unchanged
                (causal decoding: a step whose own token is padding).
            anchors: `(pointers (batch, steps, bits), weights (batch, steps, slots))`: unit 1's previous
                pointer (and `w_{t-1}`) is replaced by these before every step (causal decoding: the end
                pointer is re-anchored at the newest slot). Ignored with a single unit.

        Returns:
            `(weights (batch, steps, units, slots), final pointers, final hidden)`.
        """
        call = self._kernel_call(pointers, hidden, address_bank, address_keys, attention_mask, step_mask, anchors)
        kernel = require("pointer_recurrence", call, "this call").kernel
        if kernel != "eager":
            return self._fused_forward(
                pointers, hidden, address_bank, address_keys, attention_mask, num_steps, previous_weights, kernel
            )
        batch, units, slots, size = address_keys.shape
        if self.arithmetic_head is not None:
            previous_weights = self._unit_major_weights(previous_weights, batch, units, slots)  # (u*b, 1, slots)
        keys, bank, masks, mask_biases = self._unit_major(address_keys, address_bank, attention_mask, num_steps)
        pointers = pointers.transpose(0, 1).reshape(units, batch, -1)  # (units, batch, bits)
        hidden = hidden.transpose(0, 1).reshape(units, batch, size)  # (units, batch, hidden)
        gamma = self.arithmetic_head.gamma(batch) if self.arithmetic_head is not None else None
        step = self._compiled_step or self.step
        all_weights = []
        weights = previous_weights if self.arithmetic_head is not None else None  # w_{t-1}: "shift" only
        anchored = anchors is not None and units > 1
        for t in range(num_steps):
            if anchored:  # unit 1 restarts from the anchor (the newest slot) at every step
                pointers = torch.cat([pointers[:1], anchors[0][:, t].unsqueeze(0), pointers[2:]])
                if weights is not None:
                    anchor_weights = anchors[1][:, t].unsqueeze(1).to(weights.dtype)  # (batch, 1, slots)
                    weights = torch.cat([weights[:batch], anchor_weights, weights[2 * batch :]])
            new_weights, new_pointers, new_hidden = step(
                pointers, hidden, keys, bank, masks[t], mask_biases[t], weights, gamma
            )
            if step_mask is not None:  # inactive steps keep the previous state
                active = step_mask[:, t].reshape(1, batch, 1)  # (1, batch, 1)
                new_hidden = torch.where(active, new_hidden, hidden)
                new_pointers = torch.where(active, new_pointers, pointers)
                if weights is not None:
                    active_rows = active.expand(units, -1, -1).reshape(units * batch, 1, 1)  # (units*batch, 1, 1)
                    new_weights = torch.where(active_rows, new_weights, weights)
            weights, pointers, hidden = new_weights, new_pointers, new_hidden
            all_weights.append(weights)
        weights = torch.stack(all_weights, dim=1)  # (units*batch, steps, 1, slots)
        weights = weights.reshape(units, batch, num_steps, slots)  # (units, batch, steps, slots)
        return weights.permute(1, 2, 0, 3), pointers.transpose(0, 1), hidden.transpose(0, 1)
