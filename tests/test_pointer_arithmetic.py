"""Beyond-the-paper options of the core: shift pointer arithmetic and distractor addresses.

Each test asserts a value: hand-checked shifts, exact reduction to the paper's Pointer Unit,
principle II for both variants, and the distractor draw's guarantees.
"""

import pytest
import torch
from conftest import tiny_memory

from panm_hf import PanmConfig, PanmForSeq2SeqLM
from panm_hf.addressing import sample_distractor_addresses
from panm_hf.memory import PanmMemory
from panm_hf.pointer_arithmetic import sharpen, shift_candidates


def tiny(**kwargs) -> PanmMemory:
    return tiny_memory(**{"address_bits": 6, **kwargs})


def test_shift_candidates_hand_checked():
    weights = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5, 0.5]])
    moves = shift_candidates(weights, 1)  # (rows, 3, slots): steps +1, 0, -1
    assert torch.equal(moves[0], torch.tensor([[0, 0, 0, 1.0, 0], [0, 0, 1.0, 0, 0], [0, 1.0, 0, 0, 0]]))
    assert torch.equal(moves[1, 0], torch.tensor([0, 0, 0, 0, 0.5]))  # +1: the last slot's weight is dropped
    assert torch.equal(moves[1, 2], torch.tensor([0, 0, 0.5, 0.5, 0]))
    far = shift_candidates(weights, 2)  # steps +2 .. -2
    assert torch.equal(far[0, 0], torch.tensor([0, 0, 0, 0, 1.0])) and torch.equal(far[0, 4], torch.eye(5)[0])
    mixed = torch.einsum("rk,rks->rs", torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]]), moves)
    torch.testing.assert_close(mixed, torch.tensor([[0, 0, 0.8, 0.2, 0], [0, 0, 0.5, 0.5, 0]]))


def test_sharpen_hand_checked_masked_and_finite_gamma_gradient():
    weights = torch.tensor([[0.0, 0.25, 0.75, 0.0], [0.0, 0.0, 0.0, 0.0], [0.3, 0.7, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False], [False, False, False, False]])
    mask_bias = torch.zeros(3, 4).masked_fill(~mask, -65504.0)
    gamma = torch.tensor([[2.0], [3.0], [2.0]], requires_grad=True)
    out = sharpen(weights, gamma, mask_bias, mask)
    torch.testing.assert_close(out[0], torch.tensor([0.0, 0.0625 / 0.625, 0.5625 / 0.625, 0.0]))
    torch.testing.assert_close(out[1], torch.tensor([0.5, 0.5, 0.0, 0.0]))  # no weight left: uniform, no NaN
    assert torch.equal(out[2], torch.zeros(4))  # an all-padding row stays zero
    out[0, 1].backward()
    assert torch.isfinite(gamma.grad).all() and gamma.grad[0, 0] < 0  # sharper => less weight on the smaller
    torch.testing.assert_close(sharpen(weights, torch.ones(3, 1), mask_bias, mask)[0], weights[0])


def test_faithful_default_has_no_extra_parameters_and_distractors_vanish_in_eval():
    faithful = tiny()
    assert faithful.pointer_units.arithmetic_head is None
    distract = tiny(address_distractors=8)
    assert distract.state_dict().keys() == faithful.state_dict().keys()
    distract.load_state_dict(faithful.state_dict())
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    assert torch.equal(faithful(states, decoder).hidden_states, distract(states, decoder).hidden_states)


def test_closed_shift_gate_reduces_to_the_papers_pointer_unit():
    faithful = tiny()
    shift = tiny(pointer_update="shift")
    shift.load_state_dict(faithful.state_dict(), strict=False)
    with torch.no_grad():  # all weight on "attend" and gamma = 1: only the paper's attention moves the pointer
        shift.pointer_units.arithmetic_head.bias[:, -1] = 1e4
        shift.pointer_units.arithmetic_head.sharpening.fill_(-1e4)
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    a = faithful(states, decoder, attention_mask=mask, output_attentions=True)
    b = shift(states, decoder, attention_mask=mask, output_attentions=True)
    torch.testing.assert_close(b.address_attentions, a.address_attentions, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.hidden_states, a.hidden_states, atol=1e-6, rtol=0)


def test_open_shift_gate_walks_one_slot_per_step_at_any_length():
    memory = tiny(pointer_update="shift", address_bits=10, decoder_input_size=0)
    with torch.no_grad():  # all weight on the +1 step, sharp: the pointer is p_B + t at step t
        head = memory.pointer_units.arithmetic_head
        head.bias.zero_()
        head.bias[:, 0] = 1e4  # moves are ordered +1, 0, -1, attend
        head.sharpening.fill_(5.0)
    slots = 300
    out = memory(torch.randn(1, slots, 8), num_steps=slots - 1, output_attentions=True)
    walk = out.address_attentions[0, :, 0]  # (steps, slots) the base pointer
    torch.testing.assert_close(walk.argmax(dim=-1), torch.arange(1, slots))
    assert walk.amax(dim=-1).min() > 0.999


def test_walk_init_starts_the_base_pointer_forward_and_the_end_pointer_backward():
    memory = tiny(pointer_update="shift", shift_init="walk", address_bits=10, decoder_input_size=0)
    head = memory.pointer_units.arithmetic_head
    assert torch.equal(head.bias, torch.tensor([[2.0, 0, 0, -1], [0, 0, 2, -1]]))  # moves +1, 0, -1, attend
    assert torch.equal(head.weight, torch.zeros_like(head.weight))  # the moves do not depend on h^a_t yet
    slots, steps = 40, 12
    out = memory(torch.randn(3, slots, 8), num_steps=steps, output_attentions=True)
    base, end = out.address_attentions[:, :, 0], out.address_attentions[:, :, 1]  # (batch, steps, slots)
    torch.testing.assert_close(base.argmax(-1), torch.arange(1, steps + 1).expand(3, -1))
    torch.testing.assert_close(end.argmax(-1), torch.arange(slots - 2, slots - 2 - steps, -1).expand(3, -1))
    uniform = tiny(pointer_update="shift", address_bits=10, decoder_input_size=0).pointer_units.arithmetic_head
    assert torch.equal(uniform.bias, torch.tensor([[0.0, 0, 0, -1]]).expand(2, -1))


@pytest.mark.parametrize("options", [{"pointer_update": "shift"}, {"address_distractors": 6}])
def test_variants_keep_principle_two(options):
    memory = tiny(**options).train()
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    states = torch.randn(2, 5, 8, requires_grad=True)
    runs = []
    for content in (states, torch.randn(2, 5, 8) * 10):
        # same base addresses and distractor draws for both contents
        bound = memory.bind(content, mask, generator=torch.Generator().manual_seed(3))
        runs.append(memory(bound, torch.randn(2, 4, 6), output_attentions=True))
    assert torch.equal(runs[0].address_attentions, runs[1].address_attentions)
    assert torch.equal(runs[0].state.pointer_weights, runs[1].state.pointer_weights)
    (grad,) = torch.autograd.grad(runs[0].state.pointers.sum(), states, allow_unused=True)
    assert grad is None
    assert not torch.allclose(runs[0].hidden_states, runs[1].hidden_states)


def test_distractor_addresses_share_low_bits_and_never_hit_a_real_address():
    base = torch.tensor([0, 1000, 517, 1023])
    lengths = torch.tensor([12, 1, 7, 12])
    drawn = sample_distractor_addresses(base, lengths, 12, 500, 10, generator=torch.Generator().manual_seed(0))
    assert drawn.shape == (4, 500)
    real = (base.unsqueeze(-1) + torch.arange(12)) % 1024  # (batch, slots)
    for row in range(4):
        real_row = set(real[row, : lengths[row]].tolist())
        assert not real_row & set(drawn[row].tolist())
        # each distractor is a real address plus a multiple of 16 (the power of two covering 12 slots)
        offsets = (drawn[row] - base[row]) % 1024
        assert ((offsets % 16) < lengths[row]).all()
    assert len(set(((drawn - base.unsqueeze(-1)) % 1024 // 16).flatten().tolist())) > 40  # high bits vary
    assert sample_distractor_addresses(base, lengths, 600, 5, 10) is None  # no high bit is left


def test_distractors_take_weight_in_training_only():
    memory = tiny(address_distractors=8, decoder_input_size=0).train()
    out = memory(torch.randn(2, 5, 8), num_steps=3, output_attentions=True)
    assert out.memory.address_bank.shape == (2, 13, 6)
    assert out.address_attentions.shape == (2, 3, 2, 5)  # reads see the real slots only
    assert (out.address_attentions.sum(-1) < 1 - 1e-3).all()  # weight on distractors reads nothing
    memory.eval()
    out = memory(torch.randn(2, 5, 8), num_steps=3, output_attentions=True)
    torch.testing.assert_close(out.address_attentions.sum(-1), torch.ones(2, 3, 2))


@pytest.mark.parametrize(
    "options,field",
    [
        ({"pointer_update": "jump"}, "pointer_update"),
        ({"shift_range": 0}, "shift_range"),
        ({"address_distractors": -1}, "address_distractors"),
        ({"pointer_update": "shift", "address_distractors": 4}, "address_distractors"),
        ({"pointer_update": "shift", "shift_init": "forward"}, "shift_init"),
        ({"shift_init": "walk"}, "shift_init"),  # only pointer_update="shift" has moves to start
    ],
)
def test_variant_config_errors_name_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        PanmConfig(**options)


def test_hf_model_starts_the_shift_head_at_its_documented_init(tmp_path):
    config = PanmConfig(
        text_config={"model_type": "bart", "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
                     "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 16,
                     "decoder_ffn_dim": 16, "vocab_size": 50, "max_position_embeddings": 32},
        address_bits=6, pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
        pointer_update="shift", shift_range=2,
    )  # fmt: skip
    model = PanmForSeq2SeqLM(config)
    head = model.panm.pointer_units.arithmetic_head
    assert head.weight.shape == (2, 8, 6)  # (units, hidden, 2K + 1 steps + attend)
    assert torch.equal(head.weight, torch.zeros_like(head.weight))
    assert torch.equal(head.bias, torch.tensor([[0.0, 0, 0, 0, 0, -1]]).expand(2, -1))
    assert torch.equal(head.sharpening, torch.zeros(2))
    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path)
    assert loaded.config.pointer_update == "shift" and loaded.config.shift_range == 2
    assert torch.equal(loaded.panm.pointer_units.arithmetic_head.bias, head.bias)
    walk = PanmForSeq2SeqLM(PanmConfig(**{**config.to_dict(), "shift_init": "walk"}))
    walk_bias = walk.panm.pointer_units.arithmetic_head.bias  # K = 2: moves +2, +1, 0, -1, -2, attend
    assert torch.equal(walk_bias, torch.tensor([[0.0, 2, 0, 0, 0, -1], [0, 0, 0, 2, 0, -1]]))
    walk.save_pretrained(tmp_path / "walk")
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path / "walk")
    assert loaded.config.shift_init == "walk"
    assert torch.equal(loaded.panm.pointer_units.arithmetic_head.bias, walk_bias)
