"""`eos_decision="panm"` in PanmForCausalLM: the end-of-sequence logit from PANM's output where PANM decodes.

Tiny GPT-2 and Llama from configs, both causal memories; `activate_panm` makes PANM's output non-zero.
"""

from __future__ import annotations

import pytest
import torch
from test_causal_lm import CAUSAL_BACKBONES, EOS, PLAIN, TINY_PANM, activate_panm, position_ids, prompts
from test_causal_prompt_memory import ROWS, prompt_lengths, training_batch
from transformers import AutoModelForCausalLM, BertConfig

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import BertWithPanmForQA, PanmConfig, PanmForCausalLM

NAMES = ["gpt2", "llama"]
MEMORIES = ["prompt", "sequence"]


def pair(name: str, causal_memory: str, **kwargs) -> tuple[PanmForCausalLM, PanmForCausalLM]:
    """The same weights as a "shared" and a "panm" causal model (PANM made non-trivial), both in eval mode."""
    torch.manual_seed(0)
    backbone = AutoModelForCausalLM.from_config(CAUSAL_BACKBONES[name]())
    options = {**TINY_PANM, "causal_memory": causal_memory, **kwargs}
    shared = activate_panm(PanmForCausalLM.from_backbone(backbone, **options))
    deciding = PanmForCausalLM(PanmConfig(**{**shared.config.to_dict(), "eos_decision": "panm"}))
    deciding.load_state_dict(shared.state_dict())
    return shared.eval(), deciding.eval()


def others(logits: torch.Tensor) -> list[int]:
    return [token for token in range(logits.shape[-1]) if token != EOS]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal_memory", MEMORIES)
def test_only_the_eos_logit_changes_and_only_where_panm_decodes(name, causal_memory):
    shared, deciding = pair(name, causal_memory)
    batch = training_batch()
    with torch.no_grad():
        expected = shared(**batch, output_hidden_states=True)
        actual = deciding(**batch)
    assert torch.equal(actual.logits[..., others(actual.logits)], expected.logits[..., others(actual.logits)])
    # what the LM head reads is the backbone's last state + PANM's output: PANM alone is their difference
    panm_alone = expected.hidden_states[-1] - expected.hidden_states[-2]  # (batch, length, dim)
    alone = deciding.backbone.get_output_embeddings()(panm_alone)[..., EOS]  # (batch, length)
    real = batch["attention_mask"].bool()
    rank = batch["attention_mask"].cumsum(-1) - 1  # (batch, length)
    steps = real & (rank >= prompt_lengths().unsqueeze(1) - 1) if causal_memory == "prompt" else real
    torch.testing.assert_close(actual.logits[..., EOS][steps], alone[steps], atol=1e-5, rtol=0)
    assert (actual.logits[..., EOS][steps] - expected.logits[..., EOS][steps]).abs().min() > 1e-4
    # before the prompt's last token PANM takes no step: the backbone's own EOS logit stays
    assert torch.equal(actual.logits[..., EOS][real & ~steps], expected.logits[..., EOS][real & ~steps])
    assert bool((real & ~steps).any()) == (causal_memory == "prompt")


@pytest.mark.parametrize("name", NAMES)
def test_cached_steps_and_greedy_decoding_equal_the_full_forward(name):
    _, deciding = pair(name, "prompt")
    input_ids, attention_mask = prompts(length=10)  # left padding 2, 1, 0: prompts are columns :5
    inputs = {"attention_mask": attention_mask, "position_ids": position_ids(attention_mask)}
    with torch.no_grad():
        full = deciding(input_ids=input_ids, **inputs, prompt_lengths=attention_mask[:, :5].sum(-1), use_cache=False)
        cache, pieces = None, []
        for start, stop in [(0, 5), (5, 6), (6, 10)]:
            out = deciding(input_ids=input_ids[:, start:stop], attention_mask=attention_mask[:, :stop],
                           position_ids=inputs["position_ids"][:, start:stop], past_key_values=cache,
                           use_cache=True)  # fmt: skip
            cache = out.past_key_values
            pieces.append(out.logits)
        torch.testing.assert_close(torch.cat(pieces, dim=1), full.logits, atol=1e-5, rtol=0)
        prompt_ids, prompt_mask = prompts()
        runs = [
            deciding.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=6, do_sample=False,
                              num_beams=beams, use_cache=use_cache, **PLAIN)  # fmt: skip
            for beams in (1, 2)
            for use_cache in (True, False)
        ]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[3])


@pytest.mark.parametrize("causal_memory", MEMORIES)
def test_with_g_o_reading_z_t_the_eos_logit_leaves_z_t_out(causal_memory):
    """`output_decoder_input=True`: the EOS logit is PANM's output with g^o's z_t columns left out, i.e. PANM's
    output from the same weights with those columns zeroed, where PANM decodes; the other logits are unchanged."""
    shared, deciding = pair("gpt2", causal_memory, output_decoder_input=True)
    zeroed = PanmForCausalLM(shared.config).eval()
    zeroed.load_state_dict(shared.state_dict())
    with torch.no_grad():
        zeroed.panm.controller.output_mlp[0].weight[:, -16:] = 0  # z_t (n_embd 16) comes last in g^o's input
    batch = training_batch()
    with torch.no_grad():
        expected = shared(**batch).logits
        actual = deciding(**batch).logits
        reference = zeroed(**batch, output_hidden_states=True)
    assert torch.equal(actual[..., others(actual)], expected[..., others(actual)])
    panm_alone = reference.hidden_states[-1] - reference.hidden_states[-2]  # (batch, length, dim)
    alone = deciding.backbone.get_output_embeddings()(panm_alone)[..., EOS]  # (batch, length)
    real = batch["attention_mask"].bool()
    rank = batch["attention_mask"].cumsum(-1) - 1  # (batch, length)
    steps = real & (rank >= prompt_lengths().unsqueeze(1) - 1) if causal_memory == "prompt" else real
    torch.testing.assert_close(actual[..., EOS][steps], alone[steps], atol=1e-5, rtol=0)
    assert (actual[..., EOS][steps] - expected[..., EOS][steps]).abs().max() > 1e-3


def test_drop_path_never_drops_the_eos_decision():
    """In training a dropped row loses PANM's output in every logit but the EOS one."""
    _, deciding = pair("llama", "prompt", panm_drop_path=0.9)
    batch = training_batch()
    base_address = torch.arange(len(ROWS))
    with torch.no_grad():
        evaluated = deciding(**batch, base_address=base_address).logits
        torch.manual_seed(1)
        deciding.panm.train()  # only PANM trains: its drop-path acts
        trained = deciding(**batch, base_address=base_address).logits
    torch.testing.assert_close(trained[..., EOS], evaluated[..., EOS], atol=1e-6, rtol=0)
    assert not torch.allclose(trained[..., others(trained)], evaluated[..., others(trained)])


def test_save_load_keeps_the_decision(tmp_path):
    _, deciding = pair("gpt2", "prompt")
    deciding.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, PanmForCausalLM) and loaded.config.eos_decision == "panm"
    batch = training_batch()
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, deciding(**batch).logits)


def test_the_qa_head_refuses_it():
    bert = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=40)
    config = PanmConfig(text_config=bert, eos_decision="panm", eos_token_id=2, **TINY_PANM)
    with pytest.raises(ValueError, match='QuestionAnswering accepts eos_decision="shared" only'):
        BertWithPanmForQA(config)
