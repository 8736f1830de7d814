"""Physical addresses (paper, Sec. 2.2 and Algorithm 1).

Every memory slot ``j`` of a sample is bound to the ``b``-bit binary code of
``(p_B + j) mod 2^b``, where ``p_B`` is the sample's *base address*. In training
``p_B`` is drawn uniformly from ``[0, 2^b)`` per sample so that every address is
eventually seen; at evaluation it is 0. Pure functions, batch-first, no loops.
"""

from __future__ import annotations

import torch

from .memo import traced_cache

# Up to this many bits `address_codes` reads codes from a table of all 2^b codes (2^16 x 16 values at most).
TABLE_BITS = 16


def binary_codes(addresses: torch.Tensor, bits: int) -> torch.Tensor:
    """Binary code of integer addresses, most significant bit first.

    Args:
        addresses: integer tensor of any shape `(...)`.
        bits: number of bits `b`.

    Returns:
        float tensor `(..., bits)` of zeros and ones.
    """
    shifts = torch.arange(bits - 1, -1, -1, device=addresses.device)  # (bits,)
    return ((addresses.unsqueeze(-1) >> shifts) & 1).float()  # (..., bits)


@traced_cache
def _code_table(bits: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():  # a normal tensor, even if first built under inference
        return binary_codes(torch.arange(2**bits, device=device), bits).to(dtype)  # (2^bits, bits)


def address_codes(addresses: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """`binary_codes(addresses, bits).to(dtype)` in one op: rows of a cached table of all `2^b` codes (for
    `b <= TABLE_BITS`; computed bit by bit above). Addresses must lie in `[0, 2^b)`."""
    if bits > TABLE_BITS:
        return binary_codes(addresses, bits).to(dtype)
    return _code_table(bits, addresses.device, dtype)[addresses]  # (..., bits)


def sample_base_address(
    batch_size: int,
    bits: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Draw one base address `p_B ~ Uniform{0, ..., 2^b - 1}` per sample: `(batch,)` long."""
    gen_device = generator.device if generator is not None else device
    base = torch.randint(0, 2**bits, (batch_size,), generator=generator, device=gen_device)
    return base.to(device) if device is not None else base


def slot_addresses(base_address: torch.Tensor, num_slots: int, bits: int) -> torch.Tensor:
    """Integer address `(p_B + j) mod 2^b` of every slot: `(batch,)` -> `(batch, slots)` long."""
    offsets = torch.arange(num_slots, device=base_address.device)  # (slots,)
    return (base_address.unsqueeze(-1) + offsets) % (2**bits)  # (batch, slots)


def build_address_bank(base_address: torch.Tensor, num_slots: int, bits: int) -> torch.Tensor:
    """The address bank `A`: binary codes of every slot's address.

    Args:
        base_address: `(batch,)` integer base addresses `p_B`.
        num_slots: memory length `L` (padded length of the batch).
        bits: number of address bits `b`.

    Returns:
        `(batch, slots, bits)` float tensor; row `j` of sample `i` encodes
        `(base_address[i] + j) mod 2^bits`.
    """
    return binary_codes(slot_addresses(base_address, num_slots, bits), bits)


def sample_distractor_addresses(
    base_address: torch.Tensor,
    lengths: torch.Tensor,
    num_slots: int,
    count: int,
    bits: int,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """Training-time distractor addresses (beyond the paper: `PanmConfig.address_distractors`).

    Each distractor is a real slot's address plus a nonzero multiple of `2^k`, the
    smallest power of two covering the memory: `(p_B + j + m 2^k) mod 2^b` with `j` a
    random real slot and `m` uniform in `[1, 2^(b-k))`. It shares the low `k` bits
    with a real address and differs above, and never equals one (`|j - i| < 2^k`), so
    a Pointer Unit that keeps weight on it must tell the high bits apart: every
    period of the code matters, not only the short ones a training window can see.

    Args:
        base_address: `(batch,)` long `p_B`.
        lengths: `(batch,)` long number of real slots.
        num_slots: padded memory length.
        count: distractors per sample.
        bits: `b`.
        generator: optional torch.Generator for reproducible draws.

    Returns:
        `(batch, count)` long addresses, or None when `2^k` already fills the address space.
    """
    low_bits = max(1, (num_slots - 1).bit_length())  # 2^low_bits >= num_slots
    if low_bits >= bits:
        return None
    batch = base_address.shape[0]
    gen_device = generator.device if generator is not None else base_address.device
    fractions = torch.rand(batch, count, generator=generator, device=gen_device).to(base_address.device)
    slot = (fractions * lengths.clamp(min=1).unsqueeze(-1)).long()  # (batch, count) a real slot
    multiple = torch.randint(1, 2 ** (bits - low_bits), (batch, count), generator=generator, device=gen_device)
    offsets = slot + multiple.to(base_address.device) * 2**low_bits  # (batch, count)
    return (base_address.unsqueeze(-1) + offsets) % (2**bits)


def check_capacity(
    slots: int, address_bits: int, holds: str, fix: str = "raise address_bits to at least {bits}"
) -> None:
    """The address-capacity check: a ValueError when `slots` need more than the `2^b` addresses.

    Args:
        slots: how many slots must take distinct addresses.
        address_bits: `b`.
        holds: the message's start, saying what holds the slots (the message goes on with " but address_bits=...").
        fix: the message's end; `{bits}` is the fewest address bits that fit.
    """
    if slots > 2**address_bits:
        bits = max(1, (slots - 1).bit_length())
        raise ValueError(
            f"{holds} but address_bits={address_bits} gives only {2**address_bits} addresses; {fix.format(bits=bits)}."
        )
