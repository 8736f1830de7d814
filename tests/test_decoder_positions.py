"""The decoder settings (`decoder_positions`, `decoder_window`) survive saving and loading: a model trained with
them scores as trained when loaded back, through the Auto classes or the examples."""

from __future__ import annotations

import pytest
import torch
from conftest import BACKBONES
from transformers import AutoModelForSeq2SeqLM, BartConfig, GPT2Config

from panm_hf import PanmConfig, PanmForCausalLM, PanmForSeq2SeqLM, PanmMemoryConfig

SOURCE = torch.tensor([[5, 6, 7, 8, 2]])
DECODER_INPUTS = torch.tensor([[2, 7, 8, 9, 10, 11, 12]])  # longer than the window: the window changes the logits


def small_panm(backbone: str, **fields) -> PanmForSeq2SeqLM:
    torch.manual_seed(0)
    config = PanmConfig(text_config=BACKBONES[backbone]().to_dict(), placement="replace", pointer_hidden_size=8,
                        controller_hidden_size=8, mlp_hidden_size=8, **fields)  # fmt: skip
    return PanmForSeq2SeqLM(config).eval()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=SOURCE, decoder_input_ids=DECODER_INPUTS).logits


def in_fresh_memory(model):
    """`model` with every parameter and buffer copied into newly allocated memory. A loaded model's tensors view the
    safetensors file at offsets that need not be 64-byte aligned, and on some CPUs (an AMD EPYC box here) the
    vectorised kernels round differently on such memory (logits 4e-9 apart with equal weights); in fresh memory the
    loaded weights compute bit for bit as the saved ones, which is what the exact comparisons below check."""
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.data = tensor.data.clone()
    return model


def sees_far_back(model) -> bool:
    """Whether the backbone's last decoder step (the decoder without PANM) changes with a token 5 steps before
    it: not under a window of 2 (test_scan_example.py checks the window itself)."""
    changed = DECODER_INPUTS.clone()
    changed[0, 1] = 13
    with torch.no_grad():
        states = [model.backbone(input_ids=SOURCE, decoder_input_ids=ids).logits for ids in (DECODER_INPUTS, changed)]
    return not torch.equal(states[0][0, -1], states[1][0, -1])


@pytest.mark.parametrize("backbone", ["bart", "marian"])  # learned positions saved; Marian's sinusoids recomputed
def test_auto_loaded_panm_model_keeps_its_decoder_positions_and_window(tmp_path, backbone):
    model = small_panm(backbone, decoder_positions="none", decoder_window=2)
    positions = model.get_decoder().embed_positions.weight
    assert torch.count_nonzero(positions) == 0 and not positions.requires_grad
    model.save_pretrained(tmp_path)
    loaded = in_fresh_memory(AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval())
    assert isinstance(loaded, PanmForSeq2SeqLM)
    assert (loaded.config.decoder_positions, loaded.config.decoder_window) == ("none", 2)
    assert torch.count_nonzero(loaded.get_decoder().embed_positions.weight) == 0
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    # the same weights without the window score differently: the window is what the load restored
    unwindowed = PanmForSeq2SeqLM.from_pretrained(tmp_path, decoder_window=0).eval()
    assert not sees_far_back(loaded) and sees_far_back(unwindowed)
    # loading info comes back as a tuple, and the settings are still applied
    again, info = PanmForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    torch.testing.assert_close(logits(in_fresh_memory(again.eval())), logits(model), rtol=0, atol=0)


def test_decoder_settings_are_checked_by_name():
    with pytest.raises(ValueError, match="decoder_window must be >= 0"):
        PanmConfig(decoder_window=-1)
    with pytest.raises(ValueError, match="decoder_positions must be one of"):
        PanmConfig(decoder_positions="rope")
    with pytest.raises(ValueError, match="max_position_offset must be >= 0"):
        PanmConfig(max_position_offset=-2)
    with pytest.raises(ValueError, match="needs a decoder with absolute positions"):
        small_panm("t5", decoder_positions="none")
    with pytest.raises(ValueError, match="decoder_window needs a decoder whose self-attention .* runs through"):
        small_panm("t5", decoder_window=4)
    gpt2 = GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, vocab_size=40).to_dict()
    with pytest.raises(ValueError, match="options of PanmForSeq2SeqLM"):
        PanmForCausalLM(PanmConfig(text_config=gpt2, decoder_window=4))


def test_examples_record_a_plain_models_settings_and_apply_them_when_loading(tmp_path):
    from run_translation import ModelArguments, build_model

    text_config = BartConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    panm_args = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8)
    trained = ModelArguments(placement="replace", decoder_positions="none", decoder_window=2)
    for name in ("transformer", "panm"):
        torch.manual_seed(0)
        model = build_model(name, trained, panm_args, text_config).eval()
        assert (model.config.decoder_positions, model.config.decoder_window) == ("none", 2), name
        model.save_pretrained(tmp_path / name)
        # evaluating with the flags left at their defaults scores the model as trained
        loaded = build_model(name, ModelArguments(placement="replace"), panm_args, str(tmp_path / name)).eval()
        torch.testing.assert_close(logits(in_fresh_memory(loaded)), logits(model), rtol=0, atol=0, msg=name)
        same = build_model(name, trained, panm_args, str(tmp_path / name)).eval()
        torch.testing.assert_close(logits(in_fresh_memory(same)), logits(model), rtol=0, atol=0, msg=name)
        with pytest.raises(ValueError, match="omit both flags to keep the checkpoint's"):
            build_model(name, ModelArguments(placement="replace", decoder_window=5), panm_args, str(tmp_path / name))
    # a PANM model wrapped around the trained Transformer takes the Transformer's record
    wrapped = build_model("panm", ModelArguments(placement="replace"), panm_args, str(tmp_path / "transformer"))
    assert (wrapped.config.decoder_positions, wrapped.config.decoder_window) == ("none", 2)
    assert torch.count_nonzero(wrapped.get_decoder().embed_positions.weight) == 0
    plain = build_model("transformer", ModelArguments(), panm_args, text_config)
    assert not hasattr(plain.config, "decoder_window")  # nothing recorded where nothing changed
