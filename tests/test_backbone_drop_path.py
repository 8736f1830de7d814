"""`backbone_drop_path`: with `placement="stack"`, a training sample's LM head reads PANM's output alone."""

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, activate_panm, make_inputs
from transformers import AutoModelForSeq2SeqLM

from panm_hf import PanmConfig, PanmForSeq2SeqLM


def model_with(drop: float) -> PanmForSeq2SeqLM:
    torch.manual_seed(0)
    backbone = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]())
    model = PanmForSeq2SeqLM.from_backbone(backbone, placement="stack", backbone_drop_path=drop, **TINY_PANM)
    return activate_panm(model)


def test_training_samples_read_panm_alone_or_both_and_evaluation_reads_both():
    dropping, plain = model_with(0.5), model_with(0.0)
    input_ids, labels = make_inputs(batch_size=8)
    base_address = torch.arange(8)
    with torch.no_grad():
        evaluated = plain.eval()(input_ids=input_ids, labels=labels, base_address=base_address, output_hidden_states=True)
        assert torch.equal(dropping.eval()(input_ids=input_ids, labels=labels, base_address=base_address).logits,
                           evaluated.logits)  # fmt: skip
        hidden, decoder_states = evaluated.decoder_hidden_states[-1], evaluated.decoder_hidden_states[-2]
        alone = plain._logits(hidden - decoder_states)  # (batch, tgt_len, vocab): o_t through the LM head
        torch.manual_seed(3)
        dropping.panm.train()  # PANM's modules train; the backbone's dropout stays off
        dropping.train(); dropping.backbone.eval()
        trained = dropping(input_ids=input_ids, labels=labels, base_address=base_address).logits
    as_both = torch.isclose(trained, evaluated.logits, atol=1e-5).flatten(1).all(1)  # (batch,)
    as_alone = torch.isclose(trained, alone, atol=1e-5).flatten(1).all(1)  # (batch,)
    assert bool((as_both ^ as_alone).all()), "each sample reads z_t + o_t or o_t alone"
    assert 0 < int(as_alone.sum()) < 8


def test_gradients_reach_the_backbone_through_the_controller_when_z_is_dropped():
    model = model_with(0.99)
    model.train()
    input_ids, labels = make_inputs(batch_size=2)
    torch.manual_seed(0)
    model(input_ids=input_ids, labels=labels).loss.backward()
    decoder_layer = model.get_decoder().layers[-1]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in decoder_layer.parameters())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backbone_drop_path": 1.0}, r"backbone_drop_path=1.0 must be in \[0, 1\)"),
        ({"backbone_drop_path": 0.5, "placement": "replace"}, 'only placement="stack" has'),
        ({"backbone_drop_path": 0.5, "panm_drop_path": 0.5}, "set one of them to 0"),
    ],
)
def test_bad_values_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        PanmConfig(text_config=BACKBONES["bart"](), **{"placement": "stack", **fields})


def test_save_load_keeps_it(tmp_path):
    model = model_with(0.5)
    model.save_pretrained(tmp_path)
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path).config.backbone_drop_path == 0.5
