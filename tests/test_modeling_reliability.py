"""Regression tests for issue 17: resizing, wrapping without side effects, loading the wrong folder, config checks."""

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, make_inputs
from transformers import AutoModelForSeq2SeqLM

import panm_hf  # noqa: F401  (registers the Auto classes)
from panm_hf import PanmForSeq2SeqLM

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
