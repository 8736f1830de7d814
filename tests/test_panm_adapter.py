"""save_panm / from_panm (PANM's weights alone, as an adapter) and PEFT LoRA on a wrapped model."""

import json
import shutil

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, VOCAB, activate_panm, make_inputs
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from panm_hf import BertWithPanmForQuestionAnswering, PanmConfig, PanmForCausalLM, PanmForSeq2SeqLM
from panm_hf.adapter import PANM_CONFIG_NAME, PANM_WEIGHTS_NAME, panm_state_dict


def _bart(d_model: int = 16):
    config = BACKBONES["bart"]()
    config.d_model = d_model
    return AutoModelForSeq2SeqLM.from_config(config)


def _gpt2():
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, vocab_size=VOCAB,
                                      bos_token_id=0, eos_token_id=2, pad_token_id=1))  # fmt: skip


def _bert():
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=64), add_pooling_layer=False)  # fmt: skip


# (model class, base builder, PanmConfig fields) per adapter and placement.
CASES = {
    "seq2seq-stack": (PanmForSeq2SeqLM, _bart, {"placement": "stack"}),
    "seq2seq-replace": (PanmForSeq2SeqLM, _bart, {"placement": "replace"}),
    "seq2seq-residual": (PanmForSeq2SeqLM, _bart, {"placement": "residual"}),
    "causal": (PanmForCausalLM, _gpt2, {}),
    "qa": (BertWithPanmForQuestionAnswering, _bert, {}),
}


def save_base(tmp_path, make=_bart, name="base", seed=0):
    """A tiny random base saved with save_pretrained: a local folder, as a Hub checkpoint would be."""
    torch.manual_seed(seed)
    folder = tmp_path / name
    make().save_pretrained(folder)
    return folder


def trained(model, seed=1):
    """Stand-in for training: every PANM weight moved off its init, so a weight that is not loaded shows."""
    activate_panm(model, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in panm_state_dict(model).values():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.1)
    return model.eval()


def logits(model) -> torch.Tensor:
    input_ids, labels = make_inputs()
    with torch.no_grad():
        if isinstance(model, BertWithPanmForQuestionAnswering):
            output = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
            return torch.stack([output.start_logits, output.end_logits])
        if isinstance(model, PanmForCausalLM):
            return model(input_ids=input_ids).logits
        return model(input_ids=input_ids, labels=labels).logits


def saved_model(tmp_path, case="seq2seq-stack"):
    """(base folder, trained wrapped model, PANM folder) for one case of `CASES`."""
    model_class, make, extra = CASES[case]
    folder = save_base(tmp_path, make)
    model = trained(model_class.from_backbone(folder, **TINY_PANM, **extra))
    model.save_panm(tmp_path / "panm")
    return folder, model, tmp_path / "panm"


@pytest.mark.parametrize("case", sorted(CASES))
def test_save_panm_writes_panm_alone_and_from_panm_reproduces_the_logits(tmp_path, case):
    folder, model, panm_dir = saved_model(tmp_path, case)
    model_class, _, extra = CASES[case]

    assert sorted(path.name for path in panm_dir.iterdir()) == sorted([PANM_CONFIG_NAME, PANM_WEIGHTS_NAME])
    weights = load_file(panm_dir / PANM_WEIGHTS_NAME)
    assert weights.keys() == panm_state_dict(model).keys() and not any(k.startswith("backbone.") for k in weights)
    saved_bytes = sum(path.stat().st_size for path in panm_dir.iterdir())
    assert saved_bytes < (folder / "model.safetensors").stat().st_size
    config = json.loads((panm_dir / PANM_CONFIG_NAME).read_text())
    assert config["adapter_class"] == model_class.__name__ and config["base_model_name_or_path"] == str(folder)
    assert config["placement"] == extra.get("placement", "stack")
    assert {name: config[name] for name in TINY_PANM} == TINY_PANM

    loaded = model_class.from_panm(panm_dir)  # the base is the folder recorded in panm_config.json
    assert not loaded.training and loaded.name_or_path == str(folder)
    assert torch.equal(logits(loaded), logits(model))


def test_replace_drops_the_last_layer_of_the_wrapper_only_and_shares_a_given_bases_weights(tmp_path):
    folder, model, panm_dir = saved_model(tmp_path, "seq2seq-replace")
    base = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    before = {name: tensor.clone() for name, tensor in base.state_dict().items()}

    loaded = PanmForSeq2SeqLM.from_panm(panm_dir, backbone=base)
    assert torch.equal(logits(loaded), logits(model))
    assert len(loaded.backbone.model.decoder.layers) == 1 and len(base.model.decoder.layers) == 2
    shared = loaded.backbone.model.decoder.layers[0].fc1.weight
    assert shared.data_ptr() == base.model.decoder.layers[0].fc1.weight.data_ptr()
    assert all(torch.equal(tensor, before[name]) for name, tensor in base.state_dict().items())


def test_a_moved_base_gets_a_clear_error_and_loads_from_its_new_path(tmp_path):
    folder, model, panm_dir = saved_model(tmp_path)
    moved = shutil.move(folder, tmp_path / "moved")
    error = r"base model folder .* \(base_model_name_or_path in .*\) does not exist.*pass backbone="
    with pytest.raises(ValueError, match=error):
        PanmForSeq2SeqLM.from_panm(panm_dir)
    loaded = PanmForSeq2SeqLM.from_panm(panm_dir, backbone=str(moved))
    assert torch.equal(logits(loaded), logits(model)) and loaded.name_or_path == str(moved)


def test_a_base_of_another_hidden_size_is_a_value_error_naming_the_weight(tmp_path):
    _, _, panm_dir = saved_model(tmp_path)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"panm\.\S+ in .* has shape .*another hidden size"):
        PanmForSeq2SeqLM.from_panm(panm_dir, backbone=_bart(d_model=32))


def test_panm_weights_load_strictly(tmp_path):
    _, _, panm_dir = saved_model(tmp_path, "seq2seq-residual")
    config_path = panm_dir / PANM_CONFIG_NAME
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "placement": "stack"}))  # "stack" has no output_norm
    with pytest.raises(ValueError, match=r"unexpected \['output_norm.bias', 'output_norm.weight'\]"):
        PanmForSeq2SeqLM.from_panm(panm_dir)

    config_path.write_text(json.dumps(config))
    weights = load_file(panm_dir / PANM_WEIGHTS_NAME)
    del weights["panm.controller.gru.weight_hh_l0"]
    save_file(weights, panm_dir / PANM_WEIGHTS_NAME)
    with pytest.raises(ValueError, match=r"missing \['panm.controller.gru.weight_hh_l0'\]"):
        PanmForSeq2SeqLM.from_panm(panm_dir)


def test_from_panm_refuses_wrong_inputs_with_the_fix(tmp_path):
    folder, model, panm_dir = saved_model(tmp_path)
    with pytest.raises(ValueError, match=r"saved from PanmForSeq2SeqLM.*PanmForSeq2SeqLM\.from_panm"):
        PanmForCausalLM.from_panm(panm_dir)
    with pytest.raises(ValueError, match=r"has no panm_config.json.*save_panm"):
        PanmForSeq2SeqLM.from_panm(folder)  # a base folder, not a PANM one
    with pytest.raises(ValueError, match=r"PANM folder .* does not exist"):
        PanmForSeq2SeqLM.from_panm(tmp_path / "nowhere")
    model.save_pretrained(tmp_path / "whole")
    with pytest.raises(ValueError, match=r"holds a whole PANM model, not a base model"):
        PanmForSeq2SeqLM.from_panm(panm_dir, backbone=str(tmp_path / "whole"))
    with pytest.raises(ValueError, match=r"\['dtype'\] go to the base's from_pretrained.*already loaded"):
        PanmForSeq2SeqLM.from_panm(panm_dir, backbone=_bart(), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"is a file"):
        model.save_panm(panm_dir / PANM_CONFIG_NAME)


def test_a_model_without_a_recorded_base_needs_one_passed(tmp_path):
    folder = save_base(tmp_path)
    model = trained(PanmForSeq2SeqLM.from_backbone(AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()),
                                                   **TINY_PANM))  # fmt: skip
    model.save_panm(tmp_path / "panm")
    with pytest.raises(ValueError, match=r"No base model is recorded .*pass backbone="):
        PanmForSeq2SeqLM.from_panm(tmp_path / "panm")
    model.save_panm(tmp_path / "panm", base_model_name_or_path=str(folder))  # or record it when saving
    assert PanmForSeq2SeqLM.from_panm(tmp_path / "panm").name_or_path == str(folder)


def test_panm_config_from_a_backbone_folder_wraps_its_config(tmp_path):
    # PEFT reads an adapter's base this way (model.config.__class__.from_pretrained(base)) when it saves.
    config = PanmConfig.from_pretrained(save_base(tmp_path), address_bits=7)
    assert config.text_config.model_type == "bart" and config.text_config.d_model == 16
    assert config.vocab_size == VOCAB and config.address_bits == 7


def test_backbone_kwargs_reach_the_bases_from_pretrained(tmp_path):
    _, model, panm_dir = saved_model(tmp_path)
    loaded = PanmForSeq2SeqLM.from_panm(panm_dir, dtype=torch.float64)  # PANM takes the base's dtype
    assert loaded.backbone.dtype == loaded.panm.controller.gru.weight_hh_l0.dtype == torch.float64
    torch.testing.assert_close(logits(loaded).float(), logits(model), rtol=0, atol=1e-5)


# -- PEFT --------------------------------------------------------------------------------------------
def test_lora_with_trainable_panm_trains_saves_reloads_and_merges(tmp_path):
    peft = pytest.importorskip("peft")
    folder = save_base(tmp_path)
    torch.manual_seed(0)
    model = activate_panm(PanmForSeq2SeqLM.from_backbone(folder, **TINY_PANM))  # g^o non-zero: all PANM learns
    attention = ["q_proj", "k_proj", "v_proj", "out_proj"]  # BART's attention projections
    lora = peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=4, lora_alpha=8, target_modules=attention,
                           lora_dropout=0.0, modules_to_save=["panm"])  # fmt: skip
    num_panm = len(list(model.panm.parameters()))
    peft_model = peft.get_peft_model(model, lora)
    before = {name: tensor.clone() for name, tensor in peft_model.named_parameters()}

    input_ids, labels = make_inputs()
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.1)
    peft_model.train()
    peft_model(input_ids=input_ids, labels=labels, base_address=torch.zeros(2, dtype=torch.long)).loss.backward()
    optimizer.step()
    changed = [name for name, tensor in peft_model.named_parameters() if not torch.equal(tensor, before[name])]
    assert all(".lora_" in name or ".panm.modules_to_save." in name for name in changed)
    assert any(".lora_" in name for name in changed) and any(".panm.modules_to_save." in name for name in changed)
    assert sum(".panm.modules_to_save." in name for name in changed) == num_panm  # every PANM weight

    peft_model.eval()
    expected = logits(peft_model)
    with pytest.raises(ValueError, match=r"holds PEFT layers.*merge_and_unload"):
        peft_model.save_panm(tmp_path / "panm")
    peft_model.save_pretrained(tmp_path / "lora")
    saved = load_file(tmp_path / "lora" / "adapter_model.safetensors")
    assert saved and all(".lora_" in name or ".panm." in name for name in saved)

    fresh = PanmForSeq2SeqLM.from_backbone(folder, **TINY_PANM)  # PANM freshly initialised
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "lora").eval()
    assert torch.equal(logits(reloaded), expected)
    generated = reloaded.generate(input_ids=input_ids, max_new_tokens=4, do_sample=False, num_beams=1)

    merged = reloaded.merge_and_unload()
    assert type(merged) is PanmForSeq2SeqLM and not any("lora" in name for name, _ in merged.named_modules())
    torch.testing.assert_close(logits(merged), expected, rtol=0, atol=1e-5)
    assert torch.equal(merged.generate(input_ids=input_ids, max_new_tokens=4, do_sample=False, num_beams=1), generated)
