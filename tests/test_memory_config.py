"""PanmMemoryConfig: the one owner of PANM's hyperparameters (fields, defaults, allowed values, checks)."""

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY_PANM
from transformers import AutoConfig, BertConfig, HfArgumentParser

import panm_hf  # noqa: F401  (registers PanmConfig with AutoConfig)
from panm_hf import PanmConfig, PanmMemory, PanmMemoryConfig

MEMORY_CONFIG_PY = Path(__file__).resolve().parents[1] / "panm_hf" / "memory_config.py"
MEMORY_FIELDS = dataclasses.fields(PanmMemoryConfig)
CHOICE_FIELDS = [f.name for f in MEMORY_FIELDS if "choices" in f.metadata]
# A config.json written before PanmMemoryConfig existed (flat PANM keys; text_config trimmed).
OLD_CONFIG_JSON = {
    "address_bits": 7, "address_distractors": 0, "auto_map": {"AutoConfig": "configuration_panm.PanmConfig"},
    "bos_token_id": None, "content_read": "none", "controller_hidden_size": 256, "controller_init": "mean",
    "cosine_inverse_temperature": 30, "decoder_start_token_id": None, "eos_token_id": None, "mlp_hidden_size": 128,
    "model_type": "panm", "num_mode2_heads": 1, "num_pointer_units": 2, "pad_token_id": 0, "panm_dropout": 0.1,
    "placement": "stack", "pointer_hidden_size": 256, "pointer_update": "shift", "scoring": "dot", "shift_range": 2,
    "text_config": {"hidden_size": 16, "intermediate_size": 32, "model_type": "bert", "num_attention_heads": 2,
                    "num_hidden_layers": 1, "pad_token_id": 0, "vocab_size": 99},
    "tie_word_embeddings": True, "transformers_version": "5.23.0", "vocab_size": 99,
}  # fmt: skip


def test_memory_config_imports_nothing_but_the_standard_library():
    # The package's __init__ registers the Auto classes (transformers, torch); the file itself must not need them.
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers", "einops", "numpy", "panm_hf"):
                    raise ImportError(name + " is blocked in this process")
        sys.meta_path.insert(0, Block())
        spec = importlib.util.spec_from_file_location("memory_config", {str(MEMORY_CONFIG_PY)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["memory_config"] = module
        spec.loader.exec_module(module)
        config = module.PanmMemoryConfig(scoring="dot")
        try:
            module.PanmMemoryConfig(scoring="l2")
        except ValueError as error:
            print(config.scoring, "scoring" in str(error), "torch" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["dot", "True", "False"]


def test_every_memory_field_is_a_panm_config_field_with_the_same_default():
    config_fields = {f.name: f for f in dataclasses.fields(PanmConfig)}
    for field in MEMORY_FIELDS:
        assert field.name in config_fields, field.name
        assert config_fields[field.name].default == field.default, field.name
        assert field.metadata.get("help"), f"{field.name} has no help for HfArgumentParser"
    assert PanmConfig().memory_config == PanmMemoryConfig()
    assert len(MEMORY_FIELDS) == 28 and set(CHOICE_FIELDS) == {
        "scoring", "address_key", "controller_init", "controller_cell", "pointer_update", "shift_init", "content_read",
        "content_read_keys", "recurrence_kernel", "output_decoder_drop_scope",
    }  # fmt: skip


@pytest.mark.parametrize("name", CHOICE_FIELDS)
def test_a_bad_choice_raises_naming_the_field_and_the_choices(name):
    allowed = next(f.metadata["choices"] for f in MEMORY_FIELDS if f.name == name)
    for config_class in (PanmMemoryConfig, PanmConfig):
        with pytest.raises(ValueError, match=rf"{name}='bogus' is not supported; choose one of") as error:
            config_class(**{name: "bogus"})
        assert all(choice in str(error.value) for choice in allowed)
    for choice in allowed:  # every allowed value passes (content_read="decoder" alone needs no z_t here)
        if (name, choice) == ("recurrence_kernel", "triton") and importlib.util.find_spec("triton") is None:
            with pytest.raises(ValueError, match='recurrence_kernel="triton" needs Triton'):
                PanmConfig(**{name: choice})
            continue
        # the fields another one needs: the moves "walk" starts, the content read the keys key, the drop it scopes
        companions = {"shift_init": {"pointer_update": "shift"}, "content_read_keys": {"content_read": "decoder"},
                      "output_decoder_drop_scope": {"output_decoder_input": True, "output_decoder_drop_path": 0.5}}
        companions = companions.get(name, {})
        assert getattr(PanmConfig(**{name: choice}, **companions).memory_config, name) == choice


@pytest.mark.parametrize(
    "name, bad",
    [("address_bits", 0), ("address_bits", 63), ("num_pointer_units", 0), ("num_mode2_heads", -1),
     ("pointer_hidden_size", 0), ("controller_hidden_size", "8"), ("mlp_hidden_size", 0), ("shift_range", 0),
     ("address_distractors", -1), ("controller_truncation", -1), ("panm_dropout", 1.0),
     ("panm_drop_path", 1.0), ("panm_drop_path", -0.1), ("panm_drop_path", True)],
)  # fmt: skip
def test_a_bad_number_raises_naming_the_field(name, bad):
    for config_class in (PanmMemoryConfig, PanmConfig):
        with pytest.raises(ValueError, match=name):
            config_class(**{name: bad})


def test_validate_catches_a_config_edited_after_construction():
    config = PanmConfig(**TINY_PANM)
    config.scoring = "l2"
    with pytest.raises(ValueError, match="scoring"):
        config.validate()
    with pytest.raises(ValueError, match="scoring"):
        PanmMemory(config, memory_dim=8, decoder_input_size=0, output_size=4)


def test_hf_argument_parser_exposes_every_field():
    parser = HfArgumentParser(PanmMemoryConfig)
    (config,) = parser.parse_args_into_dataclasses(["--scoring", "dot", "--panm_dropout", "0.1"])
    assert config == PanmMemoryConfig(scoring="dot", panm_dropout=0.1)
    (config,) = parser.parse_args_into_dataclasses(["--address-bits", "7", "--pointer_update", "shift"])
    assert (config.address_bits, config.pointer_update) == (7, "shift")
    flags = {option for action in parser._actions for option in action.option_strings}
    assert {f"--{field.name}" for field in MEMORY_FIELDS} <= flags
    with pytest.raises(SystemExit):  # argparse rejects a value outside the field's choices
        parser.parse_args_into_dataclasses(["--scoring", "l2"])


def test_panm_config_json_stays_flat_and_round_trips(tmp_path):
    config = PanmConfig(text_config=BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=32),
                        scoring="dot", address_distractors=3, placement="replace")  # fmt: skip
    saved = config.to_dict()
    assert "memory_config" not in saved
    assert {f.name for f in MEMORY_FIELDS} <= saved.keys()
    config.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["scoring"], written["address_distractors"], written["placement"]) == ("dot", 3, "replace")
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, PanmConfig) and loaded.memory_config == config.memory_config


def test_an_old_flat_config_json_loads_unchanged(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(OLD_CONFIG_JSON))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, PanmConfig) and config.text_config.model_type == "bert"
    # fields added after that file was written (recurrence_kernel, panm_drop_path, address_key, shift_init,
    # output_decoder_input, output_decoder_drop_path, mlp_dropout, reads_dropout, content_read_dropout,
    # content_read_keys, controller_cell, output_decoder_drop_scope, controller_truncation, controller_reset_rate) take
    # their defaults;
    # address_key's default is the MLP every earlier checkpoint was trained with, output_decoder_input's the paper's
    # g^o that every earlier checkpoint has, the two dropouts' None the panm_dropout on every read that every earlier
    # checkpoint had,
    # content_read_keys' the memory-keyed read, controller_cell's the GRU, output_decoder_drop_scope's the per-sample
    # drop that every earlier checkpoint trained with (drop-path off or, under input feeding, see its doc),
    # controller_truncation's backpropagation through every step, controller_reset_rate's state kept at every step
    expected = {f.name: OLD_CONFIG_JSON.get(f.name, f.default) for f in MEMORY_FIELDS}
    assert set(expected) - set(OLD_CONFIG_JSON) == {
        "recurrence_kernel", "panm_drop_path", "address_key", "shift_init", "output_decoder_input",
        "output_decoder_drop_path", "mlp_dropout", "reads_dropout", "content_read_dropout", "content_read_keys",
        "controller_cell", "output_decoder_drop_scope", "controller_truncation",
        "controller_reset_rate",
    }
    assert dataclasses.asdict(config.memory_config) == expected
    assert config.placement == "stack" and config.vocab_size == 99


def test_panm_memory_takes_a_panm_config_as_it_takes_its_memory_config():
    config = PanmConfig(**TINY_PANM, num_mode2_heads=2)
    sizes = {"memory_dim": 8, "decoder_input_size": 6, "output_size": 5}
    torch.manual_seed(0)
    from_hf_config = PanmMemory(config, **sizes)
    torch.manual_seed(0)
    from_memory_config = PanmMemory(config.memory_config, **sizes)
    assert from_hf_config.state_dict().keys() == from_memory_config.state_dict().keys()
    for name, tensor in from_hf_config.state_dict().items():
        assert torch.equal(tensor, from_memory_config.state_dict()[name]), name

