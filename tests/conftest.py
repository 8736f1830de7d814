"""Tiny random backbones shared by the tests (no network, seconds each)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    BartConfig,
    BertConfig,
    EncoderDecoderConfig,
    MarianConfig,
    MBartConfig,
    T5Config,
)

VOCAB = 99
TINY_PANM = {"address_bits": 6, "pointer_hidden_size": 12, "controller_hidden_size": 12, "mlp_hidden_size": 10}


def _bart_like(config_class, **extra):
    return config_class(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        **extra,
    )


def _t5():
    return T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def _bert2bert():
    bert = {
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 64,
    }
    config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**bert), BertConfig(**bert))
    config.pad_token_id, config.decoder_start_token_id, config.eos_token_id = 0, 2, 3
    return config


BACKBONES = {
    "bart": lambda: _bart_like(BartConfig),
    "marian": lambda: _bart_like(MarianConfig),
    "mbart": lambda: _bart_like(MBartConfig),
    "t5": _t5,
    "encoder-decoder": _bert2bert,
}


@pytest.fixture(params=["bart", "t5", "marian"])
def backbone_config(request):
    """One tiny config per backbone family the issue names as required."""
    return BACKBONES[request.param]()


def tiny_memory(**kwargs):
    """A tiny `PanmMemory` in eval mode, seeded: memory 8, decoder input 6, output 5, b = 5.

    `kwargs` override the sizes (`memory_dim`, `decoder_input_size`, `output_size`), `undecoded_output` or
    `PanmMemoryConfig` fields.
    """
    from panm_hf.memory import PanmMemory
    from panm_hf.memory_config import PanmMemoryConfig

    defaults = (("memory_dim", 8), ("decoder_input_size", 6), ("output_size", 5), ("undecoded_output", False))
    sizes = {name: kwargs.pop(name, default) for name, default in defaults}
    config = PanmMemoryConfig(**{"address_bits": 5, "pointer_hidden_size": 12, "controller_hidden_size": 12,
                                 "mlp_hidden_size": 10, **kwargs})  # fmt: skip
    torch.manual_seed(0)
    return PanmMemory(config, **sizes).eval()


def tiny_replace_seq2seq(**panm):
    """A seeded `PanmForSeq2SeqLM` on a tiny BART, the Controller in place of the last decoder layer, 8-wide PANM
    (`panm` sets more `PanmConfig` fields), and a padded batch: `(model, source, mask, labels)`."""
    from panm_hf import PanmConfig, PanmForSeq2SeqLM

    torch.manual_seed(0)
    config = PanmConfig(text_config=BACKBONES["bart"]().to_dict(), placement="replace", pointer_hidden_size=8,
                        controller_hidden_size=8, mlp_hidden_size=8, **panm)  # fmt: skip
    source = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 1]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    labels = torch.tensor([[7, 8, 9, 2], [9, 8, 2, -100]])
    return PanmForSeq2SeqLM(config), source, mask, labels


def greedy_matching_teacher_forcing(model, source, mask, steps: int) -> torch.Tensor:
    """Greedy `generate` for exactly `steps` new tokens with the cache, checked against the teacher-forced argmax of
    the same model on its own output (a cached step that diverged would fail); returns the generated ids."""
    generated = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                               do_sample=False, num_beams=1, forced_eos_token_id=None)  # fmt: skip
    forced = model(input_ids=source, attention_mask=mask, decoder_input_ids=generated[:, :-1]).logits
    assert torch.equal(forced.argmax(-1), generated[:, 1:])
    return generated


def make_inputs(batch_size: int = 2, src_len: int = 7, tgt_len: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (batch_size, src_len), generator=generator)
    labels = torch.randint(4, VOCAB, (batch_size, tgt_len), generator=generator)
    return input_ids, labels


def activate_panm(model, seed=1):
    """Give g^o's zero-initialised last layer random weights so PANM changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    layer = model.panm.controller.output_mlp[-1]
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.5)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator) * 0.5)
    return model


_BLOCK_PANM_HF = """
import sys
class _BlockPanm:
    def find_spec(self, name, path=None, target=None):
        if name == "panm_hf" or name.startswith("panm_hf."):
            raise ImportError("panm_hf is blocked in this process")
sys.meta_path.insert(0, _BlockPanm())
"""


def run_without_panm_hf(body: str, tmp_path) -> list[str]:
    """Run `body` in a fresh Python where panm_hf cannot be imported (what a trust_remote_code user has);
    return its stdout's words. The test fails with the child's stderr if it exits non-zero."""
    import os
    import subprocess
    import textwrap

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    script = _BLOCK_PANM_HF + textwrap.dedent(body) + '\nassert "panm_hf" not in sys.modules\n'
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


class OpNames(TorchDispatchMode):
    """Records the name of every aten (or custom) op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
