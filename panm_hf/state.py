"""Explicit PANM state passed in and out of every call.

``AddressedMemory`` is what is fixed for a whole decode: the memory ``M``, its
mask, the address bank ``A`` bound to it and what is derived from ``A`` once
(the Pointer Units' keys ``g^a(A)`` and the initial pointers). ``PanmState`` is
what the recurrence carries from one decoding step to the next. Both can be
re-indexed along the batch (beam search) with ``index_select``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


def _index_select(obj, indices: torch.Tensor):
    values = {}
    for field in fields(obj):
        value = getattr(obj, field.name)
        values[field.name] = value.index_select(0, indices.to(value.device)) if value is not None else None
    return type(obj)(**values)


@dataclass
class AddressedMemory:
    """Memory ``M`` bound to its address bank ``A``.

    Attributes:
        memory_states: `(batch, slots, memory_dim)` the encoder outputs `M`.
        attention_mask: `(batch, slots)` bool, True for real slots.
        address_bank: `(batch, slots, bits)` binary address of every slot.
        address_keys: `(batch, units, slots, pointer_hidden)` `g^a_h(A)`, ready for scoring.
        base_address: `(batch,)` long, `p_B`.
        lengths: `(batch,)` long, number of real slots.
        address_mask: `(batch, slots + distractors)` bool over the address bank when training-time
            distractor addresses follow the slots in it (`PanmConfig.address_distractors`); None when
            the bank is exactly the slots (then `attention_mask` masks it).
        content_keys: `(batch, slots, memory_dim)` the decoder content read's keys where they are not `M`
            (`content_read_keys`), computed once per memory; None otherwise.
    """

    memory_states: torch.Tensor
    attention_mask: torch.Tensor
    address_bank: torch.Tensor
    address_keys: torch.Tensor
    base_address: torch.Tensor
    lengths: torch.Tensor
    address_mask: torch.Tensor | None = None
    content_keys: torch.Tensor | None = None

    @property
    def pointer_mask(self) -> torch.Tensor:
        """`(batch, bank)` bool: which addresses the Pointer Units may attend to."""
        return self.attention_mask if self.address_mask is None else self.address_mask

    def index_select(self, indices: torch.Tensor) -> AddressedMemory:
        return _index_select(self, indices)


@dataclass
class PanmState:
    """Recurrent PANM state after a decoding step.

    Attributes:
        pointer_hidden: `(batch, units, pointer_hidden)` Pointer Unit GRU states `h^a_t`.
        pointers: `(batch, units, bits)` current Mode-1 pointers `p^a_t`.
        controller_hidden: `(batch, controller_hidden)` Controller GRU state `h^c_t`.
        pointer_weights: `(batch, units, bank)` current address attention `w^a_t` (one-hot at the
            start); `pointer_update="shift"` moves it at the next step.
    """

    pointer_hidden: torch.Tensor
    pointers: torch.Tensor
    controller_hidden: torch.Tensor
    pointer_weights: torch.Tensor | None = None

    def index_select(self, indices: torch.Tensor) -> PanmState:
        return _index_select(self, indices)
