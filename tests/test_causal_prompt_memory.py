"""PanmForCausalLM with the prompt as PANM's memory (`causal_memory="prompt"`, issue 38).

The seq2seq framing inside one stream: memory = the backbone's states over the prompt, decoding
steps = the response from the prompt's last token on. Tiny GPT-2 and Llama backbones from configs;
`activate_panm` randomises g^o's zero-initialised last layer wherever a test must see PANM's effect.
"""

from __future__ import annotations

import pytest
import torch
from test_causal_lm import CAUSAL_BACKBONES, EOS, PAD, PLAIN, TINY_PANM, VOCAB, activate_panm, position_ids, prompts
from transformers import AutoConfig, AutoModelForCausalLM

from panm_hf import PanmConfig, PanmDynamicCache, PanmForCausalLM

NAMES = ["gpt2", "llama"]
PROMPT = {"causal_memory": "prompt"}
# (prompt, response) real lengths of the rows of a training batch: different prompts, different responses
ROWS = [(3, 4), (5, 1), (2, 3)]


def wrap(name: str, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    backbone = AutoModelForCausalLM.from_config(CAUSAL_BACKBONES[name]()).eval()
    return backbone, PanmForCausalLM.from_backbone(backbone, **{**TINY_PANM, **PROMPT, **kwargs}).eval()


def training_batch(side: str = "right", seed: int = 0) -> dict:
    """Rows `prompt + response` of the lengths in ROWS, padded on `side`; labels on the responses only."""
    generator = torch.Generator().manual_seed(seed)
    width = max(p + r for p, r in ROWS)
    input_ids = torch.full((len(ROWS), width), PAD)
    attention_mask = torch.zeros(len(ROWS), width, dtype=torch.long)
    labels = torch.full((len(ROWS), width), -100)
    for row, (prompt, response) in enumerate(ROWS):
        start = 0 if side == "right" else width - prompt - response
        tokens = torch.randint(3, VOCAB, (prompt + response,), generator=generator)
        input_ids[row, start : start + prompt + response] = tokens
        attention_mask[row, start : start + prompt + response] = 1
        labels[row, start + prompt : start + prompt + response] = tokens[prompt:]
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    if side == "left":
        batch["position_ids"] = position_ids(attention_mask)
    return batch


def prompt_lengths() -> torch.Tensor:
    return torch.tensor([prompt for prompt, _ in ROWS])


def greedy(model, input_ids, attention_mask, use_cache=True, new_tokens=6, **kwargs):
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, num_beams=1, use_cache=use_cache,
                          **PLAIN, **kwargs)  # fmt: skip


def test_causal_memory_is_a_validated_config_field(tmp_path):
    with pytest.raises(ValueError, match=r"causal_memory='tokens' is not supported.*\('sequence', 'prompt'\)"):
        PanmConfig(text_config=CAUSAL_BACKBONES["gpt2"](), causal_memory="tokens")
    assert PanmConfig(text_config=CAUSAL_BACKBONES["gpt2"]()).causal_memory == "sequence"  # the default
    _, model = wrap("gpt2")
    model.save_panm(tmp_path / "panm")  # PANM's weights alone (the adapter file) keep the field too
    assert PanmForCausalLM.from_panm(tmp_path / "panm", backbone=model.backbone).config.causal_memory == "prompt"


@pytest.mark.parametrize("name", NAMES)
def test_fresh_wrapper_returns_exactly_the_backbone_logits(name):
    backbone, model = wrap(name)
    batch = training_batch()
    with torch.no_grad():
        expected = backbone(**batch)
        actual = model(**batch)
    assert torch.equal(actual.logits, expected.logits)
    torch.testing.assert_close(actual.loss, expected.loss)


@pytest.mark.parametrize("name", NAMES)
def test_panm_changes_the_response_only(name):
    """Positions before the prompt's last token get the backbone's own output, bit for bit."""
    backbone, model = wrap(name)
    model = activate_panm(model)
    batch = training_batch()
    with torch.no_grad():
        expected = backbone(**batch).logits
        actual = model(**batch, output_attentions=True)
    rank = batch["attention_mask"].cumsum(-1) - 1  # (batch, length)
    before = (rank < prompt_lengths().unsqueeze(1) - 1) & batch["attention_mask"].bool()  # (batch, length)
    steps = (rank >= prompt_lengths().unsqueeze(1) - 1) & batch["attention_mask"].bool()
    assert torch.equal(actual.logits[before], expected[before])
    assert (actual.logits[steps] - expected[steps]).abs().amax(-1).min() > 1e-3
    # the address attention is over the prompt's slots, and zero where PANM takes no step
    assert actual.address_attentions.shape == (3, 7, 2, 5)
    assert actual.address_attentions[~steps].abs().max() == 0


@pytest.mark.parametrize("name", NAMES)
def test_prompt_from_labels_equals_explicit_prompt_lengths_and_mask(name):
    _, model = wrap(name)
    model = activate_panm(model)
    batch = training_batch()
    rank = batch["attention_mask"].cumsum(-1) - 1
    mask = (rank < prompt_lengths().unsqueeze(1)) & batch["attention_mask"].bool()  # (batch, length)
    with torch.no_grad():
        from_labels = model(**batch)
        from_lengths = model(**batch, prompt_lengths=prompt_lengths())
        from_mask = model(**batch, prompt_mask=mask.long())
    for other in (from_lengths, from_mask):
        assert torch.equal(other.logits, from_labels.logits)
        assert torch.equal(other.loss, from_labels.loss)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_of_different_prompt_lengths_equals_each_row_alone(name, side):
    _, model = wrap(name)
    model = activate_panm(model)
    batch = training_batch(side)
    with torch.no_grad():
        batched = model(**batch, base_address=torch.tensor([3, 40, 60]), output_attentions=True)
        for row, base in enumerate([3, 40, 60]):
            real = batch["attention_mask"][row].bool()
            ids, labels = batch["input_ids"][row, real][None], batch["labels"][row, real][None]
            alone = model(input_ids=ids, labels=labels, base_address=torch.tensor([base]), output_attentions=True)
            torch.testing.assert_close(batched.logits[row, real], alone.logits[0], atol=1e-5, rtol=0)
            slots = ROWS[row][0]
            torch.testing.assert_close(batched.address_attentions[row, real, :, :slots],
                                       alone.address_attentions[0], atol=1e-6, rtol=0)  # fmt: skip
            assert not batched.address_attentions[row, :, :, slots:].any()  # the longer prompts' slots


@pytest.mark.parametrize("name", NAMES)
def test_pointers_start_at_the_prompts_first_and_last_tokens_and_never_see_content(name):
    _, model = wrap(name, pointer_update="shift")
    head = model.panm.pointer_units.arithmetic_head
    with torch.no_grad():  # every unit always stays (moves are ordered +1, 0, -1, attend)
        head.bias.copy_(torch.tensor([0.0, 60.0, 0.0, 0.0]).expand_as(head.bias))
    batch = training_batch()
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
        changed = dict(batch, input_ids=torch.randint(3, VOCAB, batch["input_ids"].shape))
        other = model(**changed, output_attentions=True)
    for row, (prompt, _) in enumerate(ROWS):
        first_step = prompt - 1  # the prompt's last token (right padding: its position)
        attention = out.address_attentions[row, first_step]  # (units, slots)
        assert int(attention[0].argmax()) == 0 and int(attention[1].argmax()) == prompt - 1
        assert attention[0, 0] > 0.99 and attention[1, prompt - 1] > 0.99
    # principle II: the Pointer Units read addresses only, so other tokens give the same address attention
    assert torch.equal(out.address_attentions, other.address_attentions)
    assert not torch.equal(out.mode2_attentions, other.mode2_attentions)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("options", [{}, {"pointer_update": "shift"}, {"content_read": "controller"}])
def test_cached_steps_equal_the_full_forward(name, options):
    """Cache equals no cache: the prompt, then one token, one token and three at once, as one forward."""
    _, model = wrap(name, **options)
    model = activate_panm(model)
    input_ids, attention_mask = prompts(length=10)  # left padding 2, 1, 0: prompts are columns :5
    real_prompt = attention_mask[:, :5].sum(-1)  # (batch,) 3, 4, 5
    inputs = {"attention_mask": attention_mask, "position_ids": position_ids(attention_mask)}
    steps: list[int] = []  # num_steps of every Pointer Unit loop
    with torch.no_grad():
        full = model(input_ids=input_ids, **inputs, prompt_lengths=real_prompt, use_cache=False).logits
        hook = model.panm.pointer_units.register_forward_pre_hook(lambda module, args: steps.append(args[5]))
        try:
            cache, pieces = None, []
            for start, stop in [(0, 5), (5, 6), (6, 7), (7, 10)]:
                out = model(input_ids=input_ids[:, start:stop], attention_mask=attention_mask[:, :stop],
                            position_ids=inputs["position_ids"][:, start:stop], past_key_values=cache,
                            use_cache=True)  # fmt: skip
                cache = out.past_key_values
                pieces.append(out.logits)
        finally:
            hook.remove()
    # the prompt's positions before its last token are the backbone's alone either way; from there on, PANM's steps
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
    assert steps == [1, 1, 1, 3]  # the prompt's last token, then one PANM step per new token
    assert isinstance(cache, PanmDynamicCache) and cache.panm_steps == 10
    assert cache.panm_memory.lengths.tolist() == real_prompt.tolist()  # the memory stays the prompt


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("options", [{}, {"pointer_update": "shift"}])
def test_greedy_with_cache_equals_without_cache_and_teacher_forcing(name, options):
    _, model = wrap(name, **options)
    model = activate_panm(model)
    input_ids, attention_mask = prompts()
    out = greedy(model, input_ids, attention_mask, output_logits=True, return_dict_in_generate=True)
    sequences = out.sequences  # (batch, 6 + 6)
    assert torch.equal(sequences, greedy(model, input_ids, attention_mask, use_cache=False))
    # teacher forcing the generated sequences (prompt = the 6 prompt columns) gives the step-by-step logits
    mask = torch.cat([attention_mask, torch.ones_like(sequences[:, 6:])], dim=1)
    with torch.no_grad():
        logits = model(input_ids=sequences, attention_mask=mask, position_ids=position_ids(mask),
                       prompt_lengths=attention_mask.sum(-1), use_cache=False).logits  # fmt: skip
    torch.testing.assert_close(logits[:, 5:-1], torch.stack(out.logits, dim=1), atol=1e-5, rtol=0)
    no_eos = logits[:, 5:-1].index_fill(-1, torch.tensor([EOS]), -float("inf"))  # min_new_tokens bars EOS
    assert torch.equal(no_eos.argmax(-1), sequences[:, 6:])


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_prompts_generate_as_alone(name):
    _, model = wrap(name)
    model = activate_panm(model)
    input_ids, attention_mask = prompts()
    batched = greedy(model, input_ids, attention_mask)
    for row, pads in enumerate([2, 1, 0]):
        alone = greedy(model, input_ids[row : row + 1, pads:], None)
        assert torch.equal(batched[row, pads:], alone[0]), row


@pytest.mark.parametrize("name", NAMES)
def test_beam_search_scores_equal_teacher_forced_log_probs(name):
    """Beam search reorders PANM's state and memory with the beams (else the scores would not match)."""
    _, model = wrap(name)
    model = activate_panm(model)
    input_ids, attention_mask = prompts(batch_size=2)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, num_return_sequences=3,
                         length_penalty=0.0, do_sample=False, max_new_tokens=6, return_dict_in_generate=True,
                         output_scores=True, **PLAIN)  # fmt: skip
    assert isinstance(out.past_key_values, PanmDynamicCache)
    sequences = out.sequences  # (batch*3, 6 + new)
    mask = torch.cat([attention_mask.repeat_interleave(3, 0), torch.ones_like(sequences[:, 6:])], dim=1)
    with torch.no_grad():
        logits = model(input_ids=sequences, attention_mask=mask, position_ids=position_ids(mask), use_cache=False,
                       prompt_lengths=attention_mask.sum(-1).repeat_interleave(3)).logits  # fmt: skip
    log_probs = logits[:, 5:-1].log_softmax(-1).gather(-1, sequences[:, 6:].unsqueeze(-1)).squeeze(-1)
    is_eos = (sequences[:, 6:] == EOS).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # positions after the first EOS are padding
    expected = log_probs.masked_fill(after_eos, 0.0).sum(-1)
    torch.testing.assert_close(out.sequences_scores, expected, atol=1e-4, rtol=1e-4)
    # one beam is greedy decoding
    one_beam = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, do_sample=False,
                              max_new_tokens=6, min_new_tokens=6, **PLAIN)  # fmt: skip
    assert torch.equal(one_beam, greedy(model, input_ids, attention_mask))


def test_bad_prompt_inputs_raise_value_errors():
    _, model = wrap("gpt2")
    batch = training_batch()
    no_labels = {key: batch[key] for key in ("input_ids", "attention_mask")}
    cases = [
        ({"prompt_lengths": torch.tensor([3, 5])}, r"prompt_lengths must be an integer tensor of shape \(3,\)"),
        ({"prompt_lengths": torch.tensor([3.0, 5.0, 2.0])}, "prompt_lengths must be an integer tensor"),
        ({"prompt_lengths": torch.tensor([3, 0, 2])}, r"prompt_lengths\[1\]=0 is out of range"),
        ({"prompt_lengths": torch.tensor([3, 5, 8])}, r"prompt_lengths\[2\]=8 .*\(5 in row 2\)"),
        ({"prompt_mask": torch.ones(3, 4)}, r"prompt_mask must have the shape of the input tokens \(3, 7\)"),
        ({"prompt_mask": torch.zeros(3, 7)}, "non-empty prefix of each row's real tokens"),
        ({"prompt_mask": batch["attention_mask"].roll(1, dims=1)}, "non-empty prefix"),  # starts late, marks padding
        ({"prompt_mask": batch["attention_mask"], "prompt_lengths": prompt_lengths()}, "both prompt_mask and"),
        ({"labels": batch["labels"][:, :5]}, r"labels must have the shape of the input tokens \(3, 7\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**no_labels, **kwargs)
    _, sequence_model = wrap("gpt2", causal_memory="sequence")
    with pytest.raises(ValueError, match="prompt_lengths is read only with causal_memory='prompt'"):
        sequence_model(**no_labels, prompt_lengths=prompt_lengths())
    # a cached forward over responses of different lengths keeps no state to continue from
    with torch.no_grad():
        cache = model(**no_labels, prompt_lengths=prompt_lengths(), use_cache=True).past_key_values
    mask = torch.cat([batch["attention_mask"], torch.ones(3, 1, dtype=torch.long)], dim=1)
    with pytest.raises(ValueError, match="responses had different lengths"):
        model(input_ids=torch.full((3, 1), 5), attention_mask=mask, past_key_values=cache)


def test_sequence_fused_kernel_refused_but_prompt_fused_matches_eager():
    with pytest.raises(ValueError, match='recurrence_kernel="fused" with causal_memory="sequence"'):
        wrap("gpt2", causal_memory="sequence", recurrence_kernel="fused")
    try:
        _, fused = wrap("gpt2", recurrence_kernel="fused")
        fused(**training_batch())
    except (ValueError, RuntimeError) as error:  # no C compiler on this machine
        pytest.skip(f"fused kernel unavailable: {error}")
    _, eager = wrap("gpt2", recurrence_kernel="eager")
    eager.load_state_dict(activate_panm(fused).state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fused(**training_batch()).logits, eager(**training_batch()).logits, atol=1e-5,
                                   rtol=0)  # fmt: skip


def test_gradients_reach_every_panm_parameter():
    _, model = wrap("llama")
    model = activate_panm(model).train()
    model(**training_batch()).loss.backward()
    for name, parameter in model.panm.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_address_space_counts_the_prompt_only():
    _, model = wrap("gpt2", address_bits=3)  # 8 addresses: the prompt fits, prompt + new tokens would not
    input_ids, attention_mask = prompts(length=8)
    assert greedy(model, input_ids, attention_mask, new_tokens=10).shape == (3, 18)
    longer = torch.randint(3, VOCAB, (1, 9))
    with pytest.raises(ValueError, match="the prompt's 9\\) .*4 address bits are needed"):
        greedy(model, longer, None, new_tokens=2)


def test_save_load_round_trip(tmp_path):
    _, model = wrap("llama")
    model = activate_panm(model)
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).causal_memory == "prompt"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, PanmForCausalLM) and loaded.config.causal_memory == "prompt"
    batch = training_batch()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)


