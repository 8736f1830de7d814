"""Regression tests for issue 17: resizing, wrapping without side effects, loading the wrong folder, config checks."""

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, activate_panm, make_inputs
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSeq2SeqLM, BertConfig, BertForQuestionAnswering, BertModel

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import BertWithPanmForQuestionAnswering, PanmConfig, PanmForSeq2SeqLM, PanmMemory, PanmMemoryConfig
from panm_hf.backbones import get_path

NEW_VOCAB = VOCAB + 8


def wrap(name, placement="stack", seed=0):
    torch.manual_seed(seed)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES[name]())
    return backbone, PanmForSeq2SeqLM.from_backbone(backbone, placement=placement, **TINY_PANM)


def tiny_bert():
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=64)  # fmt: skip



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



def test_qa_resize_token_embeddings_updates_both_configs_and_reloads(tmp_path):
    torch.manual_seed(0)
    model = BertWithPanmForQuestionAnswering.from_backbone(BertForQuestionAnswering(tiny_bert()), **TINY_PANM)
    model = model.eval()
    input_ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        before = model(input_ids=input_ids).start_logits
    model.resize_token_embeddings(NEW_VOCAB)
    assert model.config.vocab_size == model.config.text_config.vocab_size == NEW_VOCAB
    assert model.backbone.config.vocab_size == NEW_VOCAB
    new_ids = torch.cat([input_ids, torch.full((2, 1), NEW_VOCAB - 1)], dim=1)  # (2, 10): a new token too
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=input_ids).start_logits, before, rtol=0, atol=0)
        after = model(input_ids=new_ids).start_logits
    model.save_pretrained(tmp_path)
    loaded = BertWithPanmForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert loaded.config.vocab_size == NEW_VOCAB
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=new_ids).start_logits, after)

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
    # The wrapper's weights are the caller's storage (no second copy in memory), minus the last layer's.
    callers_parameters = dict(backbone.named_parameters(remove_duplicate=False))
    wrapper_parameters = dict(model.backbone.named_parameters(remove_duplicate=False))
    last_layer = f"{layers_path}.1."
    assert set(wrapper_parameters) == {key for key in callers_parameters if not key.startswith(last_layer)}
    for key, parameter in wrapper_parameters.items():
        assert torch.equal(parameter, callers_parameters[key]), key
        if parameter.ndim > 1:  # every matrix; transformers' tie_weights re-pads bert2bert's LM-head bias (.data)
            assert parameter.data_ptr() == callers_parameters[key].data_ptr(), key
    callers_buffers = dict(backbone.named_buffers())
    assert all(buffer is callers_buffers[key] for key, buffer in model.backbone.named_buffers())
    # Ties are kept: the LM head is still the (decoder's) input embedding
    decoder_embeddings = get_path(model.backbone, model.parts.decoder).get_input_embeddings()
    assert model.get_output_embeddings().weight is decoder_embeddings.weight
    # Its modules are its own: resizing the wrapper's vocabulary leaves the caller's model as it was.
    model.resize_token_embeddings(NEW_VOCAB)
    assert model.get_input_embeddings().weight.shape[0] == NEW_VOCAB
    assert backbone.get_input_embeddings().weight.shape[0] == VOCAB
    assert backbone.get_output_embeddings().weight.shape[0] == VOCAB
    assert backbone.state_dict().keys() == state.keys()
    assert all(torch.equal(value, state[key]) for key, value in backbone.state_dict().items())
    with torch.no_grad():
        assert torch.equal(backbone(input_ids=input_ids, labels=labels).logits, expected)


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
        PanmMemoryConfig(**kwargs)
    config = PanmMemoryConfig()
    for name, value in kwargs.items():  # edited after it was built: PanmMemory checks again
        setattr(config, name, value)
    with pytest.raises(ValueError, match=field):
        PanmMemory(config, memory_dim=8, decoder_input_size=6, output_size=5)


@pytest.mark.parametrize("field", ["pointer_hidden_size", "controller_hidden_size", "mlp_hidden_size"])
def test_bool_sizes_are_rejected_naming_the_field(field):
    with pytest.raises(ValueError, match=field):
        PanmConfig(text_config=BACKBONES["bart"](), **{field: True})


def test_valid_inverse_temperatures_are_kept():
    assert PanmConfig(text_config=BACKBONES["bart"](), cosine_inverse_temperature=3).cosine_inverse_temperature == 3
    config = PanmMemoryConfig(cosine_inverse_temperature=0.5)
    memory = PanmMemory(config, memory_dim=8, decoder_input_size=6, output_size=5)
    scales = [p for name, p in memory.named_parameters() if "temperature" in name]
    assert scales and all(torch.allclose(p, torch.full_like(p, 0.5)) for p in scales)


# -- loading: the wrong folder, the base model's name, tied weights --------------------------------------------------
@pytest.mark.parametrize("model_class", [PanmForSeq2SeqLM, BertWithPanmForQuestionAnswering])
def test_from_pretrained_on_a_plain_backbone_folder_points_to_from_backbone(tmp_path, model_class):
    if model_class is PanmForSeq2SeqLM:
        AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).save_pretrained(tmp_path)
    else:
        BertModel(tiny_bert()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"model_type='(bart|bert)'.*{model_class.__name__}\.from_backbone"):
        model_class.from_pretrained(tmp_path)


def test_from_pretrained_with_an_explicit_panm_config_still_loads_backbone_weights(tmp_path):
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    backbone.save_pretrained(tmp_path)
    config = PanmConfig(text_config=BACKBONES["bart"](), **TINY_PANM)
    model = PanmForSeq2SeqLM.from_pretrained(tmp_path, config=config).eval()
    input_ids, labels = make_inputs()
    with torch.no_grad():  # "stack" starts as exactly the backbone, so every backbone weight was loaded
        assert torch.equal(model(input_ids=input_ids, labels=labels).logits,
                           backbone(input_ids=input_ids, labels=labels).logits)


def test_from_backbone_records_the_backbones_name_or_path(tmp_path):
    AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).save_pretrained(tmp_path / "bart")
    BertForQuestionAnswering(tiny_bert()).save_pretrained(tmp_path / "bert-qa")
    cases = ((PanmForSeq2SeqLM, tmp_path / "bart", AutoModelForSeq2SeqLM),
             (BertWithPanmForQuestionAnswering, tmp_path / "bert-qa", AutoModel))  # fmt: skip
    for model_class, folder, auto_class in cases:
        model = model_class.from_backbone(folder, **TINY_PANM)
        # PEFT's adapters record the base model as model.name_or_path (config._name_or_path)
        assert model.name_or_path == model.config.name_or_path == model.config._name_or_path == str(folder)
        # a backbone loaded first gives its own path
        loaded = model_class.from_backbone(auto_class.from_pretrained(folder), **TINY_PANM)
        assert loaded.name_or_path == loaded.config.name_or_path == str(folder)
    _, fresh = wrap("bart")  # a backbone built from a config has no path: nothing to record
    assert fresh.name_or_path == fresh.config.name_or_path == ""


def tied_head(model):
    """(name, parameter) of the LM head weight, which `all_tied_weights_keys` maps to a tied embedding."""
    head = model.get_output_embeddings()
    key = next(f"{name}.weight" for name, module in model.named_modules() if module is head)
    assert key in model.all_tied_weights_keys, (key, model.all_tied_weights_keys)
    return key, head.weight


@pytest.mark.parametrize("name", ["bart", "t5", "encoder-decoder"])
def test_tied_lm_head_survives_save_reload_and_a_trainer_style_resume(tmp_path, name):
    _, model = wrap(name)
    head_key, head = tied_head(model)
    assert model.get_parameter(model.all_tied_weights_keys[head_key]) is head  # the embedding it is tied to
    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path)
    loaded_key, loaded_head = tied_head(loaded)
    assert loaded_key == head_key and loaded.get_parameter(loaded.all_tied_weights_keys[head_key]) is loaded_head
    assert torch.equal(loaded_head, head)
    # Trainer's resume: load_state_dict(strict=False) of the saved file into a live model; only tied copies are missing
    _, other = wrap(name, seed=5)
    result = other.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert set(result.missing_keys) <= set(other.all_tied_weights_keys) and not result.unexpected_keys
    other_key, other_head = tied_head(other)
    assert torch.equal(other_head, head) and other.get_parameter(other.all_tied_weights_keys[other_key]) is other_head
