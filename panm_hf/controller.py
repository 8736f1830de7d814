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

With ``content_read="controller"`` (the authors' code, beyond the paper's equations) the
Controller also attends over ``M`` with its previous state, and the attended value joins the
GRU input and ``g^o``'s input; the reads then depend on the Controller's state, so the steps
run one at a time (``attentive_forward``).

With ``controller_cell="lstm"`` (beyond the paper) an ``nn.LSTM`` takes the GRU's place: its additive cell
state can hold a count that does not saturate (Weiss et al. 2018). Its state ``h^c_t`` is ``[h, c]``
(``c_0 = 0``), so the cache and beam search carry it as they carry the GRU's; ``g^o`` reads ``h``.

With ``controller_truncation`` K (beyond the paper) the recurrence's gradient is cut in training: the state enters
every K-th step detached (the first cut drawn from steps 1-K per call), so no gradient asks it to carry anything
further than K steps. The forward pass is the same. With ``controller_reset_rate`` p (beyond the paper) a sample's
state is set back, with probability p, to the one it entered the call with at one step drawn per call (training only).
"""

from __future__ import annotations

import torch
from torch import nn

from panm_hf.kernels.dispatch import Call, decide, fused_op, require
from panm_hf.kernels.linear_rows import linear, linear_rows, mlp

from .memory_config import PanmMemoryConfig, content_read_dropout_rate
from .reads import ControllerContentReader


def drop_samples(hidden_states: torch.Tensor, probability: float, per_step: bool = False) -> torch.Tensor:
    """Stochastic depth over a `(batch, steps, dim)` tensor: each sample is kept at every step or zeroed at every
    step, with `probability` (with `per_step`, each (sample, step) on its own); kept ones are scaled by
    `1 / (1 - probability)`."""
    batch, steps = hidden_states.shape[:2]
    keep = torch.rand(batch, steps if per_step else 1, 1, device=hidden_states.device) >= probability  # (b, 1|t, 1)
    return hidden_states * keep.to(hidden_states.dtype) / (1.0 - probability)


class Controller(nn.Module):
    """Controller GRU plus output MLP `g^o`.

    Args:
        config: the PANM hyperparameters; reads `controller_hidden_size` (GRU size), `mlp_hidden_size`
            (width of `g^o`), `controller_init` (`"mean"` or `"sum"` of the real memory slots for `h^c_0`) and
            `recurrence_kernel` (`nn.GRU`, the reference, or one fused kernel for all steps on CPU).
        read_size: size of the concatenated Mode-1 and Mode-2 values (and a `z_t`-queried content read).
        decoder_input_size: size of `z_t` (0 when the Controller has no decoder input).
        memory_dim: size of a memory slot (for the initial state).
        output_size: size of the output.
        undecoded_output: also return `g^o`'s output with its `z_t` columns left out (when `g^o` reads `z_t`,
            `output_decoder_input`): the output of the reads and `h^c_t` alone, for a stop decision the
            decoder's state does not enter (`PanmConfig.eos_decision="panm"`).
    """

    def __init__(
        self,
        config: PanmMemoryConfig,
        *,
        read_size: int,
        decoder_input_size: int,
        memory_dim: int,
        output_size: int,
        undecoded_output: bool = False,
    ):
        super().__init__()
        hidden_size = self.hidden_size = config.controller_hidden_size
        self.init = config.controller_init
        self.recurrence_kernel = config.recurrence_kernel
        self.truncation = config.controller_truncation
        self.reset_rate = config.controller_reset_rate
        self.decoder_input_size = decoder_input_size
        # beyond the paper: g^o also reads z_t (`output_decoder_input`), a path to the output beside the GRU
        output_decoder_size = decoder_input_size if config.output_decoder_input else 0
        self.output_reads_decoder = output_decoder_size > 0
        self.undecoded_output = undecoded_output and self.output_reads_decoder
        self.decoder_drop_path = config.output_decoder_drop_path if self.output_reads_decoder else 0.0
        self.decoder_drop_per_step = config.output_decoder_drop_scope == "step"
        self.initial_state = nn.Linear(memory_dim, hidden_size)
        # the authors' state-driven attention over M; its value is the last part of the GRU and g^o inputs
        self.content_reader = (
            ControllerContentReader(hidden_size=hidden_size, memory_dim=memory_dim)
            if config.content_read == "controller"
            else None
        )
        self.content_dropout = nn.Dropout(content_read_dropout_rate(config))
        content_size = memory_dim if self.content_reader is not None else 0
        input_size = read_size + decoder_input_size + content_size
        # the cell the config names, the other None (its state-dict keys: `gru.*` or `lstm.*`)
        self.gru = nn.GRU(input_size, hidden_size, batch_first=True) if config.controller_cell == "gru" else None
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True) if config.controller_cell == "lstm" else None
        # `mlp_dropout` joins the activation, so the two linears keep their indices (and checkpoints their keys)
        activation = nn.Sequential(nn.ReLU(), nn.Dropout(config.mlp_dropout)) if config.mlp_dropout > 0 else nn.ReLU()
        self.output_mlp = nn.Sequential(
            nn.Linear(read_size + content_size + hidden_size + output_decoder_size, config.mlp_hidden_size),
            activation,
            nn.Linear(config.mlp_hidden_size, output_size),
        )

    def initial_hidden(self, memory_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`h^c_0` from the real slots only: `(batch, slots, dim)` -> `(batch, hidden)`."""
        call = Call(self.recurrence_kernel, memory_states.device, memory_states.dtype)
        if (pool := fused_op("controller_pool", call)) is not None:  # the masked sum/mean in one kernel each way
            pooled = pool(memory_states, attention_mask, self.init == "mean")
            return self._with_cell(linear(self.initial_state, pooled))  # (batch, hidden), [h, c] for an LSTM
        mask = attention_mask.unsqueeze(-1).to(memory_states.dtype)  # (batch, slots, 1)
        pooled = (memory_states * mask).sum(dim=1)  # (batch, dim)
        if self.init == "mean":
            pooled = pooled / mask.sum(dim=1).clamp(min=1.0)
        return self._with_cell(linear(self.initial_state, pooled))  # (batch, hidden), [h, c] for an LSTM

    def _with_cell(self, hidden: torch.Tensor) -> torch.Tensor:
        """`h_0` -> the Controller's state: itself for the GRU, `[h_0, c_0 = 0]` `(batch, 2*hidden)` for the LSTM."""
        return hidden if self.lstm is None else torch.cat([hidden, torch.zeros_like(hidden)], dim=-1)

    def _lstm(
        self, inputs: torch.Tensor, hidden: torch.Tensor, step_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM over `(batch, steps, in)` from `[h, c]` `(batch, 2*hidden)`: `(h per step (batch, steps,
        hidden), [h, c] after the last step, or after each row's last True step of `step_mask`)`."""
        h, c = (part.unsqueeze(0).contiguous() for part in hidden.chunk(2, dim=-1))  # (1, batch, hidden) each
        if step_mask is None:  # one nn.LSTM call over all steps
            states, (h, c) = self.lstm(inputs, (h, c))  # (batch, steps, hidden), (1, batch, hidden) each
            return states, torch.cat([h.squeeze(0), c.squeeze(0)], dim=-1)
        states = []
        for t in range(inputs.shape[1]):  # causal decoding with padding: a step outside the mask keeps [h, c]
            state, (new_h, new_c) = self.lstm(inputs[:, t : t + 1], (h, c))  # (batch, 1, hidden), (1, b, hidden)
            keep = step_mask[:, t].reshape(1, -1, 1)  # (1, batch, 1)
            h, c = torch.where(keep, new_h, h), torch.where(keep, new_c, c)
            states.append(state)
        return torch.cat(states, dim=1), torch.cat([h.squeeze(0), c.squeeze(0)], dim=-1)  # (b, steps, hidden), ...

    def _kernel_call(self, inputs: torch.Tensor, hidden: torch.Tensor) -> Call:
        """The GRU call as `panm_hf.kernels.dispatch` sees it."""
        tensors = [inputs, hidden, *self.gru.parameters()]
        uniform = len({t.dtype for t in tensors}) == 1 and len({t.device for t in tensors}) == 1
        return Call(self.recurrence_kernel, hidden.device, hidden.dtype, uniform=uniform,
                    controller_read=self.content_reader is not None)  # fmt: skip

    def fused_unavailable_reason(self, inputs: torch.Tensor, hidden: torch.Tensor) -> str | None:
        """Why the GRU cannot run as one fused kernel on these inputs; None when it can (on CUDA, cuDNN's
        `nn.GRU` is that kernel)."""
        if self.lstm is not None:
            return 'controller_cell="lstm" runs as nn.LSTM (the fused kernels are the GRU\'s)'
        return decide("controller_gru", self._kernel_call(inputs, hidden)).reason

    @staticmethod
    def _input_rows(
        reads: torch.Tensor, decoder_states: torch.Tensor | None, hidden: torch.Tensor
    ) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`(batch, steps, read rows (batch*steps, read_size), GRU input rows [reads, z_t], z_t rows or None)`."""
        batch = hidden.shape[0]
        steps = reads.shape[1] if reads.dim() == 3 else reads.shape[0] // max(batch, 1)
        # every linear runs on 2-D rows: on 3-D inputs each adds two views forward and two backward
        rows = reads if reads.dim() == 2 else reads.reshape(batch * steps, -1)  # (batch*steps, read_size)
        if decoder_states is None:
            return batch, steps, rows, rows, None
        decoder_rows = decoder_states.reshape(batch * steps, -1).to(reads.dtype)  # (batch*steps, decoder_input)
        return batch, steps, rows, torch.cat([rows, decoder_rows], dim=-1), decoder_rows

    def output(
        self, parts: list[torch.Tensor], decoder_rows: torch.Tensor | None, batch: int, steps: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`g^o` over its input rows (`parts`, then the `z_t` rows when `g^o` reads the decoder state):
        `(outputs (batch, steps, out), the outputs without the z_t columns (batch, steps, out) or None)`."""
        if self.training and self.decoder_drop_path > 0 and decoder_rows is not None:
            # a sample's g^o sees its z_t at every step or at none (`output_decoder_drop_path`; or per step)
            dropped = drop_samples(
                decoder_rows.reshape(batch, steps, -1), self.decoder_drop_path, self.decoder_drop_per_step
            )  # (batch, steps, in)
            decoder_rows = dropped.reshape(batch * steps, -1)  # (batch*steps, decoder_input)
        rows = torch.cat([*parts, decoder_rows] if self.output_reads_decoder else parts, dim=-1)  # (b*steps, in)
        outputs = mlp(self.output_mlp, rows).reshape(batch, steps, -1)  # (batch, steps, out)
        if not self.undecoded_output:
            return outputs, None
        # the first layer again on the other columns (a view of `rows`, no copy): splitting the full output's
        # matmul at the z_t columns would change its rounding, and every other logit must equal "shared"'s exactly
        first, activation, last = self.output_mlp
        own_rows = rows[:, : rows.shape[-1] - self.decoder_input_size]  # (batch*steps, in - decoder_input)
        hidden = nn.functional.linear(own_rows, first.weight[:, : own_rows.shape[-1]], first.bias)  # (b*steps, mlp)
        return outputs, last(activation(hidden)).reshape(batch, steps, -1)  # (batch, steps, out) each

    def forward(
        self,
        reads: torch.Tensor,
        decoder_states: torch.Tensor | None,
        hidden: torch.Tensor,
        step_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Run the Controller over all steps.

        Args:
            reads: `(batch, steps, read_size)` concatenated Mode-1 and Mode-2 values, or their rows
                `(batch*steps, read_size)` (as `PanmMemory` passes them: no reshape either way).
            decoder_states: `(batch, steps, decoder_input_size)` `z_t`, or None.
            hidden: `(batch, hidden)` previous state `h^c_{t-1}`.
            step_mask: `(batch, steps)` bool whose True steps form a prefix of each row (causal decoding
                of right-aligned padding); the returned state is the one after the last True step.

        Returns:
            `(outputs (batch, steps, output_size), last hidden (batch, hidden), the outputs without g^o's z_t
            columns (batch, steps, output_size) with `undecoded_output`, else None)`.
        """
        batch, steps, rows, inputs, decoder_rows = self._input_rows(reads, decoder_states, hidden)
        if self.lstm is not None:  # controller_cell="lstm": nn.LSTM; its state carries [h, c]
            states, last = self._over_spans(
                lambda span, state, start, end: self._lstm(
                    span, state, None if step_mask is None else step_mask[:, start:end]
                ),
                inputs.reshape(batch, steps, -1),  # (batch, steps, lstm input)
                hidden,
            )  # (batch, steps, hidden), [h, c] after the last step
            state_rows = states.reshape(batch * steps, -1).to(reads.dtype)  # (batch*steps, hidden)
            outputs, undecoded = self.output([rows, state_rows], decoder_rows, batch, steps)  # (b, steps, out)
            return outputs, last, undecoded
        states, last = self._gru(inputs, hidden, batch, steps)  # (batch, steps, hidden), (batch, hidden)
        state_rows = states.reshape(batch * steps, -1).to(reads.dtype)  # (batch*steps, hidden)
        outputs, undecoded = self.output([rows, state_rows], decoder_rows, batch, steps)  # (batch, steps, out)
        if step_mask is not None:  # the state after each row's last real step (or h_{t-1} if none)
            count = step_mask.long().sum(dim=1)  # (batch,)
            index = (count - 1).clamp(min=0).reshape(-1, 1, 1).expand(-1, 1, states.shape[-1])  # (batch, 1, hidden)
            last = torch.where((count > 0).unsqueeze(-1), states.gather(1, index).squeeze(1), hidden)
        return outputs, last, undecoded

    def truncated_spans(self, steps: int) -> list[tuple[int, int]]:
        """The `(start, end)` step spans the recurrence's gradient stays inside: `[(0, steps)]`, or in training
        with `controller_truncation` K, spans of K steps after a first one of 1-K steps (drawn per call), so
        that where the cuts fall moves from batch to batch."""
        if not (self.training and self.truncation) or steps <= 1:
            return [(0, steps)]
        first = int(torch.randint(1, self.truncation + 1, ()).item())
        starts = [0, *range(first, steps, self.truncation)]
        return list(zip(starts, [*starts[1:], steps]))

    def _gru(self, inputs: torch.Tensor, hidden: torch.Tensor, batch: int, steps: int) -> tuple[torch.Tensor, ...]:
        """The GRU over the input rows `(batch*steps, in)` from `(batch, hidden)`, span by span
        (`truncated_spans`): `(states (batch, steps, hidden), the state after the last step (batch, hidden))`."""
        kernel = require("controller_gru", self._kernel_call(inputs, hidden), "the Controller GRU here").kernel
        gru = self.gru
        if kernel in ("c", "triton"):  # all of a span's steps in one kernel (the C one, or its Triton port)
            inputs = linear_rows(inputs, gru.weight_ih_l0, gru.bias_ih_l0)  # (batch*steps, 3*hidden)
            op = torch.ops.panm_hf.gru_recurrence_triton if kernel == "triton" else torch.ops.panm_hf.gru_recurrence

            def run(span, state, *_):  # the op's third output: the gates its backward keeps
                return op(span.contiguous(), state, gru.weight_hh_l0, gru.bias_hh_l0)[:2]
        else:
            def run(span, state, *_):  # nn.GRU's state is (layers, batch, hidden)
                span_states, last = gru(span, state.unsqueeze(0).contiguous())  # (batch, span, hidden), (1, b, h)
                return span_states, last.squeeze(0)
        return self._over_spans(run, inputs.reshape(batch, steps, -1), hidden)  # (batch, steps, gru input or gates)

    def _over_spans(self, run, inputs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`run(span inputs (batch, span, in), state, start, end) -> (states (batch, span, hidden), last state)` over
        `truncated_spans`, the state entering each span after the first detached, and split again at the step
        `reset_draw` draws: `(states (batch, steps, hidden), the state after the last step)`."""
        steps = inputs.shape[1]
        spans = self.truncated_spans(steps)
        reset_step, chosen = self.reset_draw(hidden, steps)
        starts = sorted({start for start, _ in spans} | ({reset_step} if reset_step else set()))
        detached = {start for start, _ in spans[1:]}
        states, last = [], hidden
        for start, end in zip(starts, [*starts[1:], steps]):
            state = last.detach() if start in detached else last
            state = torch.where(chosen, hidden, state) if start == reset_step else state  # back to the call's state
            span_states, last = run(inputs[:, start:end], state, start, end)
            states.append(span_states)  # (batch, span, hidden)
        return (states[0] if len(states) == 1 else torch.cat(states, dim=1)), last

    def reset_draw(self, hidden: torch.Tensor, steps: int) -> tuple[int | None, torch.Tensor | None]:
        """`controller_reset_rate`'s draw for one call, in training: `(the step whose incoming state is reset, the
        samples reset there (batch, 1) bool)`, or `(None, None)`."""
        if not (self.training and self.reset_rate > 0) or steps <= 1:
            return None, None
        step = int(torch.randint(1, steps, ()).item())
        return step, torch.rand(hidden.shape[0], 1, device=hidden.device) < self.reset_rate  # (batch, 1)

    def fixed_gates(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cell's input projection of the columns known before a stepwise loop, for all steps at once.

        `inputs (rows, k)`: the first `k` columns of the cell's input. Returns `(their gates with the input bias
        (rows, gates), the input weight's other columns (gates, in - k))`, the latter for the columns each step
        adds (`cell_step` takes their sum)."""
        cell = self.gru if self.gru is not None else self.lstm
        weight, fixed_size = cell.weight_ih_l0, inputs.shape[-1]
        gates = nn.functional.linear(inputs, weight[:, :fixed_size], cell.bias_ih_l0)  # (rows, gates)
        return gates, weight[:, fixed_size:]

    def cell_step(self, input_gates: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """One step of the cell (`nn.GRU`'s or `nn.LSTM`'s equations and parameters) from its input gates
        `(batch, gates)` (input projection and bias applied) and state `(batch, hidden)` (an LSTM's `[h, c]`)."""
        if self.lstm is not None:
            lstm = self.lstm
            h, c = hidden.chunk(2, dim=-1)  # (batch, hidden) each
            gates = input_gates + nn.functional.linear(h, lstm.weight_hh_l0, lstm.bias_hh_l0)  # (batch, 4*hidden)
            input_gate, forget, cell, output = gates.chunk(4, dim=-1)  # nn.LSTM's order i, f, g, o
            c = torch.sigmoid(forget) * c + torch.sigmoid(input_gate) * torch.tanh(cell)
            return torch.cat([torch.sigmoid(output) * torch.tanh(c), c], dim=-1)  # (batch, 2*hidden)
        gru = self.gru
        hidden_gates = nn.functional.linear(hidden, gru.weight_hh_l0, gru.bias_hh_l0)  # (batch, 3*hidden)
        input_r, input_z, input_n = input_gates.chunk(3, dim=-1)  # nn.GRU's order r, z, n
        hidden_r, hidden_z, hidden_n = hidden_gates.chunk(3, dim=-1)
        reset = torch.sigmoid(input_r + hidden_r)
        update = torch.sigmoid(input_z + hidden_z)
        candidate = torch.tanh(input_n + reset * hidden_n)
        return (1 - update) * candidate + update * hidden  # (batch, hidden)

    def attentive_forward(
        self,
        reads: torch.Tensor,
        decoder_states: torch.Tensor | None,
        hidden: torch.Tensor,
        memory_states: torch.Tensor,
        attention_mask: torch.Tensor,
        step_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Run the Controller with its state-driven attention (`content_read="controller"`), step by step.

        Step `t`: `c_t = attend(h^c_{t-1}, M)`, `h^c_t = GRU([reads_t, z_t, c_t], h^c_{t-1})`,
        output `g^o([reads_t, c_t, h^c_t])`. The GRU keeps `nn.GRU`'s parameters (and gate order r, z, n);
        the part of its input that does not depend on the state is projected for all steps at once.

        Args:
            reads, decoder_states, hidden, step_mask: as in `forward` (a step outside `step_mask` leaves
                the state unchanged).
            memory_states: `(batch, slots, memory_dim)` the memory `M`.
            attention_mask: `(batch, slots)` bool, or `(batch, steps, slots)` per step (causal decoding).

        Returns:
            `(outputs (batch, steps, output_size), last hidden (batch, hidden), weights (batch, steps, slots),
            the outputs without g^o's z_t columns or None)`, as `forward`.
        """
        reader = self.content_reader
        if reader is None:
            raise ValueError('attentive_forward needs content_read="controller"; call forward instead.')
        batch, steps, rows, inputs, decoder_rows = self._input_rows(reads, decoder_states, hidden)
        fixed_gates, weight_content = self.fixed_gates(inputs)  # (batch*steps, 3*hidden), (3*hidden, content)
        fixed_gates = fixed_gates.reshape(batch, steps, -1)  # (batch, steps, 3*hidden)
        keys = reader.key(memory_states)  # (batch, slots, dim), once for all steps
        states, contents, weights = [], [], []
        cuts = {start for start, _ in self.truncated_spans(steps)[1:]}  # steps whose incoming state is detached
        initial, (reset_step, chosen) = hidden, self.reset_draw(hidden, steps)
        for t in range(steps):
            hidden = hidden.detach() if t in cuts else hidden
            hidden = torch.where(chosen, initial, hidden) if t == reset_step else hidden
            mask = attention_mask if attention_mask.dim() == 2 else attention_mask[:, t]  # (batch, slots)
            content, weight = reader(hidden, keys, memory_states, mask)  # (batch, dim), (batch, slots)
            content = self.content_dropout(content)
            new_hidden = self.cell_step(fixed_gates[:, t] + nn.functional.linear(content, weight_content), hidden)
            if step_mask is not None:  # a padded step keeps the state
                new_hidden = torch.where(step_mask[:, t].unsqueeze(-1), new_hidden, hidden)
            hidden = new_hidden
            states.append(hidden)
            contents.append(content)
            weights.append(weight)
        state_rows = torch.stack(states, dim=1).reshape(batch * steps, -1)  # (batch*steps, hidden)
        content_rows = torch.stack(contents, dim=1).reshape(batch * steps, -1)  # (batch*steps, dim)
        outputs, undecoded = self.output([rows, content_rows, state_rows], decoder_rows, batch, steps)  # (b, t, out)
        return outputs, hidden, torch.stack(weights, dim=1), undecoded  # ..., (batch, steps, slots), ...
