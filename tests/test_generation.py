"""Cached generation of PanmForSeq2SeqLM: greedy, beam search and sampling vs teacher forcing.

PANM's output layer `g^o[-1]` is zero-initialised in placement "stack", which would make
PANM invisible in the logits; every model here randomises it so that a wrong PANM state
(lost, stale or left in the old beam order) changes the tokens and the scores.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BartConfig, MarianConfig, T5Config

from panm_hf import PanmCache, PanmConfig, PanmForSeq2SeqLM

VOCAB, PAD, EOS, START = 99, 1, 2, 0
MAX_NEW_TOKENS = 8


def _backbone_config(model_type: str):
    ids = {"vocab_size": VOCAB, "pad_token_id": PAD, "eos_token_id": EOS}
    if model_type == "bart":
        return BartConfig(
            d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, bos_token_id=START,
            decoder_start_token_id=START, forced_eos_token_id=None, **ids,
        )  # fmt: skip
    if model_type == "marian":
        return MarianConfig(
            d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, decoder_vocab_size=VOCAB,
            decoder_start_token_id=PAD, **ids,
        )  # fmt: skip
    # num_decoder_layers != num_layers: generate() sizes its cache from num_layers (PanmCache copes).
    return T5Config(
        d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=2, num_heads=2, decoder_start_token_id=PAD, **ids
    )


PLACEMENTS = ("stack", "replace")
# Beyond-the-paper variants: the "shift" update (its state carries the previous address attention) and
# the decoder-queried content read with dropout (eval mode: no dropout, so generation stays deterministic).
VARIANTS = {
    "attention": {},
    "shift": {"pointer_update": "shift"},
    "content": {"content_read": "decoder", "panm_dropout": 0.1},
    "controller": {"content_read": "controller", "panm_dropout": 0.1},
    "output_decoder_input": {"content_read": "decoder", "output_decoder_input": True, "panm_dropout": 0.1},
}
# (backbone, placement, variant): the paper's Pointer Unit everywhere, the variants on some backbones.
CASES = [
    *[(model_type, placement, "attention") for model_type in ("bart", "t5", "marian") for placement in PLACEMENTS],
    ("bart", "replace", "shift"),
    ("t5", "stack", "shift"),
    ("marian", "residual", "content"),
    ("t5", "residual", "attention"),
    ("bart", "stack", "content"),
    ("bart", "residual", "controller"),
    ("t5", "replace", "controller"),
    ("bart", "replace", "output_decoder_input"),
    ("bart", "top", "output_decoder_input"),
    ("t5", "top", "attention"),
]


def build_model(model_type: str, placement: str, variant: str = "attention") -> PanmForSeq2SeqLM:
    torch.manual_seed(0)
    config = PanmConfig(
        text_config=_backbone_config(model_type).to_dict(),
        address_bits=6,
        pointer_hidden_size=16,
        controller_hidden_size=16,
        mlp_hidden_size=16,
        placement=placement,
        **VARIANTS[variant],
    )
    model = PanmForSeq2SeqLM(config).eval()
    output_layer = model.panm.controller.output_mlp[-1]
    with torch.no_grad():  # make PANM matter: g^o's last layer is zero in "stack"
        output_layer.weight.normal_(0.0, 1.0)
        output_layer.bias.normal_(0.0, 1.0)
        if variant == "shift":  # and the shift depend on the Pointer Units' state (zero weights at init)
            model.panm.pointer_units.arithmetic_head.weight.normal_(0.0, 1.0)
    return model


def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (3, 7), generator=generator)  # (batch, src_len)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 5:] = 0  # one padded source: PANM's memory mask must follow it
    input_ids[0, 5:] = PAD
    return input_ids, attention_mask


# Only the model decides the tokens: no processor may change the scores.
PLAIN = {"min_length": 0, "no_repeat_ngram_size": 0, "forced_eos_token_id": None, "forced_bos_token_id": None}


def teacher_forced_log_probs(model, input_ids, attention_mask, sequences) -> torch.Tensor:
    """Per-sequence sum of log p(token) over the generated tokens, up to and including the first EOS."""
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences[:, :-1], use_cache=False
        ).logits  # (batch, new_tokens, vocab)
    targets = sequences[:, 1:]  # (batch, new_tokens)
    token_log_probs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    is_eos = (targets == EOS).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # positions after the first EOS are padding
    return token_log_probs.masked_fill(after_eos, 0.0).sum(-1)


def test_randomised_panm_changes_logits():
    """Guard for the other tests: PANM must actually change the backbone's output."""
    model = build_model("bart", "stack")
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.full((3, 1), START)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        model.panm.controller.output_mlp[-1].weight.zero_()
        model.panm.controller.output_mlp[-1].bias.zero_()
        backbone_logits = model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits
    assert (logits - backbone_logits).abs().max() > 1e-1


@pytest.mark.parametrize("model_type,placement,variant", CASES)
def test_greedy_with_cache_equals_without_cache(model_type, placement, variant):
    model = build_model(model_type, placement, variant)
    input_ids, attention_mask = source_batch()
    kwargs = {"max_new_tokens": MAX_NEW_TOKENS, "do_sample": False, "num_beams": 1, **PLAIN}
    cached = model.generate(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **kwargs)
    uncached = model.generate(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    assert cached.shape[0] == 3 and cached.shape[1] > 1
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("model_type,placement,variant", CASES)
def test_beam_scores_equal_teacher_forced_log_probs(model_type, placement, variant):
    model = build_model(model_type, placement, variant)
    input_ids, attention_mask = source_batch()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=3,
        num_return_sequences=3,
        length_penalty=0.0,
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
        return_dict_in_generate=True,
        output_scores=True,
        **PLAIN,
    )
    assert out.sequences.shape[0] == 9
    expected = teacher_forced_log_probs(
        model, input_ids.repeat_interleave(3, 0), attention_mask.repeat_interleave(3, 0), out.sequences
    )
    torch.testing.assert_close(out.sequences_scores, expected, atol=1e-4, rtol=1e-4)
    assert isinstance(out.past_key_values, PanmCache)


@pytest.mark.parametrize("model_type,placement,variant", CASES)
def test_step_by_step_logits_equal_teacher_forcing(model_type, placement, variant):
    model = build_model(model_type, placement, variant)
    input_ids, attention_mask = source_batch()
    generator = torch.Generator().manual_seed(2)
    start = model.config.decoder_start_token_id
    decoder_input_ids = torch.cat(
        [torch.full((3, 1), start), torch.randint(3, VOCAB, (3, 5), generator=generator)], dim=1
    )  # (batch, tgt_len)
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            steps.append(out.logits)
    assert cache.panm_steps == decoder_input_ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_cache_is_taken_under_either_name():
    """transformers 5.24 renamed `past_key_values` to `cache`: both names decode alike; both at once is an error."""
    model = build_model("bart", "residual", "shift")
    input_ids, attention_mask = source_batch()
    source = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": True}
    start = torch.full((3, 1), model.config.decoder_start_token_id)  # (batch, 1)
    logits_by_name = []
    with torch.no_grad():
        for name in ("past_key_values", "cache"):
            cache = model(**source, decoder_input_ids=start).past_key_values  # a fresh PanmCache per name
            logits_by_name.append(model(**source, decoder_input_ids=start + 1, **{name: cache}).logits)
        with pytest.raises(ValueError, match="both `cache` and `past_key_values`"):
            model(**source, decoder_input_ids=start + 1, cache=cache, past_key_values=cache)
    assert cache.panm_steps == 2
    torch.testing.assert_close(logits_by_name[0], logits_by_name[1], atol=0, rtol=0)


@pytest.mark.parametrize("model_type,placement", [("bart", "replace"), ("t5", "stack")])
def test_sampling_with_seed_is_reproducible_and_valid(model_type, placement):
    model = build_model(model_type, placement)
    input_ids, attention_mask = source_batch()
    kwargs = {"do_sample": True, "top_k": 0, "max_new_tokens": MAX_NEW_TOKENS, "num_return_sequences": 2, **PLAIN}
    torch.manual_seed(3)
    first = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    torch.manual_seed(3)
    second = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    assert first.shape[0] == 6
    assert torch.equal(first, second)
    assert int(first.min()) >= 0 and int(first.max()) < VOCAB


def test_each_generated_token_costs_one_panm_step():
    model = build_model("bart", "replace")
    input_ids, attention_mask = source_batch()
    pointer_steps: list[int] = []  # num_steps of every Pointer Unit loop, one entry per PANM call
    decoder_steps: list[int] = []  # steps of z_t handed to PANM per call
    hooks = [
        model.panm.pointer_units.register_forward_pre_hook(lambda module, args: pointer_steps.append(args[-1])),
        model.panm.register_forward_pre_hook(lambda module, args: decoder_steps.append(args[1].shape[1])),
    ]
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            return_dict_in_generate=True,
            **PLAIN,
        )
    finally:
        for hook in hooks:
            hook.remove()
    new_tokens = out.sequences.shape[1] - 1
    assert new_tokens == MAX_NEW_TOKENS
    # One model call per generated token, each advancing PANM by exactly one step.
    assert pointer_steps == [1] * new_tokens
    assert decoder_steps == [1] * new_tokens
    assert out.past_key_values.panm_steps == new_tokens


def test_cache_reorder_moves_panm_state_with_the_beams():
    model = build_model("bart", "stack")
    input_ids, attention_mask = source_batch()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=torch.zeros(3, 2).long())
    cache = out.past_key_values
    before = cache.panm_state.controller_hidden.clone()
    before_keys = cache.self_attention_cache.layers[0].keys.clone()
    order = torch.tensor([2, 0, 0])
    cache.reorder_cache(order)
    torch.testing.assert_close(cache.panm_state.controller_hidden, before[order])
    torch.testing.assert_close(cache.panm_memory.memory_states, out.encoder_last_hidden_state[order])
    torch.testing.assert_close(cache.self_attention_cache.layers[0].keys, before_keys[order])


def test_cache_cannot_be_cropped():
    cache = PanmCache.from_cache(None)
    assert not cache.is_croppable
    with pytest.raises(ValueError, match="cannot be cropped"):
        cache.crop(1)
