"""`eos_decision="panm"`: PanmForSeq2SeqLM's end-of-sequence logit from PANM's output alone."""

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, activate_panm, make_inputs
from transformers import AutoModelForSeq2SeqLM

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import PanmConfig, PanmForSeq2SeqLM


def pair(config, placement="stack", **kwargs):
    """The same weights as a "shared" and a "panm" model (PANM made non-trivial), both in eval mode."""
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(config)
    shared = activate_panm(PanmForSeq2SeqLM.from_backbone(backbone, placement=placement, **{**TINY_PANM, **kwargs}))
    panm_config = PanmConfig(**{**shared.config.to_dict(), "eos_decision": "panm"})
    deciding = PanmForSeq2SeqLM(panm_config)
    deciding.load_state_dict(shared.state_dict())
    return shared.eval(), deciding.eval()


def assert_same_model(loaded, deciding):
    """`loaded` decides EOS with PANM and gives `deciding`'s logits exactly."""
    assert loaded.config.eos_decision == "panm"
    input_ids, labels = make_inputs()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids, labels=labels).logits,
                           deciding(input_ids=input_ids, labels=labels).logits)  # fmt: skip


def eos_ids(model):
    eos = model.config.eos_token_id
    return eos if isinstance(eos, list) else [eos]


def test_only_the_eos_logit_changes_and_it_is_the_lm_head_on_panms_output(backbone_config):
    shared, deciding = pair(backbone_config)
    input_ids, labels = make_inputs()
    with torch.no_grad():
        expected = shared(input_ids=input_ids, labels=labels, output_hidden_states=True)
        actual = deciding(input_ids=input_ids, labels=labels)
    eos = eos_ids(deciding)
    others = [token for token in range(actual.logits.shape[-1]) if token not in eos]
    assert torch.equal(actual.logits[..., others], expected.logits[..., others])
    # "stack": what the LM head reads is z_t + o_t, so PANM's output is the last hidden state less z_t
    hidden, decoder_states = expected.decoder_hidden_states[-1], expected.decoder_hidden_states[-2]
    alone = shared._logits(hidden - decoder_states)  # (batch, tgt_len, vocab)
    assert torch.allclose(actual.logits[..., eos], alone[..., eos], atol=1e-5)
    assert not torch.allclose(actual.logits[..., eos], expected.logits[..., eos])
    assert torch.allclose(
        actual.loss,
        torch.nn.functional.cross_entropy(actual.logits.flatten(0, 1), labels.flatten(), ignore_index=-100),
    )


def test_replace_already_decides_with_panm_alone():
    shared, deciding = pair(BACKBONES["bart"](), placement="replace")
    input_ids, labels = make_inputs()
    with torch.no_grad():
        assert torch.allclose(deciding(input_ids=input_ids, labels=labels).logits,
                              shared(input_ids=input_ids, labels=labels).logits, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("placement", ["replace", "stack"])
def test_with_g_o_reading_z_t_the_eos_logit_leaves_z_t_out(placement):
    """`output_decoder_input=True`: g^o also reads z_t, and the EOS logit is taken from g^o without those
    columns: the logits of the same weights with g^o's z_t columns zeroed (their PANM output alone, "stack")."""
    shared, deciding = pair(BACKBONES["bart"](), placement=placement, output_decoder_input=True)
    zeroed = PanmForSeq2SeqLM(shared.config).eval()
    zeroed.load_state_dict(shared.state_dict())
    with torch.no_grad():
        zeroed.panm.controller.output_mlp[0].weight[:, -16:] = 0  # z_t (d_model 16) comes last in g^o's input
    input_ids, labels = make_inputs()
    with torch.no_grad():
        expected = shared(input_ids=input_ids, labels=labels).logits
        actual = deciding(input_ids=input_ids, labels=labels).logits
        reference = zeroed(input_ids=input_ids, labels=labels, output_hidden_states=True)
    eos = eos_ids(deciding)
    others = [token for token in range(actual.shape[-1]) if token not in eos]
    assert torch.equal(actual[..., others], expected[..., others])
    hidden = reference.decoder_hidden_states[-1]  # (batch, tgt_len, d_model): what the LM head reads
    if placement == "stack":  # z_t + o_t: PANM's output alone is the difference
        hidden = hidden - reference.decoder_hidden_states[-2]
    torch.testing.assert_close(actual[..., eos], zeroed._logits(hidden)[..., eos], atol=1e-5, rtol=0)
    assert (actual[..., eos] - expected[..., eos]).abs().max() > 1e-3


def test_drop_path_never_drops_the_eos_decision():
    """In training a dropped sample loses PANM's output in every logit but the EOS one."""
    shared, deciding = pair(BACKBONES["bart"](), panm_drop_path=0.9)
    input_ids, labels = make_inputs(batch_size=6)
    base_address = torch.arange(6)
    with torch.no_grad():
        evaluated = deciding(input_ids=input_ids, labels=labels, base_address=base_address).logits
        torch.manual_seed(1)
        deciding.panm.train()  # only PANM trains: its drop-path acts, the backbone's dropout does not
        trained = deciding(input_ids=input_ids, labels=labels, base_address=base_address).logits
    eos = eos_ids(deciding)
    assert torch.allclose(trained[..., eos], evaluated[..., eos], atol=1e-6)
    others = [token for token in range(trained.shape[-1]) if token not in eos]
    assert not torch.allclose(trained[..., others], evaluated[..., others])  # drop-path did act on them


@pytest.mark.parametrize("options", [{"placement": "stack"}, {"placement": "replace", "output_decoder_input": True}])
def test_cached_greedy_and_beam_decoding_match_uncached(options):
    _, deciding = pair(BACKBONES["bart"](), content_read="decoder", **options)
    input_ids, _ = make_inputs(batch_size=3)
    with torch.no_grad():
        for beams in (1, 2):
            cached = deciding.generate(input_ids=input_ids, max_new_tokens=6, num_beams=beams, do_sample=False)
            uncached = deciding.generate(
                input_ids=input_ids, max_new_tokens=6, num_beams=beams, do_sample=False, use_cache=False
            )
            assert torch.equal(cached, uncached), beams


def test_save_load_keeps_the_decision(tmp_path):
    _, deciding = pair(BACKBONES["bart"]())
    deciding.save_pretrained(tmp_path)
    assert_same_model(AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval(), deciding)


def test_save_panm_and_from_panm_keep_the_decision(tmp_path):
    _, deciding = pair(BACKBONES["bart"]())
    backbone_folder, panm_folder = tmp_path / "base", tmp_path / "panm"
    deciding.backbone.save_pretrained(backbone_folder)
    deciding.save_panm(panm_folder, base_model_name_or_path=str(backbone_folder))
    assert_same_model(PanmForSeq2SeqLM.from_panm(panm_folder).eval(), deciding)


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="eos_decision='controller' is not supported"):
        PanmConfig(text_config=BACKBONES["bart"](), eos_decision="controller")
    with pytest.raises(ValueError, match='eos_decision="panm" needs eos_token_id'):
        PanmConfig(text_config={**BACKBONES["bart"]().to_dict(), "eos_token_id": None}, eos_decision="panm")
    # the causal LM reads it too (tests/test_eos_decision_causal.py); the QA head refuses it there
