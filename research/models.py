"""Sequence models for the algorithmic length-generalisation suite (paper, Sec. 3.1).

Every model maps slot features `(batch, slots, features)` plus their mask to
10-way token logits for `num_steps` target steps, with **no teacher forcing**:
the decoder sees no target token, only a constant (zero) input at every step.
All share one slot encoder (a linear embedding and an LSTM) so that the only
difference between them is how the decoder reads the encoder's memory:

* ``panm``:      PANM (`panm_hf.PanmMemory`, the library's memory core) with `z_t = 0`.
* ``lstm``:      LSTM seq2seq, the decoder starts from the encoder's final state.
* ``content``:   Bahdanau (additive, content-based) attention decoder.
* ``location``:  Luong location-based attention, `a_t = softmax(W_a h_t)` over slot positions.
* ``transformer``: Transformer encoder-decoder; decoder queries are positional encodings.
* ``panm_shift``, ``panm_distract``: PANM with a beyond-the-paper option switched on
  (`PANM_VARIANTS`: content-free pointer arithmetic, training-time distractor addresses).
* ``panm_linear``: PANM with the authors' affine address keys `g^a` (`address_key="linear"`) in place
  of the paper's text's MLP.
* ``panm_ctrl``, ``panm_shift_ctrl``: PANM (or `shift`) with the authors' Controller attention
  (`content_read="controller"`: Bahdanau attention over `M` queried by the Controller state).

`build_model(name, feature_dim)` builds one with the suite's default sizes
(about 1M parameters each; PANM takes `PanmMemoryConfig`'s defaults, which follow the
paper: `H^a = 2`, `H^c = 1`, 256-d GRUs, `b = 10`, cosine scoring with a learnable
inverse temperature starting at 15, `h^c_0` from the mean of the memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from einops import rearrange
from torch import nn

from panm_hf import PanmMemory, PanmMemoryConfig
from panm_hf.attention import masked_softmax

from .algorithmic import NUM_TOKENS

# PANM variants of the suite: the faithful model and each beyond-the-paper option (core flags).
PANM_VARIANTS = {
    "panm": {},
    "panm_shift": {"pointer_update": "shift", "shift_range": 1},
    "panm_distract": {"address_distractors": 8},
    "panm_linear": {"address_key": "linear"},
    "panm_ctrl": {"content_read": "controller"},
    "panm_shift_ctrl": {"pointer_update": "shift", "shift_range": 1, "content_read": "controller"},
}
MODEL_NAMES = (*PANM_VARIANTS, "lstm", "content", "location", "transformer")


@dataclass
class AlgorithmicModelOutput:
    """Output of every model of the suite.

    Attributes:
        logits: `(batch, steps, 10)` token logits.
        address_attentions: PANM only, `(batch, steps, units, slots)` Mode-1 address attention.
        attentions: attention baselines only, `(batch, steps, slots)` decoder attention.
    """

    logits: torch.Tensor
    address_attentions: torch.Tensor | None = None
    attentions: torch.Tensor | None = None


class SlotEncoder(nn.Module):
    """Linear slot embedding followed by an LSTM: `(batch, slots, features)` -> `(batch, slots, hidden)`.

    Args:
        feature_dim: width of the slot features.
        hidden_size: size of the output states (split over the two directions if bidirectional).
        bidirectional: run the LSTM both ways and concatenate.
    """

    def __init__(self, feature_dim: int, hidden_size: int, *, bidirectional: bool = True):
        super().__init__()
        if bidirectional and hidden_size % 2:
            raise ValueError(f"hidden_size={hidden_size} must be even for a bidirectional encoder.")
        self.hidden_size = hidden_size
        self.embed = nn.Linear(feature_dim, hidden_size)
        self.lstm = nn.LSTM(
            hidden_size,
            hidden_size // 2 if bidirectional else hidden_size,
            batch_first=True,
            bidirectional=bidirectional,
        )

    def forward(
        self, inputs: torch.Tensor, attention_mask: torch.Tensor, *, with_summary: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return `(states (batch, slots, hidden), summary (batch, hidden))`, padding zeroed.

        The summary is the state at each sample's last real slot (forward direction)
        concatenated with the backward state at slot 0, so right padding never leaks in;
        None with `with_summary=False` (PANM reads the states only: no glue ops for it).
        """
        lengths = attention_mask.sum(dim=-1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(inputs), lengths, batch_first=True, enforce_sorted=False)
        states, (final, _) = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=inputs.shape[1])
        if not with_summary:
            return states, None
        summary = rearrange(final, "dirs b h -> b (dirs h)")  # (batch, hidden)
        return states, summary


def _check_inputs(inputs: torch.Tensor, attention_mask: torch.Tensor, num_steps: int) -> None:
    if inputs.dim() != 3:
        raise ValueError(f"inputs must have shape (batch, slots, features); got {tuple(inputs.shape)}.")
    if tuple(attention_mask.shape) != tuple(inputs.shape[:2]):
        raise ValueError(
            f"attention_mask must have shape {tuple(inputs.shape[:2])} to match inputs; "
            f"got {tuple(attention_mask.shape)}."
        )
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int (the number of target steps); got {num_steps!r}.")


class PanmSeq2Seq(nn.Module):
    """PANM with an LSTM encoder and no decoder input (`z_t = 0`, paper Sec. 3.1).

    Args:
        feature_dim: width of the slot features.
        config: the PANM hyperparameters; `PanmMemoryConfig()` (the paper's) when None.
        memory_dim: encoder size `d_m` (the memory slots).
        bidirectional: bidirectional encoder.
    """

    def __init__(
        self,
        feature_dim: int,
        config: PanmMemoryConfig | None = None,
        *,
        memory_dim: int = 128,
        bidirectional: bool = True,
    ):
        super().__init__()
        self.encoder = SlotEncoder(feature_dim, memory_dim, bidirectional=bidirectional)
        config = config if config is not None else PanmMemoryConfig()
        self.memory = PanmMemory(config, memory_dim=memory_dim, decoder_input_size=0, output_size=NUM_TOKENS)

    def forward(
        self,
        inputs: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
        *,
        output_attentions: bool = False,
        generator: torch.Generator | None = None,
    ) -> AlgorithmicModelOutput:
        """Decode `num_steps` token logits; `generator` seeds the training-time base address."""
        _check_inputs(inputs, attention_mask, num_steps)
        states, _ = self.encoder(inputs, attention_mask, with_summary=False)
        memory = self.memory.bind(states, attention_mask, generator=generator)
        out = self.memory(memory, num_steps=num_steps, output_attentions=output_attentions)
        return AlgorithmicModelOutput(logits=out.hidden_states, address_attentions=out.address_attentions)


class LstmSeq2Seq(nn.Module):
    """LSTM encoder-decoder; the decoder reads a constant zero input from the encoder's final state.

    Args:
        feature_dim: width of the slot features.
        hidden_size: encoder and decoder size.
    """

    def __init__(self, feature_dim: int, *, hidden_size: int = 320):
        super().__init__()
        self.encoder = SlotEncoder(feature_dim, hidden_size, bidirectional=False)
        self.decoder = nn.LSTM(1, hidden_size, batch_first=True)
        self.output = nn.Linear(hidden_size, NUM_TOKENS)

    def forward(
        self, inputs: torch.Tensor, attention_mask: torch.Tensor, num_steps: int, **_
    ) -> AlgorithmicModelOutput:
        _check_inputs(inputs, attention_mask, num_steps)
        _, summary = self.encoder(inputs, attention_mask)  # (batch, hidden)
        zeros = inputs.new_zeros(inputs.shape[0], num_steps, 1)  # (batch, steps, 1)
        start = summary.unsqueeze(0).contiguous()  # (1, batch, hidden)
        states, _ = self.decoder(zeros, (start, torch.zeros_like(start)))  # (batch, steps, hidden)
        return AlgorithmicModelOutput(logits=self.output(states))


class AttentionSeq2Seq(nn.Module):
    """LSTM encoder + attentional LSTM decoder with input feeding and no teacher forcing.

    ``attention="content"`` is Bahdanau's additive attention, scored from the
    previous decoder state against every memory slot; ``attention="location"`` is
    Luong's location-based attention, `a_t = softmax(W_a h_t)`: one learned score
    per slot *position*, independent of the slots' content (positions beyond
    `max_slots` cannot be addressed).

    Args:
        feature_dim: width of the slot features.
        attention: `"content"` or `"location"`.
        memory_dim: encoder size.
        hidden_size: decoder LSTM size.
        max_slots: number of positions of location attention.
    """

    def __init__(
        self,
        feature_dim: int,
        *,
        attention: str = "content",
        memory_dim: int = 256,
        hidden_size: int = 256,
        max_slots: int = 128,
    ):
        super().__init__()
        if attention not in ("content", "location"):
            raise ValueError(f"attention={attention!r} is not supported; choose 'content' or 'location'.")
        self.attention = attention
        self.max_slots = max_slots
        self.encoder = SlotEncoder(feature_dim, memory_dim, bidirectional=True)
        self.start_state = nn.Linear(memory_dim, hidden_size)
        self.cell = nn.LSTMCell(memory_dim, hidden_size)
        if attention == "content":
            self.query = nn.Linear(hidden_size, memory_dim, bias=False)
            self.key = nn.Linear(memory_dim, memory_dim)
            self.score = nn.Linear(memory_dim, 1, bias=False)
        else:
            self.position_scores = nn.Linear(hidden_size, max_slots)
        self.output = nn.Sequential(nn.Linear(hidden_size + memory_dim, hidden_size), nn.Tanh())
        self.classifier = nn.Linear(hidden_size, NUM_TOKENS)

    def _attend(self, hidden: torch.Tensor, states: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor):
        if self.attention == "content":
            scores = self.score(torch.tanh(keys + self.query(hidden).unsqueeze(1))).squeeze(-1)  # (batch, slots)
        else:
            scores = self.position_scores(hidden)[:, : states.shape[1]]  # (batch, slots)
        weights = masked_softmax(scores, mask)  # (batch, slots)
        return torch.einsum("bs,bsd->bd", weights, states), weights

    def forward(
        self,
        inputs: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
        *,
        output_attentions: bool = False,
        **_,
    ) -> AlgorithmicModelOutput:
        _check_inputs(inputs, attention_mask, num_steps)
        if self.attention == "location" and inputs.shape[1] > self.max_slots:
            raise ValueError(
                f"Location attention has max_slots={self.max_slots} positions but the input has "
                f"{inputs.shape[1]} slots; build it with a larger max_slots."
            )
        states, summary = self.encoder(inputs, attention_mask)  # (batch, slots, dim), (batch, dim)
        mask = attention_mask.bool()
        keys = self.key(states) if self.attention == "content" else None
        hidden = torch.tanh(self.start_state(summary))
        cell = torch.zeros_like(hidden)
        context = torch.zeros_like(summary)
        outputs, weights_per_step = [], []
        for _ in range(num_steps):
            # Bahdanau scores with the previous state; Luong with the current one.
            if self.attention == "content":
                context, weights = self._attend(hidden, states, keys, mask)
                hidden, cell = self.cell(context, (hidden, cell))
            else:
                hidden, cell = self.cell(context, (hidden, cell))  # input feeding: previous context
                context, weights = self._attend(hidden, states, keys, mask)
            outputs.append(self.output(torch.cat([hidden, context], dim=-1)))
            weights_per_step.append(weights)
        logits = self.classifier(torch.stack(outputs, dim=1))  # (batch, steps, 10)
        attentions = torch.stack(weights_per_step, dim=1) if output_attentions else None  # (batch, steps, slots)
        return AlgorithmicModelOutput(logits=logits, attentions=attentions)


def sinusoidal_positions(num_positions: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """Fixed sine/cosine position encodings (Vaswani et al.): `(num_positions, dim)`."""
    positions = torch.arange(num_positions, device=device, dtype=torch.float32).unsqueeze(1)  # (pos, 1)
    rates = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, device=device)
    table[:, 0::2] = torch.sin(positions * rates)
    table[:, 1::2] = torch.cos(positions * rates[: dim // 2])
    return table


class TransformerSeq2Seq(nn.Module):
    """Transformer encoder-decoder; decoder step `t` is queried by the position encoding of `t` alone.

    Args:
        feature_dim: width of the slot features.
        d_model: model width.
        num_heads: attention heads.
        num_layers: encoder and decoder layers (each).
        feedforward_size: feed-forward width.
    """

    def __init__(
        self,
        feature_dim: int,
        *,
        d_model: int = 128,
        num_heads: int = 4,
        num_layers: int = 2,
        feedforward_size: int = 512,
    ):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Linear(feature_dim, d_model)
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=num_heads,
            num_encoder_layers=num_layers,
            num_decoder_layers=num_layers,
            dim_feedforward=feedforward_size,
            dropout=0.0,
            batch_first=True,
        )
        self.classifier = nn.Linear(d_model, NUM_TOKENS)

    def forward(
        self, inputs: torch.Tensor, attention_mask: torch.Tensor, num_steps: int, **_
    ) -> AlgorithmicModelOutput:
        _check_inputs(inputs, attention_mask, num_steps)
        batch, slots, _ = inputs.shape
        positions = sinusoidal_positions(max(slots, num_steps), self.d_model, inputs.device)
        source = self.embed(inputs) + positions[:slots]  # (batch, slots, d_model)
        # No teacher forcing: the decoder input is zero plus the step's position encoding.
        target = positions[:num_steps].unsqueeze(0).expand(batch, -1, -1)  # (batch, steps, d_model)
        padding = ~attention_mask.bool()
        states = self.transformer(
            source, target, src_key_padding_mask=padding, memory_key_padding_mask=padding
        )  # (batch, steps, d_model)
        return AlgorithmicModelOutput(logits=self.classifier(states))


def build_model(name: str, feature_dim: int, **overrides) -> nn.Module:
    """Build one model of the suite with its default (paper-sized) settings.

    Args:
        name: one of `MODEL_NAMES`.
        feature_dim: width of the task's slot features (`task_spec(task).feature_dim`).
        **overrides: constructor arguments replacing the defaults: for PANM, `PanmMemoryConfig` fields
            (e.g. `scoring="dot"`) and `PanmSeq2Seq` arguments (`memory_dim`); tiny sizes in tests.
    """
    if name in PANM_VARIANTS:
        options = {**PANM_VARIANTS[name], **overrides}
        panm_fields = {f.name for f in fields(PanmMemoryConfig)}
        config = PanmMemoryConfig(**{key: value for key, value in options.items() if key in panm_fields})
        sizes = {key: value for key, value in options.items() if key not in panm_fields}
        return PanmSeq2Seq(feature_dim, config, **sizes)
    if name == "lstm":
        return LstmSeq2Seq(feature_dim, **overrides)
    if name in ("content", "location"):
        return AttentionSeq2Seq(feature_dim, attention=name, **overrides)
    if name == "transformer":
        return TransformerSeq2Seq(feature_dim, **overrides)
    raise ValueError(f"Unknown model name={name!r}; choose one of MODEL_NAMES={MODEL_NAMES}.")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
