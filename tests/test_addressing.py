import pytest
import torch
from conftest import tiny_memory

from panm_hf.addressing import (
    TABLE_BITS,
    address_codes,
    binary_codes,
    build_address_bank,
    sample_base_address,
    slot_addresses,
)


@pytest.mark.parametrize("bits", [1, 5, 10, TABLE_BITS, TABLE_BITS + 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_address_codes_from_the_table_equal_binary_codes(bits, dtype):
    addresses = torch.randint(0, 2**bits, (3, 7), generator=torch.Generator().manual_seed(bits))
    addresses[0, 0], addresses[0, 1] = 0, 2**bits - 1  # both ends of the address space
    codes = address_codes(addresses, bits, dtype)
    assert codes.dtype == dtype and torch.equal(codes, binary_codes(addresses, bits).to(dtype))


def test_binary_codes_msb_first():
    codes = binary_codes(torch.tensor([0, 1, 5, 15]), 4)
    expected = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.float)
    assert torch.equal(codes, expected)


def test_paper_example_bank():
    # Sec. 2.2: 3 addresses from p_B = 3 with b = 4 are {0011, 0100, 0101}.
    bank = build_address_bank(torch.tensor([3]), 3, 4)
    assert bank.shape == (1, 3, 4)
    assert bank[0].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [0, 1, 0, 1]]


def test_bank_is_per_sample_and_wraps_around():
    base = torch.tensor([0, 14, 7])
    addresses = slot_addresses(base, 4, 4)
    assert addresses.tolist() == [[0, 1, 2, 3], [14, 15, 0, 1], [7, 8, 9, 10]]
    bank = build_address_bank(base, 4, 4)
    weights = 2 ** torch.arange(3, -1, -1).float()
    assert torch.equal((bank * weights).sum(-1).long(), addresses)


def test_base_address_sampling_is_reproducible_and_uniform():
    a = sample_base_address(4096, 3, generator=torch.Generator().manual_seed(1))
    b = sample_base_address(4096, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    counts = torch.bincount(a, minlength=8).float()
    assert a.min() >= 0 and a.max() <= 7
    assert (counts / counts.sum() - 1 / 8).abs().max() < 0.03


def _tiny_memory(**kwargs):
    return tiny_memory(decoder_input_size=0, **kwargs)


def test_bind_uses_random_base_in_training_and_zero_in_eval():
    memory = _tiny_memory()
    states = torch.randn(64, 6, 8)
    trained = memory.train().bind(states, generator=torch.Generator().manual_seed(0))
    assert trained.base_address.unique().numel() > 8
    evaluated = memory.eval().bind(states)
    assert torch.equal(evaluated.base_address, torch.zeros(64, dtype=torch.long))
    assert torch.equal(evaluated.address_bank[0], build_address_bank(torch.tensor([0]), 6, 5)[0])


def test_bind_override_and_padding_side_independence():
    memory = _tiny_memory().eval()
    states = torch.randn(2, 5, 8)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    bound_right = memory.bind(states, right, base_address=torch.tensor([30, 3]))
    bound_left = memory.bind(states, left, base_address=torch.tensor([30, 3]))
    # real slots get consecutive addresses from p_B whatever the padding side (30, 31, 0 wraps at 2^5)
    assert torch.equal(bound_right.address_bank[0, :3], bound_left.address_bank[0, 2:])
    assert torch.equal(bound_right.address_bank[0, :3], build_address_bank(torch.tensor([30]), 3, 5)[0])


def test_too_long_input_asks_for_more_address_bits():
    memory = _tiny_memory(address_bits=3)
    with pytest.raises(ValueError, match="raise address_bits to at least 4"):
        memory.bind(torch.randn(1, 9, 8))
