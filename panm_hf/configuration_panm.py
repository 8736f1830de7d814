"""PanmConfig: PANM hyperparameters plus the backbone's config under ``text_config``."""

from __future__ import annotations

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .memory import reject_bool, validate_panm_hyperparameters

PLACEMENTS = ("stack", "replace", "residual")
# Attributes read from the outer config by Trainer, Seq2SeqTrainer, generate() and weight tying.
MIRRORED_ATTRIBUTES = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "tie_word_embeddings",
    "vocab_size",
)


class PanmConfig(PreTrainedConfig):
    r"""Configuration of a backbone augmented with Pointer-Augmented Neural Memory.

    Field-to-paper map (Le et al., "Plug, Play, and Generalize: Length Extrapolation with
    Pointer-Augmented Neural Memory", Sec. 2 and appendix); defaults are the paper's.

    Args:
        text_config (`dict` or `PreTrainedConfig`, *optional*):
            The backbone's config (an encoder-decoder such as BART, T5, Marian, mBART or
            `EncoderDecoderModel` for `PanmForSeq2SeqLM`; an encoder such as BERT for
            `BertWithPanmForQuestionAnswering`). Defaults to a BART config.
        address_bits (`int`, *optional*, defaults to 10):
            `b`, bits of a physical address; inputs may have at most `2^b` tokens.
        num_pointer_units (`int`, *optional*, defaults to 2):
            `H^a`, Mode-1 pointers, each with its own Pointer Unit. They start at the base
            address `p_B`, the end address `p_E`, then evenly spaced slots (the middle for 3).
        num_mode2_heads (`int`, *optional*, defaults to 1):
            `H^c`, Mode-2 attention heads (0 disables Mode 2).
        pointer_hidden_size (`int`, *optional*, defaults to 256):
            size of each Pointer Unit GRU state `h^a_t`.
        controller_hidden_size (`int`, *optional*, defaults to 256):
            size of the Controller GRU state `h^c_t`.
        mlp_hidden_size (`int`, *optional*, defaults to 128):
            hidden width of the MLPs `g^a`, `g^c` and `g^o`.
        scoring (`str`, *optional*, defaults to `"cosine"`):
            attention scoring of the address attention (Eq. 2) and Mode-2 attention (Eq. 5):
            `"cosine"` (the paper's equations, times a learnable inverse temperature) or `"dot"`
            (scaled dot product, the authors' code). Measured on Copy (docs/RESULTS.md, "Design
            choices measured"): cosine x 15 reached 93.5% at 2(L+1) where dot reached 57.9%.
        cosine_inverse_temperature (`float`, *optional*, defaults to 15.0):
            initial inverse temperature for `scoring="cosine"`.
        controller_init (`str`, *optional*, defaults to `"mean"`):
            `h^c_0` from a projected `"mean"` of the real memory slots, or the paper's `"sum"`.
        placement (`str`, *optional*, defaults to `"stack"`):
            where the Controller goes in a seq2seq backbone's decoder: `"stack"` adds it after the
            last decoder layer through a zero-initialised residual (a freshly wrapped pretrained
            model is exactly the backbone); `"replace"` replaces the last decoder layer, the
            paper's setup that keeps the parameter count; `"residual"` replaces the last decoder layer
            too but joins the Controller's output to the decoder stream as a Transformer sublayer does,
            `LayerNorm(z_t + o_t)` (the paper's `replace` feeds the logits from the Controller alone).
        pointer_update (`str`, *optional*, defaults to `"attention"`):
            how a Pointer Unit moves its pointer. `"attention"` is the paper's Eq. 2. `"shift"` (beyond
            the paper) adds content-free pointer arithmetic: each unit picks, by one softmax, among
            moving its previous address attention by a step in `-K..K` and the paper's attention; the
            mixture is sharpened by a learned exponent (`panm_hf.pointer_arithmetic`). Measured on the
            algorithmic suite in docs/RESULTS.md ("Beyond the paper").
        shift_range (`int`, *optional*, defaults to 1):
            `K`, the largest step of `pointer_update="shift"`.
        address_distractors (`int`, *optional*, defaults to 0):
            beyond the paper: in training, this many distractor addresses per sample (a real address
            plus a multiple of the smallest power of two covering the input) join the address bank the
            Pointer Units attend over; weight put on them reads nothing. 0 disables; no effect in eval.
        content_read (`str`, *optional*, defaults to `"none"`):
            `"none"` keeps the paper's reads; `"decoder"` (beyond the paper's equations, after the
            authors' code, which has an attention over `M` inside the Controller) adds a content
            attention over `M` queried by the decoder state `z_t`, fed to the Controller with the
            Mode-1/Mode-2 values. Seq2seq only (the QA head has no `z_t`).
        panm_dropout (`float`, *optional*, defaults to 0.0):
            dropout on the reads entering the Controller and on its output (the paper has none).
    """

    model_type = "panm"
    sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="bart")}

    text_config: dict | PreTrainedConfig | None = None
    address_bits: int = 10
    num_pointer_units: int = 2
    num_mode2_heads: int = 1
    pointer_hidden_size: int = 256
    controller_hidden_size: int = 256
    mlp_hidden_size: int = 128
    scoring: str = "cosine"
    cosine_inverse_temperature: float | int = 15.0
    controller_init: str = "mean"
    placement: str = "stack"
    pointer_update: str = "attention"
    shift_range: int = 1
    address_distractors: int = 0
    content_read: str = "none"
    panm_dropout: float | int = 0.0
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    tie_word_embeddings: bool | None = None
    vocab_size: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        for name in MIRRORED_ATTRIBUTES:
            if getattr(self, name, None) is None and getattr(self.text_config, name, None) is not None:
                setattr(self, name, getattr(self.text_config, name))
        # generate() picks encoder-decoder decoding from the outer config; it has a base-class default.
        self.is_encoder_decoder = bool(getattr(self.text_config, "is_encoder_decoder", False))
        self.validate_panm()

    def validate_panm(self) -> None:
        """Raise ValueError naming the offending field."""
        validate_panm_hyperparameters(
            address_bits=self.address_bits,
            num_pointer_units=self.num_pointer_units,
            num_mode2_heads=self.num_mode2_heads,
            scoring=self.scoring,
            controller_init=self.controller_init,
            pointer_update=self.pointer_update,
            shift_range=self.shift_range,
            address_distractors=self.address_distractors,
            content_read=self.content_read,
            panm_dropout=self.panm_dropout,
            cosine_inverse_temperature=self.cosine_inverse_temperature,
        )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r} is not supported; choose one of {PLACEMENTS}.")
        for name in ("pointer_hidden_size", "controller_hidden_size", "mlp_hidden_size"):
            value = getattr(self, name)
            reject_bool(name, value)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer (got {value!r}).")

    def panm_kwargs(self) -> dict:
        """Keyword arguments of `PanmMemory` taken from this config."""
        return {
            "address_bits": self.address_bits,
            "num_pointer_units": self.num_pointer_units,
            "num_mode2_heads": self.num_mode2_heads,
            "pointer_hidden_size": self.pointer_hidden_size,
            "controller_hidden_size": self.controller_hidden_size,
            "mlp_hidden_size": self.mlp_hidden_size,
            "scoring": self.scoring,
            "cosine_inverse_temperature": float(self.cosine_inverse_temperature),
            "controller_init": self.controller_init,
            "pointer_update": self.pointer_update,
            "shift_range": self.shift_range,
            "address_distractors": self.address_distractors,
            "content_read": self.content_read,
            "panm_dropout": float(self.panm_dropout),
        }


__all__ = ["PanmConfig"]
