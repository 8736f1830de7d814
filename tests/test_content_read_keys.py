"""`content_read_keys="end_distance"`: the decoder content read's keys carry each slot's distance from the last
real slot, the same at every input length and on either padding side."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_matching_teacher_forcing, tiny_replace_seq2seq

from panm_hf import PanmForSeq2SeqLM, PanmMemoryConfig
from panm_hf.addressing import binary_codes
from panm_hf.reads import DecoderContentReader

CONFIG = PanmMemoryConfig(content_read="decoder", content_read_keys="end_distance", address_bits=5)


def reader() -> DecoderContentReader:
    torch.manual_seed(0)
    return DecoderContentReader(CONFIG, memory_dim=8, decoder_input_size=6).double()


def test_codes_count_the_real_slots_after_each_slot_on_either_padding_side():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    codes = reader().end_distance_codes(mask, torch.float64)  # (3, 6, 5)
    expected = {0: [3, 2, 1, 0], 1: [3, 2, 1, 0], 2: [5, 4, 3, 2, 1, 0]}
    for row, distances in expected.items():
        real = codes[row][mask[row]]  # (real slots, bits)
        torch.testing.assert_close(real, binary_codes(torch.tensor(distances), 5).double())


def test_weights_on_the_last_slots_do_not_depend_on_the_input_length():
    # a memory of zeros: the keys are the distance codes alone, so the last slots of a short and of a long
    # memory score alike, and their weights keep the same ratios
    read = reader()
    query = torch.randn(1, 3, 6, dtype=torch.float64)  # (batch, steps, dec)
    weights = []
    for slots in (4, 9):
        memory = torch.zeros(1, slots, 8, dtype=torch.float64)
        _, weight = read(query, memory, torch.ones(1, slots, dtype=torch.bool))  # (1, 3, 1, slots)
        weights.append(weight[0, :, 0, -4:])  # (steps, 4): the last four slots
    ratios = [w / w[:, -1:] for w in weights]
    torch.testing.assert_close(ratios[0], ratios[1])
    # the plain keys give a memory of zeros uniform weights: the distance is what the new keys add
    plain = DecoderContentReader(PanmMemoryConfig(content_read="decoder"), memory_dim=8, decoder_input_size=6)
    _, uniform = plain.double()(query, torch.zeros(1, 9, 8, dtype=torch.float64), torch.ones(1, 9, dtype=torch.bool))
    torch.testing.assert_close(uniform, torch.full_like(uniform, 1 / 9))
    assert plain.end_distance_key is None  # checkpoints of the default keep their keys


def test_values_are_the_memory_and_padding_gets_no_weight():
    read = reader()
    memory = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    values, weights = read(torch.randn(2, 3, 6, dtype=torch.float64), memory, mask)  # (2, 3, 1, 8), (2, 3, 1, 5)
    assert torch.all(weights[0, :, :, 3:] == 0)
    torch.testing.assert_close(values[:, :, 0], torch.bmm(weights[:, :, 0], memory))


def test_bad_uses_raise_by_name():
    with pytest.raises(ValueError, match='content_read_keys=\'end_distance\' keys the decoder content read'):
        PanmMemoryConfig(content_read_keys="end_distance")
    with pytest.raises(ValueError, match="content_read_keys='distance' is not supported"):
        PanmMemoryConfig(content_read="decoder", content_read_keys="distance")
    per_step = torch.ones(1, 3, 4, dtype=torch.bool)  # a causal model's (batch, steps, slots) mask
    with pytest.raises(ValueError, match="needs one memory per sample"):
        reader()(torch.randn(1, 3, 6, dtype=torch.float64), torch.randn(1, 4, 8, dtype=torch.float64), per_step)


def test_seq2seq_model_with_end_distance_keys_trains_generates_and_round_trips(tmp_path):
    model, source, mask, labels = tiny_replace_seq2seq(content_read="decoder", content_read_keys="end_distance")
    model(input_ids=source, attention_mask=mask, labels=labels).loss.backward()
    assert model.panm.content_reader.end_distance_key.weight.grad.abs().sum() > 0
    model.eval()
    generated = greedy_matching_teacher_forcing(model, source, mask, 5)  # cached steps read with the same keys
    calls = []
    hook = model.panm.content_reader.end_distance_key.register_forward_hook(lambda *args: calls.append(1))
    beams = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=5, do_sample=False, num_beams=3,
                           forced_eos_token_id=None, min_new_tokens=5)  # fmt: skip
    hook.remove()
    assert beams.shape[1] == 6 and len(calls) == 1  # the keys come with the memory: once per generate, not per step
    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path).eval()
    inputs = {"input_ids": source, "attention_mask": mask, "decoder_input_ids": generated}
    torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits)


def test_end_distance_only_reads_by_place_whatever_the_slots_hold():
    torch.manual_seed(0)
    config = PanmMemoryConfig(content_read="decoder", content_read_keys="end_distance_only", address_bits=5)
    read = DecoderContentReader(config, memory_dim=8, decoder_input_size=6).double()
    query = torch.randn(2, 3, 6, dtype=torch.float64)
    short, long = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(2, 9, 8, dtype=torch.float64)
    _, weights_short = read(query, short, torch.ones(2, 4, dtype=torch.bool))
    _, weights_long = read(query, long, torch.ones(2, 9, dtype=torch.bool))
    # other contents, other lengths: the last four slots' weights keep their ratios
    ratios = [w[..., -4:] / w[..., -1:] for w in (weights_short, weights_long)]
    torch.testing.assert_close(ratios[0], ratios[1])
    values, _ = read(query, long, torch.ones(2, 9, dtype=torch.bool))
    torch.testing.assert_close(values[:, :, 0], torch.bmm(weights_long[:, :, 0], long))  # the slots are the values
