"""PanmForSeq2SeqLM on tiny BART / T5 / Marian (and mBART, bert2bert) backbones."""


import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, activate_panm, make_inputs
from transformers import AutoConfig, AutoModelForSeq2SeqLM, BertConfig

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import PanmConfig, PanmForSeq2SeqLM, PanmPreTrainedModel
from panm_hf.backbones import get_path


def wrap(config, placement="stack", seed=0, **kwargs):
    torch.manual_seed(seed)
    backbone = AutoModelForSeq2SeqLM.from_config(config)
    return backbone, PanmForSeq2SeqLM.from_backbone(backbone, placement=placement, **{**TINY_PANM, **kwargs})



@pytest.mark.parametrize("name", sorted(BACKBONES))
@pytest.mark.parametrize("options", [{}, {"content_read": "decoder", "panm_dropout": 0.1}])
def test_stack_wrapper_starts_as_exactly_the_backbone(name, options):
    backbone, model = wrap(BACKBONES[name](), **options)
    backbone_state = {k: v.clone() for k, v in backbone.state_dict().items()}
    backbone.eval(), model.eval()
    input_ids, labels = make_inputs()
    with torch.no_grad():
        expected = backbone(input_ids=input_ids, labels=labels)
        actual = model(input_ids=input_ids, labels=labels)
    assert torch.equal(actual.logits, expected.logits)
    assert torch.allclose(actual.loss, expected.loss)
    # wrapping never re-initialises the backbone
    for key, value in model.backbone.state_dict().items():
        assert torch.equal(value, backbone_state[key]), key


def test_from_backbone_loads_a_folder_with_the_adapters_loader(tmp_path):
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    backbone.save_pretrained(tmp_path)
    model = PanmForSeq2SeqLM.from_backbone(str(tmp_path), **TINY_PANM).eval()
    assert model.config.address_bits == TINY_PANM["address_bits"] and model.config.text_config.model_type == "bart"
    input_ids, labels = make_inputs()
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids, labels=labels).logits,
                           backbone(input_ids=input_ids, labels=labels).logits)
    assert model.get_input_embeddings() is model.backbone.get_input_embeddings()
    assert model.get_output_embeddings() is model.backbone.get_output_embeddings()
    # the shared base knows no Auto class: each adapter names its own in _load_backbone
    with pytest.raises(NotImplementedError, match="PanmPreTrainedModel cannot load a backbone"):
        PanmPreTrainedModel.from_backbone(str(tmp_path))
    with pytest.raises(TypeError, match="PreTrainedModel or a path; got dict"):
        PanmForSeq2SeqLM.from_backbone({"model_type": "bart"})


def test_replace_drops_the_last_decoder_layer(backbone_config):
    _, stack = wrap(backbone_config, "stack")
    _, replace = wrap(backbone_config, "replace")
    def decoder_layers(model):
        return len(get_path(model.backbone, model.parts.decoder_layers))

    assert decoder_layers(replace) == decoder_layers(stack) - 1
    input_ids, labels = make_inputs()
    out = replace.eval()(input_ids=input_ids, labels=labels)
    assert out.logits.shape == (2, 5, VOCAB) and torch.isfinite(out.loss)


def test_residual_placement_is_layer_norm_of_decoder_state_plus_controller_output(backbone_config):
    _, model = wrap(backbone_config, "residual")
    _, stack = wrap(backbone_config, "stack")
    model = activate_panm(model).eval()
    assert len(get_path(model.backbone, model.parts.decoder_layers)) == len(
        get_path(stack.backbone, stack.parts.decoder_layers)
    ) - 1
    input_ids, labels = make_inputs()
    captured = {}
    model.panm.register_forward_hook(lambda module, args, output: captured.update(panm=output.hidden_states))
    model.get_decoder().register_forward_hook(lambda module, args, output: captured.update(z=output.last_hidden_state))
    with torch.no_grad():
        logits = model(input_ids=input_ids, labels=labels).logits
        expected = model._logits(model.output_norm(captured["z"] + captured["panm"]))
    assert captured["panm"].abs().sum() > 0
    assert torch.allclose(logits, expected, atol=1e-6)


def test_content_read_follows_the_decoder_state_and_ignores_padding():
    _, model = wrap(BACKBONES["marian"](), "residual", content_read="decoder")
    model = activate_panm(model).eval()
    memory_states = torch.randn(2, 6, 16)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    decoder_states = torch.randn(2, 3, 16)
    reader = model.panm.content_reader
    with torch.no_grad():
        values, weights = reader(decoder_states, memory_states, mask)
        other, _ = reader(decoder_states.flip(1), memory_states, mask)
    assert values.shape == (2, 3, 1, 16) and weights.shape == (2, 3, 1, 6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 1)) and weights[1, ..., 4:].abs().max() == 0
    assert torch.allclose(values, torch.einsum("bths,bsd->bthd", weights, memory_states), atol=1e-6)
    assert not torch.allclose(values, other)  # the read depends on z_t (the paper's reads do not)
    assert torch.allclose(values[:, 0], other[:, 2])


def test_panm_dropout_is_active_in_training_only():
    input_ids, labels = make_inputs()
    base_address = torch.tensor([3, 17])
    for rate, differs in ((0.0, False), (0.3, True)):
        _, model = wrap(BACKBONES["bart"](), "residual", content_read="decoder", panm_dropout=rate)
        model = activate_panm(model)
        model.backbone.eval()  # only PANM's dropout may differ between the two passes
        model.panm.train()
        with torch.no_grad():
            first = model(input_ids=input_ids, labels=labels, base_address=base_address).logits
            second = model(input_ids=input_ids, labels=labels, base_address=base_address).logits
        assert (not torch.equal(first, second)) is differs, rate
        model.eval()
        with torch.no_grad():
            assert torch.equal(model(input_ids=input_ids, labels=labels).logits,
                               model(input_ids=input_ids, labels=labels).logits)


@pytest.mark.parametrize("placement,options", [("stack", {}), ("replace", {}), ("top", {"output_decoder_input": True}),
                                               ("residual", {"content_read": "decoder"}),
                                               ("residual", {"content_read": "controller"})])
def test_padding_invariance_and_batch_independence(backbone_config, placement, options):
    _, model = wrap(backbone_config, placement, **options)
    model = activate_panm(model).eval()
    input_ids, labels = make_inputs(batch_size=3, src_len=8)
    pad = model.config.pad_token_id
    mask = torch.ones_like(input_ids)
    mask[1, 5:] = 0
    input_ids[1, 5:] = pad
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=mask, labels=labels).logits
        alone = model(input_ids=input_ids[1:2, :5], labels=labels[1:2]).logits
        first = model(input_ids=input_ids[:1], labels=labels[:1]).logits
    assert torch.allclose(batched[1], alone[0], atol=1e-5)
    assert torch.allclose(batched[0], first[0], atol=1e-5)


def test_loss_ignores_minus_100_and_matches_cross_entropy(backbone_config):
    _, model = wrap(backbone_config)
    model = activate_panm(model).eval()
    input_ids, labels = make_inputs()
    labels[0, 3:] = -100
    out = model(input_ids=input_ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(out.loss, expected)


@pytest.mark.parametrize(
    "options",
    [{}, {"pointer_update": "shift"}, {"address_distractors": 4}, {"content_read": "decoder", "panm_dropout": 0.1},
     {"content_read": "controller"}],
)  # fmt: skip
def test_gradients_reach_every_panm_parameter(backbone_config, options):
    _, model = wrap(backbone_config, **options)
    model = activate_panm(model).train()
    input_ids, labels = make_inputs()
    model(input_ids=input_ids, labels=labels).loss.backward()
    for name, parameter in model.panm.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("placement", ["replace", "top"])
def test_save_load_exact_and_auto_classes(tmp_path, backbone_config, placement):
    _, model = wrap(backbone_config, placement)
    model = activate_panm(model).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).__class__ is PanmConfig
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, PanmForSeq2SeqLM) and loaded.config.placement == placement
    input_ids, labels = make_inputs()
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids, labels=labels).logits,
                           loaded(input_ids=input_ids, labels=labels).logits)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="text_config"):
        PanmForSeq2SeqLM(PanmConfig(text_config=BertConfig(hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=8)))
    with pytest.raises(ValueError, match="placement"):
        PanmConfig(text_config=BACKBONES["bart"](), placement="middle")
    # "replace" and "top" have no backbone path for a sample whose PANM output is dropped
    for placement in ("replace", "top"):
        with pytest.raises(ValueError, match=f'panm_drop_path=0.5 needs a backbone path.*placement="{placement}"'):
            PanmConfig(text_config=BACKBONES["bart"](), placement=placement, panm_drop_path=0.5)
    for placement in ("stack", "residual"):
        config = PanmConfig(text_config=BACKBONES["bart"](), placement=placement, panm_drop_path=0.5)
        assert config.panm_drop_path == 0.5
    with pytest.raises(ValueError, match="address_bits"):
        PanmConfig(text_config=BACKBONES["bart"](), address_bits=0)
    with pytest.raises(ValueError, match="content_read"):
        PanmConfig(text_config=BACKBONES["bart"](), content_read="encoder")
    for rate in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="panm_dropout"):
            PanmConfig(text_config=BACKBONES["bart"](), panm_dropout=rate)
    one_layer = BACKBONES["bart"]()
    one_layer.decoder_layers = 1
    for placement in ("replace", "residual"):
        with pytest.raises(ValueError, match=f"placement='{placement}'"):
            PanmForSeq2SeqLM(PanmConfig(text_config=one_layer, placement=placement, **TINY_PANM))


def test_too_long_input_and_all_padding_row():
    _, model = wrap(BACKBONES["bart"](), address_bits=3)
    model.eval()
    with pytest.raises(ValueError, match="raise address_bits"):
        model(input_ids=torch.randint(4, VOCAB, (1, 9)), labels=torch.randint(4, VOCAB, (1, 3)))
    _, model = wrap(BACKBONES["bart"]())
    model = activate_panm(model).eval()
    input_ids, labels = make_inputs()
    mask = torch.ones_like(input_ids)
    mask[0] = 0
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)


def test_output_attentions_returns_pointer_maps():
    _, model = wrap(BACKBONES["bart"]())
    input_ids, labels = make_inputs(src_len=6, tgt_len=4)
    out = model.eval()(input_ids=input_ids, labels=labels, output_attentions=True)
    assert out.address_attentions.shape == (2, 4, 2, 6)
    assert out.mode2_attentions.shape == (2, 4, 1, 6)
    assert torch.allclose(out.address_attentions.sum(-1), torch.ones(2, 4, 2))
    assert out.content_attentions is None  # no content read configured
    _, model = wrap(BACKBONES["bart"](), content_read="decoder")
    mask = torch.ones_like(input_ids)
    mask[1, 4:] = 0
    out = model.eval()(input_ids=input_ids, attention_mask=mask, labels=labels, output_attentions=True)
    assert out.content_attentions.shape == (2, 4, 6)
    torch.testing.assert_close(out.content_attentions.sum(-1), torch.ones(2, 4))
    assert torch.equal(out.content_attentions[1, :, 4:], torch.zeros(4, 2))  # padding gets no weight
    assert model.eval()(input_ids=input_ids, labels=labels).content_attentions is None  # only when asked


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_top_is_replace_on_a_decoder_one_layer_deeper(model_type):
    """`placement="top"` keeps every decoder layer and feeds the LM head from PANM alone: the same model as
    `"replace"` on a backbone with one more decoder layer, weight for weight, logits and loss alike."""
    deeper = BACKBONES[model_type]()
    layers_key = "decoder_layers" if model_type == "bart" else "num_decoder_layers"
    setattr(deeper, layers_key, getattr(deeper, layers_key) + 1)
    torch.manual_seed(0)
    replace = PanmForSeq2SeqLM(PanmConfig(text_config=deeper, placement="replace", **TINY_PANM)).eval()
    shallow = BACKBONES[model_type]()
    top = PanmForSeq2SeqLM(PanmConfig(text_config=shallow, placement="top", **TINY_PANM)).eval()
    assert top.state_dict().keys() == replace.state_dict().keys()
    top.load_state_dict(replace.state_dict())
    input_ids, labels = make_inputs()
    with torch.no_grad():
        expected, got = replace(input_ids=input_ids, labels=labels), top(input_ids=input_ids, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits)
    torch.testing.assert_close(got.loss, expected.loss)
    # and every decoder layer runs: the LM head does not read z_t directly, but z_t reaches PANM
    assert len(top.get_decoder().layers if model_type == "bart" else top.get_decoder().block) == getattr(
        shallow, layers_key
    )
