"""Regression tests for issue 17: resizing, wrapping without side effects, loading the wrong folder, config checks."""

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, make_inputs
from transformers import AutoModelForSeq2SeqLM

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import PanmConfig, PanmForSeq2SeqLM, PanmMemory
from panm_hf.backbones import get_path

NEW_VOCAB = VOCAB + 8


def wrap(name, placement="stack", seed=0):
    torch.manual_seed(seed)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES[name]())
    return backbone, PanmForSeq2SeqLM.from_backbone(backbone, placement=placement, **TINY_PANM)


def activate_panm(model, seed=1):
    generator = torch.Generator().manual_seed(seed)
    layer = model.panm.controller.output_mlp[-1]
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.5)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator) * 0.5)
    return model


# -- resize_token_embeddings -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bart", "t5", "encoder-decoder"])
def test_resize_token_embeddings_keeps_old_logits_updates_configs_and_reloads(tmp_path, name):
    _, model = wrap(name, "replace")
    model = activate_panm(model).eval()
    input_ids, labels = make_inputs()
    with torch.no_grad():
        before = model(input_ids=input_ids, labels=labels).logits  # (batch, tgt_len, VOCAB)
    embeddings = model.resize_token_embeddings(NEW_VOCAB)
    assert embeddings.weight.shape[0] == NEW_VOCAB
    with torch.no_grad():
        after = model(input_ids=input_ids, labels=labels).logits  # (batch, tgt_len, NEW_VOCAB)
    assert after.shape == (*before.shape[:2], NEW_VOCAB)
    # The old tokens' rows (and BART's final_logits_bias entries) are kept, so their logits are unchanged.
    torch.testing.assert_close(after[..., :VOCAB], before, rtol=0, atol=1e-6)
    assert model.config.vocab_size == NEW_VOCAB
    text_config = model.config.text_config
    for sub_config in (text_config.encoder, text_config.decoder) if name == "encoder-decoder" else (text_config,):
        assert sub_config.vocab_size == NEW_VOCAB

    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.vocab_size == NEW_VOCAB
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids, labels=labels).logits, after)


# -- from_backbone(placement="replace") leaves the caller's model alone ---------------------------------------------
@pytest.mark.parametrize("name", ["bart", "t5", "encoder-decoder"])
def test_replace_leaves_the_callers_backbone_whole_and_shares_its_weights(name):
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES[name]()).eval()
    input_ids, labels = make_inputs()
    with torch.no_grad():
        expected = backbone(input_ids=input_ids, labels=labels).logits
    state = {key: value.clone() for key, value in backbone.state_dict().items()}
    model = PanmForSeq2SeqLM.from_backbone(backbone, placement="replace", **TINY_PANM)
    layers_path = model.parts.decoder_layers
    callers_layers = get_path(backbone, layers_path)
    assert len(callers_layers) == 2 and len(get_path(model.backbone, layers_path)) == 1
    # The caller's model computes exactly what it did, with exactly its weights.
    backbone.eval()
    with torch.no_grad():
        assert torch.equal(backbone(input_ids=input_ids, labels=labels).logits, expected)
    assert backbone.state_dict().keys() == state.keys()
    assert all(torch.equal(value, state[key]) for key, value in backbone.state_dict().items())
    # The wrapper holds the same parameter objects (no second copy in memory), minus the last layer's.
    callers_parameters = dict(backbone.named_parameters())
    wrapper_parameters = dict(model.backbone.named_parameters())
    last_layer = f"{layers_path}.1."
    assert set(wrapper_parameters) == {key for key in callers_parameters if not key.startswith(last_layer)}
    assert all(parameter is callers_parameters[key] for key, parameter in wrapper_parameters.items())
    assert get_path(model.backbone, layers_path)[0] is callers_layers[0]


# -- config checks -----------------------------------------------------------------------------------------------
BAD_FIELDS = [
    ({"cosine_inverse_temperature": float("nan")}, "cosine_inverse_temperature"),
    ({"cosine_inverse_temperature": float("inf")}, "cosine_inverse_temperature"),
    ({"cosine_inverse_temperature": 0.0}, "cosine_inverse_temperature"),
    ({"cosine_inverse_temperature": -2.0}, "cosine_inverse_temperature"),
    ({"cosine_inverse_temperature": True}, "cosine_inverse_temperature"),
    ({"address_bits": True}, "address_bits"),
    ({"num_pointer_units": True}, "num_pointer_units"),
    ({"num_mode2_heads": False}, "num_mode2_heads"),
    ({"shift_range": True, "pointer_update": "shift"}, "shift_range"),
    ({"address_distractors": True}, "address_distractors"),
]


@pytest.mark.parametrize("kwargs,field", BAD_FIELDS)
def test_bad_values_and_bools_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PanmConfig(text_config=BACKBONES["bart"](), **kwargs)
    with pytest.raises(ValueError, match=field):
        PanmMemory(memory_dim=8, decoder_input_size=6, output_size=5, **kwargs)


@pytest.mark.parametrize("field", ["pointer_hidden_size", "controller_hidden_size", "mlp_hidden_size"])
def test_bool_sizes_are_rejected_naming_the_field(field):
    with pytest.raises(ValueError, match=field):
        PanmConfig(text_config=BACKBONES["bart"](), **{field: True})


def test_valid_inverse_temperatures_are_kept():
    assert PanmConfig(text_config=BACKBONES["bart"](), cosine_inverse_temperature=3).cosine_inverse_temperature == 3
    memory = PanmMemory(memory_dim=8, decoder_input_size=6, output_size=5, cosine_inverse_temperature=0.5)
    scales = [p for name, p in memory.named_parameters() if "temperature" in name]
    assert scales and all(torch.allclose(p, torch.full_like(p, 0.5)) for p in scales)
