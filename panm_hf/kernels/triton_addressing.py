"""PANM's address glue as two Triton kernels: the slots' address bank, and the Pointer Units' start.

Eager, `PanmMemory.address` takes eight small ops to bind the slots to their addresses (each real slot's rank
by a cumulative sum, `(p_B + rank) mod 2^b`, its binary code, the lengths), and `PanmMemory.initial_state`
seventeen to place the pointers at the base, end (and interior) addresses and one-hot them over the bank. On a
GPU each op is a kernel launch, so these run here as one launch each, one program per sample
(`dispatch.ADDRESSING`; the CUDA path, and `recurrence_kernel="triton"` on any device). They have no
gradient: addresses are integers and their codes constants. Checked against the eager ops under Triton's
interpreter (`tests/test_triton_reads.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .triton_port import _launch


@triton.jit
def _ranks(mask_row, S, BLOCK_S: tl.constexpr):
    """`(real (BLOCK_S,) bool, rank among the real slots, 0 before the first (BLOCK_S,), length)` of one row."""
    offs_s = tl.arange(0, BLOCK_S)
    real = (tl.load(mask_row + offs_s, mask=offs_s < S, other=0) != 0) & (offs_s < S)
    count = tl.cumsum(real.to(tl.int64), 0)
    return real, tl.maximum(count - 1, 0), tl.sum(real.to(tl.int64), 0)


@triton.jit
def _bank_kernel(mask, base, bank, lengths, S, NB, SLOTS_MAX, BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr):
    b = tl.program_id(0)
    offs_s, offs_nb = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB)
    _, rank, length = _ranks(mask + b * S, S, BLOCK_S)
    address = (tl.load(base + b) + rank) % SLOTS_MAX  # (BLOCK_S,)
    shifts = (NB - 1 - offs_nb).to(tl.int64)  # most significant bit first
    codes = ((address[:, None] >> shifts[None, :]) & 1).to(bank.dtype.element_ty)  # (BLOCK_S, BLOCK_NB)
    tl.store(bank + b * S * NB + offs_s[:, None] * NB + offs_nb[None, :], codes,
             mask=(offs_s[:, None] < S) & (offs_nb[None, :] < NB))  # fmt: skip
    tl.store(lengths + b, length)


@triton.jit
def _start_kernel(mask, base, lengths, numerators, pointers, weights, S, NB, U, SLOTS_MAX, DENOMINATOR,
                  BLOCK_S: tl.constexpr, BLOCK_NB: tl.constexpr, BLOCK_U: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    offs_s, offs_nb, offs_u = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_NB), tl.arange(0, BLOCK_U)
    mu = offs_u < U
    real, rank, _ = _ranks(mask + b * S, S, BLOCK_S)
    last = tl.maximum(tl.load(lengths + b) - 1, 0)
    # unit k at fraction n_k / d of the way, rounded half up in integers: floor((2 n_k last + d) / (2 d))
    offsets = (last * tl.load(numerators + offs_u, mask=mu, other=0) + DENOMINATOR) // (2 * DENOMINATOR)  # (U,)
    address = (tl.load(base + b) + offsets) % SLOTS_MAX  # (BLOCK_U,)
    shifts = (NB - 1 - offs_nb).to(tl.int64)
    codes = ((address[:, None] >> shifts[None, :]) & 1).to(pointers.dtype.element_ty)  # (BLOCK_U, BLOCK_NB)
    tl.store(pointers + (b * U + offs_u[:, None]) * NB + offs_nb[None, :], codes,
             mask=mu[:, None] & (offs_nb[None, :] < NB))  # fmt: skip
    # one-hot at the slot holding each start address: the real slot whose rank is the offset
    hit = (rank[None, :] == offsets[:, None]) & real[None, :]  # (BLOCK_U, BLOCK_S)
    tl.store(weights + (b * U + offs_u[:, None]) * S + offs_s[None, :], hit.to(weights.dtype.element_ty),
             mask=mu[:, None] & (offs_s[None, :] < S))  # fmt: skip


def address_bank_triton(mask: Tensor, base_address: Tensor, bits: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`(address bank (batch, slots, bits) in dtype, lengths (batch,) long)`: as `PanmMemory.address` computes
    them eagerly for a bank of exactly the slots. `mask`: `(batch, slots)` bool; `base_address`: `(batch,)`
    long in `[0, 2^bits)`."""
    batch, slots = mask.shape
    bank, lengths = mask.new_empty((batch, slots, bits), dtype=dtype), mask.new_empty(batch, dtype=torch.long)
    if batch:
        _launch(_bank_kernel, (batch,), mask, base_address, bank, lengths, slots, bits, 2**bits,
                BLOCK_S=triton.next_power_of_2(max(slots, 1)), BLOCK_NB=triton.next_power_of_2(bits))  # fmt: skip
    return bank, lengths


def start_pointers_triton(mask: Tensor, base_address: Tensor, lengths: Tensor, numerators: Tensor, bits: int,
                          dtype: torch.dtype) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`(pointers (batch, units, bits), one-hot weights (batch, units, slots))` in dtype: the Pointer Units' start
    as `PanmMemory.initial_state` computes it eagerly (`initial_pointer_offsets`, with `numerators` its `2 n_k`)."""
    (batch, slots), units = mask.shape, numerators.shape[0]
    pointers, weights = mask.new_empty((batch, units, bits), dtype=dtype), mask.new_empty((batch, units, slots),
                                                                                           dtype=dtype)  # fmt: skip
    if batch:
        _launch(_start_kernel, (batch,), mask, base_address, lengths, numerators, pointers, weights, slots, bits,
                units, 2**bits, max(units - 1, 1), BLOCK_S=triton.next_power_of_2(max(slots, 1)),
                BLOCK_NB=triton.next_power_of_2(bits), BLOCK_U=triton.next_power_of_2(units))  # fmt: skip
    return pointers, weights
