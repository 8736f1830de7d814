"""The Controller (paper, Sec. 2.3.3, Eq. 7 and the output MLP).

A GRU reads ``[Mode-1 values, Mode-2 values, z_t]`` and an MLP ``g^o`` maps
``[Mode-1 values, Mode-2 values, h^c_t]`` to the output. Because the reads do
not depend on the Controller's state, all steps of a teacher-forced sequence
run through one (cuDNN-able) ``nn.GRU`` call.

Initial state ``h^c_0``: the paper sets it to ``sum_i M[i]``. A sum grows with the
input length, which pushes ``h^c_0`` out of the GRU's (-1, 1) range on inputs
several times longer than in training, so the default is a projected mean of
the real memory slots (``controller_init="mean"``); ``"sum"`` keeps the paper's
choice (also projected, since ``d_m`` and the GRU size may differ).
"""

from __future__ import annotations

import torch
from torch import nn

from .memory_config import PanmMemoryConfig
from .recurrence_kernel import unavailable_reason


class Controller(nn.Module):
    """Controller GRU plus output MLP `g^o`.

    Args:
        config: the PANM hyperparameters; reads `controller_hidden_size` (GRU size), `mlp_hidden_size`
            (width of `g^o`), `controller_init` (`"mean"` or `"sum"` of the real memory slots for `h^c_0`) and
            `recurrence_kernel` (`nn.GRU`, the reference, or one fused kernel for all steps on CPU).
        read_size: size of the concatenated Mode-1 and Mode-2 values.
        decoder_input_size: size of `z_t` (0 when the Controller has no decoder input).
        memory_dim: size of a memory slot (for the initial state).
        output_size: size of the output.
    """

    def __init__(
        self, config: PanmMemoryConfig, *, read_size: int, decoder_input_size: int, memory_dim: int, output_size: int
    ):
        super().__init__()
        hidden_size = config.controller_hidden_size
        self.init = config.controller_init
        self.recurrence_kernel = config.recurrence_kernel
        self.decoder_input_size = decoder_input_size
        self.initial_state = nn.Linear(memory_dim, hidden_size)
        self.gru = nn.GRU(read_size + decoder_input_size, hidden_size, batch_first=True)
        self.output_mlp = nn.Sequential(
            nn.Linear(read_size + hidden_size, config.mlp_hidden_size),
            nn.ReLU(),
            nn.Linear(config.mlp_hidden_size, output_size),
        )

    def initial_hidden(self, memory_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`h^c_0` from the real slots only: `(batch, slots, dim)` -> `(batch, hidden)`."""
        if self.recurrence_kernel != "eager" and memory_states.device.type == "cpu" and (
            unavailable_reason(memory_states.dtype, memory_states.device) is None
        ):  # the masked sum/mean in one C kernel, forward and backward
            pooled = torch.ops.panm_hf.masked_pool(memory_states, attention_mask, self.init == "mean")
            return self.initial_state(pooled)
        mask = attention_mask.unsqueeze(-1).to(memory_states.dtype)  # (batch, slots, 1)
        pooled = (memory_states * mask).sum(dim=1)  # (batch, dim)
        if self.init == "mean":
            pooled = pooled / mask.sum(dim=1).clamp(min=1.0)
        return self.initial_state(pooled)

    def fused_unavailable_reason(self, inputs: torch.Tensor, hidden: torch.Tensor) -> str | None:
        """Why the GRU cannot run as one fused kernel on these inputs; None when it can (on CUDA, cuDNN's
        `nn.GRU` is that kernel)."""
        if inputs.device.type == "cuda":
            return None
        tensors = [inputs, hidden, *self.gru.parameters()]
        if len({t.dtype for t in tensors}) > 1 or len({t.device for t in tensors}) > 1:
            return "the inputs, state and GRU parameters differ in dtype or device"
        return unavailable_reason(hidden.dtype, hidden.device)

    def forward(
        self,
        reads: torch.Tensor,
        decoder_states: torch.Tensor | None,
        hidden: torch.Tensor,
        step_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the Controller over all steps.

        Args:
            reads: `(batch, steps, read_size)` concatenated Mode-1 and Mode-2 values, or their rows
                `(batch*steps, read_size)` (as `PanmMemory` passes them: no reshape either way).
            decoder_states: `(batch, steps, decoder_input_size)` `z_t`, or None.
            hidden: `(batch, hidden)` previous state `h^c_{t-1}`.
            step_mask: `(batch, steps)` bool whose True steps form a prefix of each row (causal decoding
                of right-aligned padding); the returned state is the one after the last True step.

        Returns:
            `(outputs (batch, steps, output_size), last hidden (batch, hidden))`.
        """
        batch = hidden.shape[0]
        steps = reads.shape[1] if reads.dim() == 3 else reads.shape[0] // max(batch, 1)
        # every linear runs on 2-D rows: on 3-D inputs each adds two views forward and two backward
        rows = reads if reads.dim() == 2 else reads.reshape(batch * steps, -1)  # (batch*steps, read_size)
        inputs = rows
        if decoder_states is not None:
            decoder_rows = decoder_states.reshape(batch * steps, -1).to(reads.dtype)  # (batch*steps, decoder_input)
            inputs = torch.cat([rows, decoder_rows], dim=-1)
        reason = self.fused_unavailable_reason(inputs, hidden) if self.recurrence_kernel != "eager" else None
        if self.recurrence_kernel == "fused" and reason is not None:
            raise ValueError(
                f'recurrence_kernel="fused" cannot run the Controller GRU here: {reason}. Use '
                'recurrence_kernel="auto" (fused where it applies) or "eager".'
            )
        if self.recurrence_kernel != "eager" and reason is None and not inputs.is_cuda:  # all steps in one kernel
            gru = self.gru
            input_gates = nn.functional.linear(inputs, gru.weight_ih_l0, gru.bias_ih_l0)  # (batch*steps, 3*hidden)
            input_gates = input_gates.reshape(batch, steps, -1)  # (batch, steps, 3*hidden)
            states, last, _ = torch.ops.panm_hf.gru_recurrence(input_gates, hidden, gru.weight_hh_l0, gru.bias_hh_l0)
        else:
            inputs = inputs.reshape(batch, steps, -1)  # (batch, steps, gru input)
            states, last = self.gru(inputs, hidden.unsqueeze(0).contiguous())  # (batch, steps, hidden), (1, b, hidden)
            last = last.squeeze(0)  # (batch, hidden)
        state_rows = states.reshape(batch * steps, -1).to(reads.dtype)  # (batch*steps, hidden)
        outputs = self.output_mlp(torch.cat([rows, state_rows], dim=-1)).reshape(batch, steps, -1)  # (b, steps, out)
        if step_mask is not None:  # the state after each row's last real step (or h_{t-1} if none)
            count = step_mask.long().sum(dim=1)  # (batch,)
            index = (count - 1).clamp(min=0).reshape(-1, 1, 1).expand(-1, 1, states.shape[-1])  # (batch, 1, hidden)
            last = torch.where((count > 0).unsqueeze(-1), states.gather(1, index).squeeze(1), hidden)
        return outputs, last
