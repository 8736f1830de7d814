"""PanmForCausalLM on tiny GPT-2, Llama and GPT-NeoX backbones.

PANM's output layer `g^o[-1]` is zero-initialised, which would make PANM invisible in the
logits; `activate_panm` randomises it wherever a test must see PANM's effect (a wrong causal
mask, a lost or stale cached state, a state left in the old beam order).
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BartConfig,
    BertConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    Trainer,
    TrainingArguments,
)

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import PanmConfig, PanmDynamicCache, PanmForCausalLM
from panm_hf.addressing import binary_codes

VOCAB, BOS, PAD, EOS = 99, 0, 1, 2
IDS = {"vocab_size": VOCAB, "bos_token_id": BOS, "pad_token_id": PAD, "eos_token_id": EOS}
TINY_PANM = {"address_bits": 6, "pointer_hidden_size": 12, "controller_hidden_size": 12, "mlp_hidden_size": 10}
CAUSAL_BACKBONES = {
    "gpt2": lambda: GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, **IDS),
    "llama": lambda: LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, max_position_embeddings=64, **IDS),
    "gpt_neox": lambda: GPTNeoXConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=64, **IDS),
}  # fmt: skip
NAMES = sorted(CAUSAL_BACKBONES)
# Only the model decides the tokens: no processor may change the scores.
PLAIN = {"min_length": 0, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}


def wrap(name: str, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    backbone = AutoModelForCausalLM.from_config(CAUSAL_BACKBONES[name]()).eval()
    return backbone, PanmForCausalLM.from_backbone(backbone, **{**TINY_PANM, **kwargs}).eval()


def activate_panm(model: PanmForCausalLM, seed: int = 1) -> PanmForCausalLM:
    """Random weights for g^o's zero-initialised last layer (and the shift head) so PANM changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    layer = model.panm.controller.output_mlp[-1]
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator))
        head = model.panm.pointer_units.arithmetic_head
        if head is not None:
            head.weight.copy_(torch.randn(head.weight.shape, generator=generator))
    return model


def prompts(batch_size: int = 3, length: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: row 0 has 2 padding tokens, row 1 has 1, the others none."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch_size, length), generator=generator)  # (batch, length)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    attention_mask[1, :1] = 0
    return input_ids.masked_fill(attention_mask == 0, PAD), attention_mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """What generate() gives the backbone for left padding: positions counted over real tokens."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("name", NAMES)
def test_fresh_wrapper_returns_exactly_the_backbone_logits(name):
    backbone, model = wrap(name, content_read="decoder" if name == "llama" else "none")
    weights = {key: value.clone() for key, value in backbone.state_dict().items()}
    input_ids, attention_mask = prompts()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids(attention_mask)}
    with torch.no_grad():
        expected = backbone(**inputs, labels=input_ids)
        actual = model(**inputs, labels=input_ids)
    assert torch.equal(actual.logits, expected.logits)
    torch.testing.assert_close(actual.loss, expected.loss)
    for key, value in model.backbone.state_dict().items():  # wrapping never re-initialises the backbone
        assert torch.equal(value, weights[key]), key


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "options", [{}, {"pointer_update": "shift"}, {"content_read": "decoder"}, {"content_read": "controller"}]
)
def test_future_tokens_do_not_change_earlier_logits(name, options):
    _, model = wrap(name, **options)
    model = activate_panm(model)
    input_ids, _ = prompts(batch_size=2, length=8)
    changed = input_ids.clone()
    changed[:, 5:] = torch.randint(3, VOCAB, (2, 3), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        out = model(input_ids=input_ids, output_attentions=True)
        other = model(input_ids=changed)
    torch.testing.assert_close(out.logits[:, :5], other.logits[:, :5], atol=1e-6, rtol=0)
    assert (out.logits[:, 5:] - other.logits[:, 5:]).abs().max() > 1e-3
    # step t puts no address or Mode-2 weight on slots s > t
    future = torch.ones(8, 8).triu(1).bool()  # (steps, slots)
    assert out.address_attentions.masked_select(future[None, :, None, :]).abs().max() == 0
    assert out.mode2_attentions.masked_select(future[None, :, None, :]).abs().max() == 0
    if options.get("content_read") is None:
        assert out.content_attentions is None
    else:  # the content read too: one distribution per step over the slots up to it
        assert out.content_attentions.masked_select(future[None]).abs().max() == 0
        torch.testing.assert_close(out.content_attentions.sum(-1), torch.ones(2, 8))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_not_memory_and_does_not_shift_addresses(name, side):
    _, model = wrap(name)
    model = activate_panm(model)
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, VOCAB, (1, 5), generator=generator)  # (1, 5)
    padding = torch.full((1, 3), PAD)
    input_ids = torch.cat([padding, tokens] if side == "left" else [tokens, padding], dim=1)  # (1, 8)
    attention_mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 5)] if side == "left" else
                               [torch.ones(1, 5), torch.zeros(1, 3)], dim=1).long()  # fmt: skip
    real = attention_mask[0].bool()
    with torch.no_grad():
        alone = model(input_ids=tokens, output_attentions=True)
        padded = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                       output_attentions=True)  # fmt: skip
    torch.testing.assert_close(padded.logits[0, real], alone.logits[0], atol=1e-5, rtol=0)
    # the same addresses: the address attention over the real tokens is the same map
    torch.testing.assert_close(padded.address_attentions[0, real], alone.address_attentions[0], atol=1e-6, rtol=0)


def test_causal_initial_state_and_end_pointer_follows_the_newest_slot():
    """Both pointers start at p_B; unit 1 restarts from the newest slot at every step (it reads relative to it)."""
    _, model = wrap("gpt2", pointer_update="shift")
    head = model.panm.pointer_units.arithmetic_head
    with torch.no_grad():  # every unit always takes the step -1 (moves are ordered +1, 0, -1, attend)
        head.bias.copy_(torch.tensor([0.0, 0.0, 60.0, 0.0]).expand_as(head.bias))
    seen = {}
    hook = model.panm.pointer_units.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(pointers=args[0], anchors=kwargs["anchors"]), with_kwargs=True
    )
    input_ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    base = torch.tensor([5, 40])
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, base_address=base, output_attentions=True)
    finally:
        hook.remove()
    bits = model.config.address_bits
    start = binary_codes(base, bits)  # (batch, bits)
    assert torch.equal(seen["pointers"], start.unsqueeze(1).expand(-1, 2, -1))  # p^a_0 = p_B for both units
    newest = binary_codes(base.unsqueeze(-1) + torch.arange(7), bits)  # (batch, steps, bits)
    assert torch.equal(seen["anchors"][0], newest)
    end_pointer = out.address_attentions[:, :, 1]  # (batch, steps, slots)
    expected = torch.eye(7).roll(-1, dims=1).tril()  # step t >= 1 reads slot t - 1
    expected[0, 0] = 1.0  # step 0: the step falls off the memory; sharpening spreads over the one slot
    torch.testing.assert_close(end_pointer, expected.expand(2, -1, -1), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "options", [{}, {"pointer_update": "shift"}, {"address_distractors": 4}, {"content_read": "controller"}]
)
def test_gradients_reach_every_panm_parameter(options):
    _, model = wrap("gpt2", **options)
    model = activate_panm(model).train()
    input_ids, attention_mask = prompts()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss.backward()
    for name, parameter in model.panm.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


# (backbone, PANM options): the paper's Pointer Unit on every backbone, "shift", and main's content read.
CASES = [(name, {}) for name in NAMES] + [("llama", {"pointer_update": "shift"}),
                                          ("gpt2", {"content_read": "decoder", "panm_dropout": 0.1}),
                                          ("llama", {"content_read": "controller"}),
                                          ("gpt2", {"output_decoder_input": True})]  # fmt: skip
CASE_IDS = [f"{name}-" + ("-".join(f"{k}={v}" for k, v in options.items()) or "paper") for name, options in CASES]


def greedy(model, input_ids, attention_mask, use_cache, new_tokens=8):
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, num_beams=1, use_cache=use_cache,
                          **PLAIN)  # fmt: skip


@pytest.mark.parametrize("name,options", CASES, ids=CASE_IDS)
def test_greedy_with_cache_equals_without_cache(name, options):
    _, model = wrap(name, **options)
    model = activate_panm(model)
    input_ids, attention_mask = prompts()
    cached = greedy(model, input_ids, attention_mask, use_cache=True)
    assert cached.shape == (3, 6 + 8)
    assert torch.equal(cached, greedy(model, input_ids, attention_mask, use_cache=False))


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_prompts_generate_as_alone(name):
    _, model = wrap(name)
    model = activate_panm(model)
    input_ids, attention_mask = prompts()
    batched = greedy(model, input_ids, attention_mask, use_cache=True)
    for row, pads in enumerate([2, 1, 0]):
        alone = greedy(model, input_ids[row : row + 1, pads:], None, use_cache=True)
        assert torch.equal(batched[row, pads:], alone[0]), row


@pytest.mark.parametrize("name,options", CASES, ids=CASE_IDS)
def test_beam_scores_equal_teacher_forced_log_probs(name, options):
    _, model = wrap(name, **options)
    model = activate_panm(model)
    input_ids, attention_mask = prompts(batch_size=2)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, num_return_sequences=3,
                         length_penalty=0.0, do_sample=False, max_new_tokens=6, return_dict_in_generate=True,
                         output_scores=True, **PLAIN)  # fmt: skip
    assert isinstance(out.past_key_values, PanmDynamicCache)
    sequences = out.sequences  # (batch*3, 6 + new)
    mask = torch.cat([attention_mask.repeat_interleave(3, 0), torch.ones_like(sequences[:, 6:])], dim=1)
    with torch.no_grad():
        logits = model(input_ids=sequences, attention_mask=mask, position_ids=position_ids(mask),
                       use_cache=False).logits  # fmt: skip
    # position t predicts token t + 1: the new tokens (from position 6) are predicted at positions 5..
    log_probs = logits[:, 5:-1].log_softmax(-1).gather(-1, sequences[:, 6:].unsqueeze(-1)).squeeze(-1)
    is_eos = (sequences[:, 6:] == EOS).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # positions after the first EOS are padding
    expected = log_probs.masked_fill(after_eos, 0.0).sum(-1)
    torch.testing.assert_close(out.sequences_scores, expected, atol=1e-4, rtol=1e-4)


def test_cached_steps_equal_teacher_forcing_and_cost_one_panm_step_each():
    _, model = wrap("llama", pointer_update="shift")
    model = activate_panm(model)
    input_ids, attention_mask = prompts(length=9)
    inputs = {"attention_mask": attention_mask, "position_ids": position_ids(attention_mask)}
    steps: list[int] = []  # num_steps of every Pointer Unit loop
    with torch.no_grad():
        full = model(input_ids=input_ids, **inputs).logits
        hook = model.panm.pointer_units.register_forward_pre_hook(lambda module, args: steps.append(args[5]))
        try:
            cache, pieces = None, []
            for start, stop in [(0, 4), (4, 5), (5, 6), (6, 9)]:  # a prompt, two single tokens, three at once
                out = model(input_ids=input_ids[:, start:stop], attention_mask=attention_mask[:, :stop],
                            position_ids=inputs["position_ids"][:, start:stop], past_key_values=cache,
                            use_cache=True)  # fmt: skip
                cache = out.past_key_values
                pieces.append(out.logits)
        finally:
            hook.remove()
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
    assert steps == [4, 1, 1, 3]  # the prompt (at most 4 real tokens per row), then one step per new token
    assert cache.panm_steps == 9 and cache.panm_memory.lengths.tolist() == [7, 8, 9]


def test_cache_reorder_moves_panm_state_with_the_beams():
    _, model = wrap("gpt2")
    input_ids, _ = prompts(batch_size=3, length=4)
    with torch.no_grad():
        cache = model(input_ids=input_ids, use_cache=True).past_key_values
    before = cache.panm_state.controller_hidden.clone()
    before_memory = cache.panm_memory.memory_states.clone()
    before_keys = cache.layers[0].keys.clone()
    order = torch.tensor([2, 0, 0])
    cache.reorder_cache(order)
    torch.testing.assert_close(cache.panm_state.controller_hidden, before[order])
    torch.testing.assert_close(cache.panm_memory.memory_states, before_memory[order])
    torch.testing.assert_close(cache.layers[0].keys, before_keys[order])
    assert not cache.is_croppable


def test_save_load_auto_class(tmp_path):
    _, model = wrap("llama")
    model = activate_panm(model)
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).__class__ is PanmConfig
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, PanmForCausalLM)
    input_ids, attention_mask = prompts()
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids, attention_mask=attention_mask).logits,
                           loaded(input_ids=input_ids, attention_mask=attention_mask).logits)  # fmt: skip


def test_trainer_step_ignores_minus_100_labels(tmp_path):
    _, model = wrap("gpt2")
    model = activate_panm(model).train()
    generator = torch.Generator().manual_seed(5)
    input_ids = torch.randint(3, VOCAB, (4, 8), generator=generator)
    labels = input_ids.clone()
    labels[:, :4] = -100  # loss on the second half only
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=labels, base_address=torch.zeros(4, dtype=torch.long))
    expected = torch.nn.functional.cross_entropy(out.logits[:, 3:-1].reshape(-1, VOCAB), input_ids[:, 4:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)

    rows = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab}
            for ids, lab in zip(input_ids, labels)]  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)  # fmt: skip
    before = model.panm.controller.output_mlp[-1].weight.clone()
    result = Trainer(model=model, args=args, train_dataset=rows).train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(model.panm.controller.output_mlp[-1].weight, before)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_resize_token_embeddings_updates_every_config_and_round_trips(tmp_path, name):
    _, model = wrap(name)
    model = activate_panm(model)
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == model.config.text_config.vocab_size == model.backbone.config.vocab_size == 120
    input_ids = torch.tensor([[3, 110, 119, 7]])
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    assert logits.shape == (1, 4, 120)
    if name == "gpt2":  # tied: the LM head is the resized embedding
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids).logits, logits)


def test_generation_beyond_the_address_space_fails_before_any_token():
    _, model = wrap("gpt2", address_bits=4)  # 16 addresses
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    input_ids, attention_mask = prompts(length=6)  # at most 6 real tokens; 2 padding columns in row 0 only
    try:
        assert greedy(model, input_ids, attention_mask, use_cache=True, new_tokens=10).shape[1] == 16
        calls.clear()
        with pytest.raises(ValueError, match="5 address bits are needed") as error:
            greedy(model, input_ids, attention_mask, use_cache=True, new_tokens=11)
    finally:
        hook.remove()
    assert "address_bits=4" in str(error.value) and calls == []
    # padding shared by every prompt is not memory
    padded = torch.cat([torch.full((3, 4), PAD), input_ids], dim=1)
    padded_mask = torch.cat([torch.zeros(3, 4, dtype=torch.long), attention_mask], dim=1)
    assert greedy(model, padded, padded_mask, use_cache=True, new_tokens=10).shape[1] == 20


def test_unsupported_backbones_get_clear_errors():
    bart = BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8)  # fmt: skip
    with pytest.raises(ValueError, match="encoder-decoder.*PanmForSeq2SeqLM.*gpt2"):
        PanmForCausalLM(PanmConfig(text_config=bart, **TINY_PANM))
    bert = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    with pytest.raises(ValueError, match="'bert' is not a supported causal LM.*llama"):
        PanmForCausalLM(PanmConfig(text_config=bert, **TINY_PANM))
    with pytest.raises(ValueError, match="placement='stack' only"):
        PanmForCausalLM(PanmConfig(text_config=CAUSAL_BACKBONES["gpt2"](), placement="replace", **TINY_PANM))
    torch.manual_seed(0)
    bare = AutoModelForCausalLM.from_config(CAUSAL_BACKBONES["llama"]()).model  # LlamaModel: no LM head
    with pytest.raises(ValueError, match="not the bare model"):
        PanmForCausalLM.from_backbone(bare, **TINY_PANM)
