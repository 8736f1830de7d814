"""PANM: the backbone-agnostic memory core (paper, Sec. 2.3).

``PanmMemory`` binds a memory ``M`` (any encoder's outputs) to an address bank,
runs the Pointer Units, the Mode-1/Mode-2 reads and the Controller, and returns
the Controller's outputs together with the recurrent state, so a caller can
decode all steps at once (teacher forcing) or one step at a time.
Imports only torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from panm_hf.kernels.dispatch import Call, decide

from .addressing import address_codes, check_capacity, sample_base_address, sample_distractor_addresses
from .controller import Controller, drop_samples
from .memo import traced_cache
from .memory_config import PanmMemoryConfig, content_read_dropout_rate, reads_dropout_rate
from .pointer_unit import PointerUnits
from .reads import DecoderContentReader, Mode2Reader, mode1_read
from .state import AddressedMemory, PanmState


@dataclass
class PanmMemoryOutput:
    """Output of `PanmMemory.forward`.

    Attributes:
        hidden_states: `(batch, steps, output_size)` the Controller's outputs `g^o(...)`.
        state: the recurrent state after the last step (feed it back to continue decoding).
        memory: the `AddressedMemory` that was read (reuse it for later steps).
        address_attentions: `(batch, steps, units, slots)` Mode-1 address attention `w^a_t`, if requested.
        mode2_attentions: `(batch, steps, heads, slots)` Mode-2 attention `w^c_t`, if requested.
        content_attentions: `(batch, steps, slots)` the content read's attention (`content_read` other than
            `"none"`), if requested.
        undropped_hidden_states: `(batch, steps, output_size)` the Controller's outputs before drop-path, when
            drop-path is active (training with `panm_drop_path > 0`); None otherwise (`hidden_states` then).
        undecoded_hidden_states: `(batch, steps, output_size)` `g^o`'s outputs without its `z_t` columns, before
            drop-path, when the memory was built with `undecoded_output=True` and `g^o` reads `z_t`
            (`output_decoder_input`); None otherwise.
    """

    hidden_states: torch.Tensor
    state: PanmState
    memory: AddressedMemory
    address_attentions: torch.Tensor | None = None
    mode2_attentions: torch.Tensor | None = None
    content_attentions: torch.Tensor | None = None
    undropped_hidden_states: torch.Tensor | None = None
    undecoded_hidden_states: torch.Tensor | None = None

    def stop_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What `eos_decision="panm"` reads: `g^o`'s outputs without its `z_t` columns when computed, else the
        outputs before drop-path when it acted, else `hidden_states` (the caller's layout of `hidden_states`)."""
        if self.undecoded_hidden_states is not None:
            return self.undecoded_hidden_states
        return hidden_states if self.undropped_hidden_states is None else self.undropped_hidden_states


@traced_cache
def _offset_numerators(num_pointer_units: int, device: torch.device) -> torch.Tensor:
    denominator = max(num_pointer_units - 1, 1)
    numerators = ([0, denominator] + list(range(1, num_pointer_units - 1)))[:num_pointer_units]
    with torch.inference_mode(False):  # a normal tensor, even if first built under inference
        return torch.tensor([2 * n for n in numerators], device=device)  # (units,)


def initial_pointer_offsets(lengths: torch.Tensor, num_pointer_units: int) -> torch.Tensor:
    """Slot offsets where the Mode-1 pointers start (appendix, 'Model and Architecture').

    Unit 0 starts at the base address `p_B` (offset 0), unit 1 at the end address
    `p_E` (offset `length - 1`), further units at evenly spaced interior slots
    (for `H^a = 3` the middle). `(batch,)` -> `(batch, units)` long.
    """
    # Unit k >= 2 sits at fraction (k - 1) / (H^a - 1) of the way; round(last * n / d) half up, in integers
    # (exact, where float fractions such as 1/3 are not): floor((2 n last + d) / (2 d)).
    denominator = max(num_pointer_units - 1, 1)
    numerators = _offset_numerators(num_pointer_units, lengths.device)  # (units,) 2 n
    last = (lengths - 1).clamp(min=0).unsqueeze(-1)  # (batch, 1)
    return torch.div(last * numerators + denominator, 2 * denominator, rounding_mode="floor")  # (batch, units)


class PanmMemory(nn.Module):
    """Pointer-Augmented Neural Memory.

    Args:
        config: the PANM hyperparameters (`PanmMemoryConfig`, or a `PanmConfig`, which inherits its
            fields); each part reads the fields it uses, documented on `PanmMemoryConfig`.
        memory_dim: size `d_m` of a memory slot (the encoder's hidden size).
        decoder_input_size: size of the decoder input `z_t` fed to the Controller; 0 for none (`z_t = 0`).
            `content_read="decoder"` needs one (`"controller"` does not).
        output_size: size of the Controller's output.
        undecoded_output: also return `g^o`'s outputs without its `z_t` columns (`undecoded_hidden_states`)
            when `g^o` reads `z_t` (`output_decoder_input`): what the heads' `eos_decision="panm"` reads.
    """

    def __init__(
        self,
        config: PanmMemoryConfig,
        *,
        memory_dim: int,
        decoder_input_size: int,
        output_size: int,
        undecoded_output: bool = False,
    ):
        super().__init__()
        PanmMemoryConfig.validate(config)  # again: a config may have been edited since it was built
        if config.content_read == "decoder" and decoder_input_size == 0:
            raise ValueError(
                f"content_read={config.content_read!r} queries memory with the decoder state z_t, but this "
                "PanmMemory has no decoder input (decoder_input_size=0, as in the QA head); use "
                'content_read="none" or "controller" (queried by the Controller state).'
            )
        if config.output_decoder_input and decoder_input_size == 0:
            raise ValueError(
                "output_decoder_input=True feeds the decoder state z_t to g^o, but this PanmMemory has no decoder "
                "input (decoder_input_size=0, as in the QA head); set output_decoder_input=False."
            )
        self.address_distractors = config.address_distractors
        self.recurrence_kernel = config.recurrence_kernel  # the address glue's path (`dispatch.ADDRESSING`)
        self.memory_dim = memory_dim
        self.decoder_input_size = decoder_input_size
        self.address_bits = config.address_bits
        self.num_pointer_units = config.num_pointer_units
        self.num_mode2_heads = config.num_mode2_heads
        self.pointer_units = PointerUnits(config)
        self.mode2_reader = Mode2Reader(config, memory_dim=memory_dim) if config.num_mode2_heads > 0 else None
        self.content_reader = (
            DecoderContentReader(config, memory_dim=memory_dim, decoder_input_size=decoder_input_size)
            if config.content_read == "decoder"
            else None
        )
        self.dropout = nn.Dropout(config.panm_dropout)  # on PANM's output
        reads_rate, content_rate = reads_dropout_rate(config), content_read_dropout_rate(config)
        self.reads_dropout = nn.Dropout(reads_rate)
        # the decoder content read's own rate, only where it differs: one dropout over all reads otherwise, as before
        self.content_read_dropout = (
            nn.Dropout(content_rate) if self.content_reader is not None and content_rate != reads_rate else None
        )
        self.drop_path = config.panm_drop_path
        num_reads = config.num_pointer_units + config.num_mode2_heads + (self.content_reader is not None)
        self.controller = Controller(
            config,
            read_size=num_reads * memory_dim,
            decoder_input_size=decoder_input_size,
            memory_dim=memory_dim,
            output_size=output_size,
            undecoded_output=undecoded_output,
        )

    @property
    def max_slots(self) -> int:
        return 2**self.address_bits

    def bind(
        self,
        memory_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        base_address: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> AddressedMemory:
        """Bind memory slots to physical addresses (Sec. 2.2, Algorithm 1).

        Real slots get consecutive addresses `p_B, p_B + 1, ...` in order, whatever
        the padding side, so a sample's addresses do not depend on how it was padded.
        Only real slots need addresses: a batch padded to more than `2^b` columns is
        accepted while every sample has at most `2^b` real slots.

        Args:
            memory_states: `(batch, slots, memory_dim)`.
            attention_mask: `(batch, slots)`, nonzero for real slots; None means all real.
            base_address: `(batch,)` integer `p_B` per sample. Default: uniform over
                `[0, 2^b)` in training mode, 0 in eval mode.
            generator: torch.Generator for the training-time draw (reproducible runs).
        """
        if memory_states.dim() != 3 or memory_states.shape[-1] != self.memory_dim:
            raise ValueError(
                f"memory_states must have shape (batch, slots, {self.memory_dim}); "
                f"got {tuple(memory_states.shape)}."
            )
        batch_size, num_slots, _ = memory_states.shape
        device = memory_states.device
        if attention_mask is None:
            mask = torch.ones(batch_size, num_slots, dtype=torch.bool, device=device)
        else:
            if tuple(attention_mask.shape) != (batch_size, num_slots):
                raise ValueError(
                    f"attention_mask must have shape {(batch_size, num_slots)} to match memory_states; "
                    f"got {tuple(attention_mask.shape)}."
                )
            mask = attention_mask.to(device=device).bool()
        if num_slots > self.max_slots and batch_size:  # only real slots take addresses, not padding columns
            real_slots = int(mask.sum(dim=-1).max())
            check_capacity(real_slots, self.address_bits, f"The input has {real_slots} real (unpadded) memory slots "
                           "in its longest sample")  # fmt: skip
        if base_address is None:
            if self.training:
                base_address = sample_base_address(batch_size, self.address_bits, generator=generator, device=device)
            else:
                base_address = torch.zeros(batch_size, dtype=torch.long, device=device)
        else:
            base_address = torch.as_tensor(base_address, device=device)
            if base_address.shape != (batch_size,) or base_address.is_floating_point():
                raise ValueError(
                    f"base_address must be an integer tensor of shape ({batch_size},); "
                    f"got {base_address.dtype} {tuple(base_address.shape)}."
                )
            base_address = base_address.long() % self.max_slots
        mask, address_bank, lengths, address_mask = self._address_bank(mask, base_address, generator)
        return AddressedMemory(
            memory_states=memory_states,
            attention_mask=mask,
            address_bank=address_bank,
            address_keys=self.pointer_units.address_keys(address_bank),
            base_address=base_address,
            lengths=lengths,
            address_mask=address_mask,
            content_keys=None if self.content_reader is None else self.content_reader.keys(memory_states, mask),
        )

    def _address_bank(
        self, mask: torch.Tensor, base_address: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`(mask, address bank (batch, bank, bits), lengths (batch,), address mask or None)` for `bind`."""
        num_slots, device = mask.shape[1], mask.device
        param_dtype = self.controller.initial_state.weight.dtype
        distractors = self.training and self.address_distractors > 0
        address_mask = None
        path = decide("address_bank", Call(self.recurrence_kernel, device, param_dtype, per_step=distractors)).kernel
        if path == "triton":  # the eager block below in one launch (the CUDA path)
            mask = mask.contiguous()
            address_bank, lengths = torch.ops.panm_hf.address_bank_triton(mask, base_address.contiguous(),
                                                                          self.address_bits, param_dtype)  # fmt: skip
        else:
            # (batch, slots) long: rank among real slots; a padding slot takes the rank of the real slot before it
            # (0 before the first), so every address stays below 2^b; padding is masked wherever addresses are read.
            positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
            addresses = (base_address.unsqueeze(-1) + positions) % self.max_slots  # (batch, slots)
            lengths = mask.sum(dim=-1)
            if distractors:
                drawn = sample_distractor_addresses(
                    base_address, lengths, num_slots, self.address_distractors, self.address_bits, generator=generator
                )  # (batch, distractors) or None when no address is left over
                if drawn is not None:
                    addresses = torch.cat([addresses, drawn], dim=-1)  # (batch, slots + distractors)
                    address_mask = torch.cat([mask, torch.ones_like(drawn, dtype=torch.bool)], dim=-1)
            address_bank = address_codes(addresses, self.address_bits, param_dtype)  # (batch, bank, bits)
        return mask, address_bank, lengths, address_mask

    def initial_state(self, memory: AddressedMemory, *, causal: bool = False) -> PanmState:
        """State before the first decoding step: `h^a_0 = 0`, `p^a_0` at base/end(/middle), `h^c_0` from `M`.

        With `causal=True` (autoregressive decoding over a growing memory) only the first real slot is
        visible before the first step, so every pointer starts at `p_B` and `h^c_0` is computed from
        that slot alone; the end pointer then follows the newest slot (see `forward`).
        """
        dtype, device = memory.address_bank.dtype, memory.address_bank.device
        eager = causal or memory.address_mask is not None  # the first slot alone, or distractors in the bank
        if decide("start_pointers", Call(self.recurrence_kernel, device, dtype, per_step=eager)).kernel == "triton":
            # the eager lines below in one launch (the CUDA path)
            numerators = _offset_numerators(self.num_pointer_units, device)  # (units,) 2 n
            pointers, pointer_weights = torch.ops.panm_hf.start_pointers_triton(
                memory.attention_mask, memory.base_address, memory.lengths, numerators, self.address_bits, dtype
            )  # (batch, units, bits), (batch, units, slots)
        else:
            lengths = memory.lengths.clamp(max=1) if causal else memory.lengths
            offsets = initial_pointer_offsets(lengths, self.num_pointer_units)  # (batch, units)
            addresses = (memory.base_address.unsqueeze(-1) + offsets) % self.max_slots  # (batch, units)
            pointers = address_codes(addresses, self.address_bits, dtype)  # (batch, units, bits)
            # One-hot at the slot holding each start address (whatever the padding side).
            matches = (memory.address_bank.unsqueeze(1) == pointers.unsqueeze(2)).all(dim=-1)  # (batch, units, bank)
            pointer_weights = (matches & memory.pointer_mask.unsqueeze(1)).to(dtype)  # (batch, units, bank)
        pointer_hidden = memory.address_keys.new_zeros(
            memory.address_keys.shape[0], self.num_pointer_units, self.pointer_units.hidden_size
        )
        init_mask = memory.attention_mask
        if causal:  # the first real slot only
            init_mask = init_mask & (init_mask.long().cumsum(dim=-1) == 1)  # (batch, slots)
        controller_hidden = self.controller.initial_hidden(memory.memory_states, init_mask)
        return PanmState(
            pointer_hidden=pointer_hidden,
            pointers=pointers,
            controller_hidden=controller_hidden,
            pointer_weights=pointer_weights,
        )

    def forward(
        self,
        memory: AddressedMemory | torch.Tensor,
        decoder_states: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        num_steps: int | None = None,
        state: PanmState | None = None,
        base_address: torch.Tensor | None = None,
        output_attentions: bool = False,
        causal_positions: torch.Tensor | None = None,
    ) -> PanmMemoryOutput:
        """Decode `steps` steps from the memory.

        Args:
            memory: an `AddressedMemory` from `bind`, or raw `(batch, slots, memory_dim)`
                memory states (then bound here with `attention_mask` and `base_address`).
            decoder_states: `(batch, steps, decoder_input_size)` decoder inputs `z_t`; None
                when the Controller has no decoder input (then give `num_steps`).
            num_steps: number of steps when `decoder_states` is None.
            state: state from a previous call to continue from; None starts afresh.
            output_attentions: also return Mode-1 and Mode-2 attention weights.
            causal_positions: `(batch, steps)` long, for autoregressive decoding (the paper's Dyck
                model, "masking M"): the slot holding each step's own token. Step `t` then reads only
                real slots `s <= causal_positions[:, t]` in the Pointer Units' address attention and in
                Mode 2, and pointer unit 1 (the end pointer `p_E`) restarts at every step from that
                newest slot, so it reads relative to the current token. A step whose own slot is
                padding leaves the state unchanged; such steps must come after each row's real steps
                (the Controller GRU runs over them). Start with `initial_state(memory, causal=True)`.
        """
        if not isinstance(memory, AddressedMemory):
            memory = self.bind(memory, attention_mask, base_address=base_address)
        batch_size = memory.memory_states.shape[0]
        num_steps = self._num_steps(batch_size, decoder_states, num_steps)
        if state is None:
            state = self.initial_state(memory, causal=causal_positions is not None)

        pointer_mask, slot_mask, step_mask, anchors = memory.pointer_mask, memory.attention_mask, None, None
        if causal_positions is not None:
            pointer_mask, slot_mask, step_mask, anchors = self._causal_masks(memory, causal_positions, num_steps)
        address_weights, pointers, pointer_hidden, last_weights = self._point(
            memory, state, pointer_mask, num_steps, step_mask, anchors
        )  # (batch, steps, units, slots), ...
        reads, mode2_weights, content_weights = self._reads(address_weights, memory, decoder_states, slot_mask)
        hidden_states, undropped_states, undecoded_states, controller_hidden, controller_weights = self._control(
            reads, decoder_states, state.controller_hidden, memory, slot_mask, step_mask
        )
        if self.controller.content_reader is not None:  # content_read="controller": its weights are the content's
            content_weights = controller_weights
        next_state = PanmState(
            pointer_hidden=pointer_hidden,
            pointers=pointers,
            controller_hidden=controller_hidden,
            pointer_weights=last_weights,
        )
        weights = (address_weights, mode2_weights, content_weights)
        outputs = (hidden_states, undropped_states, undecoded_states)
        return self._memory_output(memory, outputs, next_state, weights, output_attentions)

    def forward_fed(
        self,
        memory: AddressedMemory,
        decoder_step: Callable[[int, torch.Tensor], torch.Tensor],
        num_steps: int,
        *,
        state: PanmState | None = None,
        output_attentions: bool = False,
    ) -> PanmMemoryOutput:
        """Decode `num_steps` steps whose decoder state `z_t` depends on the Controller's previous state (input
        feeding, `PanmConfig.input_feeding`): `decoder_step(t, h^c_{t-1})` returns `z_t` `(batch, 1,
        decoder_input_size)`.

        The same model as `forward` on those `z_t`, computed in the order the dependence allows. The Pointer Units
        and the Mode-1 and Mode-2 reads see no `z_t`, so they run for all steps before the loop, as in `forward`;
        the loop holds the decoder, the content read and the Controller's cell; `g^o`, dropout and drop-path run
        over all steps after it, so a sample's drop-path (`panm_drop_path`, `output_decoder_drop_path`) covers all
        its steps, as in `forward`.
        """
        if self.decoder_input_size == 0:
            raise ValueError("forward_fed feeds the decoder state z_t to the Controller; this PanmMemory has none.")
        state = self.initial_state(memory) if state is None else state
        slot_mask, controller = memory.attention_mask, self.controller
        address_weights, pointers, pointer_hidden, last_weights = self._point(
            memory, state, memory.pointer_mask, num_steps
        )  # (batch, steps, units, slots), ...
        pointer_reads, mode2_weights = self._pointer_reads(address_weights, memory, slot_mask)  # (batch*steps, ...)
        pointer_reads = self.reads_dropout(pointer_reads)
        batch = pointer_reads.shape[0] // num_steps
        hidden, decoder_rows, state_rows, content_rows, content_weights = self._fed_steps(
            memory, decoder_step, pointer_reads, state.controller_hidden, num_steps
        )  # (batch, hidden), rows (batch*steps, ...), (batch, steps, slots) or None
        parts = [pointer_reads] if content_rows is None else [pointer_reads, content_rows]  # the content read next
        outputs, undecoded = controller.output([*parts, state_rows], decoder_rows, batch, num_steps)
        hidden_states, undropped, undecoded = self._finish(outputs, undecoded)  # (batch, steps, out) each
        next_state = PanmState(
            pointer_hidden=pointer_hidden, pointers=pointers, controller_hidden=hidden, pointer_weights=last_weights
        )
        weights, outputs = (address_weights, mode2_weights, content_weights), (hidden_states, undropped, undecoded)
        return self._memory_output(memory, outputs, next_state, weights, output_attentions)

    def _memory_output(
        self,
        memory: AddressedMemory,
        outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        state: PanmState,
        weights: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        output_attentions: bool,
    ) -> PanmMemoryOutput:
        """`forward`'s and `forward_fed`'s result: `outputs` the hidden states as used, before drop-path and
        before the decoder (each `(batch, steps, out)`); `weights` the address `(batch, steps, units, slots)`,
        Mode-2 `(batch*steps, heads, slots)` or None and content `(batch, steps, slots)` or None attentions, kept
        when `output_attentions`."""
        hidden_states, undropped, undecoded = outputs
        address_weights, mode2_weights, content_weights = weights
        batch, num_steps = hidden_states.shape[:2]
        if not output_attentions:
            address_weights, mode2_weights, content_weights = None, None, None
        if mode2_weights is not None:  # (batch*steps, heads, slots) -> (batch, steps, heads, slots)
            mode2_weights = mode2_weights.reshape(batch, num_steps, self.num_mode2_heads, -1)
        return PanmMemoryOutput(
            hidden_states=hidden_states,
            undropped_hidden_states=undropped,
            undecoded_hidden_states=undecoded,
            state=state,
            memory=memory,
            address_attentions=address_weights,
            mode2_attentions=mode2_weights,
            content_attentions=content_weights,
        )

    def _fed_steps(
        self,
        memory: AddressedMemory,
        decoder_step: Callable[[int, torch.Tensor], torch.Tensor],
        pointer_reads: torch.Tensor,
        hidden: torch.Tensor,
        num_steps: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`forward_fed`'s loop: per step the decoder, the content read and the Controller's cell. Returns `(h^c
        after the last step, z_t rows (batch*steps, decoder_input), h^c_t rows (batch*steps, hidden), the content
        read's rows (batch*steps, dim) and weights (batch, steps, slots), or None without one)`."""
        controller, slot_mask = self.controller, memory.attention_mask
        batch = pointer_reads.shape[0] // num_steps
        fixed_gates, step_weight = controller.fixed_gates(pointer_reads)  # (batch*steps, gates), (gates, step cols)
        fixed_gates = fixed_gates.reshape(batch, num_steps, -1)  # (batch, steps, gates)
        content_dropout = self.reads_dropout if self.content_read_dropout is None else self.content_read_dropout
        controller_keys = None
        if controller.content_reader is not None:  # content_read="controller": keys once for all steps
            controller_keys = controller.content_reader.key(memory.memory_states)  # (batch, slots, dim)
        columns = {"z": [], "content": [], "content_weights": [], "state": []}
        for t in range(num_steps):  # the recurrence: z_t reads h^c_{t-1}
            decoder_state = decoder_step(t, hidden).to(pointer_reads.dtype)  # (batch, 1, decoder_input)
            step_inputs = [decoder_state.reshape(batch, -1)]  # (batch, decoder_input)
            if self.content_reader is not None:  # the decoder's content read comes before z_t in the cell's input
                value, weight = self.content_reader(
                    decoder_state, memory.memory_states, slot_mask, memory.content_keys
                )  # (batch, 1, 1, dim), (batch, 1, 1, slots)
                step_inputs.insert(0, content_dropout(value.reshape(batch, -1)))  # (batch, dim)
            elif controller_keys is not None:  # the Controller's own read, after z_t
                value, weight = controller.content_reader(hidden, controller_keys, memory.memory_states, slot_mask)
                step_inputs.append(controller.content_dropout(value))  # (batch, dim)
            if len(step_inputs) > 1:
                columns["content"].append(step_inputs[0] if self.content_reader is not None else step_inputs[-1])
                columns["content_weights"].append(weight.reshape(batch, -1))  # (batch, slots)
            step_gates = nn.functional.linear(torch.cat(step_inputs, dim=-1), step_weight)  # (batch, gates)
            hidden = controller.cell_step(fixed_gates[:, t] + step_gates, hidden)
            columns["z"].append(decoder_state.reshape(batch, -1))  # (batch, decoder_input)
            columns["state"].append(hidden[:, : controller.hidden_size])  # (batch, hidden): h of an LSTM's [h, c]
        rows = {
            name: torch.stack(columns[name], dim=1).reshape(batch * num_steps, -1) if columns[name] else None
            for name in ("z", "state", "content")
        }  # each (batch*steps, width), or None
        content_weights = torch.stack(columns["content_weights"], dim=1) if columns["content"] else None
        return hidden, rows["z"], rows["state"], rows["content"], content_weights  # weights (batch, steps, slots)

    def _num_steps(self, batch_size: int, decoder_states: torch.Tensor | None, num_steps: int | None) -> int:
        """The number of steps, from `decoder_states` or `num_steps`; a ValueError when they do not fit."""
        if decoder_states is not None:
            if self.decoder_input_size == 0:
                raise ValueError(
                    "This PanmMemory has decoder_input_size=0; call it with num_steps, not decoder_states."
                )
            if decoder_states.dim() != 3 or decoder_states.shape[0] != batch_size or (
                decoder_states.shape[-1] != self.decoder_input_size
            ):
                raise ValueError(
                    f"decoder_states must have shape ({batch_size}, steps, {self.decoder_input_size}); "
                    f"got {tuple(decoder_states.shape)}."
                )
            num_steps = decoder_states.shape[1]
        elif self.decoder_input_size > 0:
            raise ValueError(f"decoder_states of size {self.decoder_input_size} are required by this PanmMemory.")
        if num_steps is None or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer (got {num_steps!r}).")
        return num_steps

    def _reads(
        self,
        address_weights: torch.Tensor,
        memory: AddressedMemory,
        decoder_states: torch.Tensor | None,
        slot_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Every read the Controller takes (Mode 1, Mode 2, the decoder content read) as rows
        `(batch*steps, num_reads*dim)`, with the Mode-2 `(batch, steps*heads, slots)` and content
        `(batch, steps, slots)` weights (None where off)."""
        pointer_reads, mode2_weights = self._pointer_reads(address_weights, memory, slot_mask)
        reads = [pointer_reads]  # each (batch*steps, reads*dim): one row per (sample, step)
        content_weights = None
        if self.content_reader is not None:
            content_values, content_weights = self.content_reader(
                decoder_states, memory.memory_states, slot_mask, memory.content_keys
            )  # (batch, steps, 1, dim), (batch, steps, 1, slots)
            content_weights = content_weights.squeeze(2)  # (batch, steps, slots)
            reads.append(content_values.reshape(pointer_reads.shape[0], -1))  # (batch*steps, dim)
        return torch.cat(reads, dim=-1), mode2_weights, content_weights  # (batch*steps, num_reads*dim), ...

    def _point(
        self,
        memory: AddressedMemory,
        state: PanmState,
        pointer_mask: torch.Tensor,
        num_steps: int,
        step_mask: torch.Tensor | None = None,
        anchors: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The Pointer Units' `num_steps` steps: `(address weights over the slots (batch, steps, units, slots),
        pointers, Pointer Unit states, the last step's weights over the whole bank (batch, units, bank))`."""
        address_weights, pointers, pointer_hidden = self.pointer_units(
            state.pointers,
            state.pointer_hidden,
            memory.address_bank,
            memory.address_keys,
            pointer_mask,
            num_steps,
            previous_weights=state.pointer_weights,
            step_mask=step_mask,
            anchors=anchors,
        )  # (batch, steps, units, bank)
        last_weights = address_weights[:, -1]  # (batch, units, bank)
        # Distractor addresses (training only) follow the slots in the bank and bind no memory.
        if address_weights.shape[-1] > memory.memory_states.shape[1]:
            address_weights = address_weights[..., : memory.memory_states.shape[1]]  # (batch, steps, units, slots)
        return address_weights, pointers, pointer_hidden, last_weights

    def _pointer_reads(
        self, address_weights: torch.Tensor, memory: AddressedMemory, slot_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The Mode-1 and Mode-2 reads, which need no decoder state: rows `(batch*steps, (units+heads)*dim)` and
        the Mode-2 weights `(batch, steps*heads, slots)` (None without Mode 2)."""
        mode1_values = mode1_read(address_weights.to(memory.memory_states.dtype), memory.memory_states)
        if self.mode2_reader is None:
            return mode1_values, None  # (batch*steps, units*dim)
        mode2_values, mode2_weights = self.mode2_reader(
            mode1_values, memory.memory_states, slot_mask
        )  # (batch*steps, heads*dim), (batch, steps*heads, slots)
        return torch.cat([mode1_values, mode2_values], dim=-1), mode2_weights

    def _drop_reads(self, reads: torch.Tensor) -> torch.Tensor:
        """Dropout on the reads `(batch*steps, num_reads*dim)`: the decoder content read, their last `dim` columns,
        at `content_read_dropout` where that differs from the pointer reads' rate."""
        if self.content_read_dropout is None:
            return self.reads_dropout(reads)
        pointer_reads, content = reads.split([reads.shape[-1] - self.memory_dim, self.memory_dim], dim=-1)
        return torch.cat([self.reads_dropout(pointer_reads), self.content_read_dropout(content)], dim=-1)

    def _control(
        self,
        reads: torch.Tensor,
        decoder_states: torch.Tensor | None,
        controller_hidden: torch.Tensor,
        memory: AddressedMemory,
        slot_mask: torch.Tensor,
        step_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """The Controller over the reads, with dropout and drop-path: `(outputs (batch, steps, out), the outputs
        before drop-path when it is active (else None), the outputs without g^o's z_t columns (else None), last
        hidden, the Controller's content weights (batch, steps, slots) for content_read="controller", else None)`."""
        weights = None
        if self.controller.content_reader is not None:  # content_read="controller": steps one at a time
            hidden_states, controller_hidden, weights, undecoded = self.controller.attentive_forward(
                self._drop_reads(reads), decoder_states, controller_hidden, memory.memory_states, slot_mask,
                step_mask=step_mask,
            )  # fmt: skip
        else:
            hidden_states, controller_hidden, undecoded = self.controller(
                self._drop_reads(reads), decoder_states, controller_hidden, step_mask=step_mask
            )
        return *self._finish(hidden_states, undecoded), controller_hidden, weights

    def _finish(
        self, hidden_states: torch.Tensor, undecoded: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Dropout and drop-path on the Controller's outputs `(batch, steps, out)` of all steps: `(outputs, the
        outputs before drop-path when it acts (else None), the outputs without g^o's z_t columns (or None))`."""
        hidden_states = self.dropout(hidden_states)
        undecoded = self.dropout(undecoded) if undecoded is not None else None
        undropped = None
        if self.training and self.drop_path > 0:  # stochastic depth: a sample keeps all of PANM's output or none
            undropped = hidden_states
            hidden_states = drop_samples(hidden_states, self.drop_path)
        return hidden_states, undropped, undecoded

    def _causal_masks(
        self, memory: AddressedMemory, causal_positions: torch.Tensor, num_steps: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Per-step masks of causal decoding: (pointer mask over the bank, slot mask, step mask, anchors)."""
        batch_size, num_slots = memory.attention_mask.shape
        positions = torch.as_tensor(causal_positions, device=memory.attention_mask.device)
        if positions.shape != (batch_size, num_steps) or positions.is_floating_point():
            raise ValueError(
                f"causal_positions must be an integer tensor of shape ({batch_size}, {num_steps}) (one slot per "
                f"step); got {positions.dtype} {tuple(positions.shape)}."
            )
        positions = positions.long()
        slots = torch.arange(num_slots, device=positions.device)
        visible = slots.reshape(1, 1, -1) <= positions.unsqueeze(-1)  # (batch, steps, slots)
        slot_mask = visible & memory.attention_mask.unsqueeze(1)  # (batch, steps, slots)
        step_mask = memory.attention_mask.gather(1, positions.clamp(max=num_slots - 1))  # (batch, steps)
        pointer_mask = slot_mask
        if memory.address_mask is not None:  # training-time distractors follow the slots and are always visible
            distractors = memory.address_mask[:, num_slots:].unsqueeze(1).expand(-1, num_steps, -1)
            pointer_mask = torch.cat([slot_mask, distractors], dim=-1)  # (batch, steps, bank)
        bits = memory.address_bank.shape[-1]
        index = positions.unsqueeze(-1).clamp(max=num_slots - 1).expand(-1, -1, bits)  # (batch, steps, bits)
        anchor_pointers = memory.address_bank.gather(1, index)  # (batch, steps, bits)
        anchor_weights = torch.nn.functional.one_hot(positions, memory.address_bank.shape[1])  # (batch, steps, bank)
        return pointer_mask, slot_mask, step_mask, (anchor_pointers, anchor_weights)

    def append(
        self, memory: AddressedMemory, new_states: torch.Tensor, state: PanmState
    ) -> tuple[AddressedMemory, PanmState, torch.Tensor]:
        """Grow a causal memory by `new` real slots per sample (one cached decoding call).

        Each sample's new slots go right after its last real slot (the memory is kept left-aligned: real
        slots first), at the next consecutive addresses `p_B + length, ...`; only their address keys are
        computed. `state.pointer_weights` is widened to the new bank with zeros.

        Args:
            memory: the left-aligned memory so far.
            new_states: `(batch, new, memory_dim)` the new tokens' states (all real).
            state: the state after the last decoded step.

        Returns:
            `(memory, state, causal_positions (batch, new))` to pass to `forward`.
        """
        if memory.address_mask is not None:
            raise ValueError(
                "Cannot append to a memory bound with training-time address_distractors; decode with a cache "
                "in eval mode (model.eval())."
            )
        batch_size, num_new, dim = new_states.shape
        needed = int(memory.lengths.max()) + num_new if batch_size else 0
        check_capacity(needed, self.address_bits, f"The causal memory would hold {needed} slots")
        positions = memory.lengths.unsqueeze(-1) + torch.arange(num_new, device=new_states.device)  # (batch, new)
        num_slots = max(memory.memory_states.shape[1], int(positions.max()) + 1 if batch_size else 0)
        grow = num_slots - memory.memory_states.shape[1]

        def place(old: torch.Tensor, new: torch.Tensor, slot_dim: int) -> torch.Tensor:
            # widen `old` along the slot axis with zeros, then write `new` at `positions`
            pad_shape = list(old.shape)
            pad_shape[slot_dim] = grow
            old = torch.cat([old, old.new_zeros(pad_shape)], dim=slot_dim)
            index_shape = [batch_size] + [1] * (old.dim() - 1)
            index_shape[slot_dim] = num_new
            index = positions.reshape(index_shape).expand(*[new.shape[i] for i in range(new.dim())])
            return old.scatter(slot_dim, index, new.to(old.dtype))

        addresses = (memory.base_address.unsqueeze(-1) + positions) % self.max_slots  # (batch, new)
        address_bank = address_codes(addresses, self.address_bits, memory.address_bank.dtype)  # (batch, new, bits)
        address_keys = self.pointer_units.address_keys(address_bank)  # (batch, units, new, hidden)
        grown = AddressedMemory(
            memory_states=place(memory.memory_states, new_states, 1),
            attention_mask=place(memory.attention_mask, torch.ones_like(positions, dtype=torch.bool), 1),
            address_bank=place(memory.address_bank, address_bank, 1),
            address_keys=place(memory.address_keys, address_keys, 2),
            base_address=memory.base_address,
            lengths=memory.lengths + num_new,
        )
        weights = state.pointer_weights
        if weights is not None and grow > 0:
            weights = torch.cat([weights, weights.new_zeros(*weights.shape[:-1], grow)], dim=-1)  # (batch, units, bank)
        return grown, replace(state, pointer_weights=weights), positions
