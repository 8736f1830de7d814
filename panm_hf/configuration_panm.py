"""PanmConfig: PANM hyperparameters (`PanmMemoryConfig`) plus the backbone's config under ``text_config``."""

from __future__ import annotations

from dataclasses import fields

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .decoder_positions import check as check_decoder_positions
from .memory_config import PanmMemoryConfig

PLACEMENTS = ("stack", "replace", "residual", "top")
# PanmForCausalLM's memory M: every token so far, or the prompt only (the seq2seq framing in one stream).
CAUSAL_MEMORIES = ("sequence", "prompt")
# PanmForSeq2SeqLM's end-of-sequence logit: from what the LM head reads, as every other token's, or from PANM's
# output alone (its pointers' count of the source decides when to stop; the backbone's decoder does not).
EOS_DECISIONS = ("shared", "panm")
# The placements in which the Controller takes the place of the backbone's last decoder layer.
LAYER_REPLACING_PLACEMENTS = ("replace", "residual")
# The placements in which the LM head reads PANM's output alone (no backbone path beside it).
PANM_ONLY_PLACEMENTS = ("replace", "top")
# Attributes read from the outer config by Trainer, Seq2SeqTrainer, generate() and weight tying.
MIRRORED_ATTRIBUTES = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "tie_word_embeddings",
    "vocab_size",
)


class PanmConfig(PreTrainedConfig, PanmMemoryConfig):
    r"""Configuration of a backbone augmented with Pointer-Augmented Neural Memory.

    The PANM fields (`address_bits`, `num_pointer_units`, `scoring`, ...) are inherited from
    `PanmMemoryConfig`, which documents them with the paper's symbols, holds their defaults and
    allowed values and checks them; `config.json` stays flat (one key per field).

    Args:
        text_config (`dict` or `PreTrainedConfig`, *optional*):
            The backbone's config (an encoder-decoder such as BART, T5, Marian, mBART or
            `EncoderDecoderModel` for `PanmForSeq2SeqLM`; a decoder-only LM such as GPT-2, Llama or
            Qwen2 for `PanmForCausalLM`; an encoder such as BERT for `BertWithPanmForQuestionAnswering`).
            Defaults to a BART config.
        placement (`str`, *optional*, defaults to `"stack"`):
            where the Controller goes in a seq2seq backbone's decoder: `"stack"` adds it after the
            last decoder layer through a zero-initialised residual (a freshly wrapped pretrained
            model is exactly the backbone); `"replace"` replaces the last decoder layer, the
            paper's setup that keeps the parameter count; `"residual"` replaces the last decoder layer
            too but joins the Controller's output to the decoder stream as a Transformer sublayer does,
            `LayerNorm(z_t + o_t)` (the paper's `replace` feeds the logits from the Controller alone);
            `"top"` (beyond the paper) keeps every decoder layer and feeds the logits from the Controller
            alone, as `"replace"` does: the Controller is an output layer on top of the whole decoder (the
            paper's integration on a decoder one layer deeper). `PanmForCausalLM` supports `"stack"` only.
        causal_memory (`str`, *optional*, defaults to `"sequence"`):
            what `PanmForCausalLM` uses as PANM's memory `M`. `"sequence"`: every token so far (the paper's
            Dyck model, "masking M"); every position is a decoding step that reads the slots up to its
            own. `"prompt"`: the backbone's states over the prompt only, the seq2seq framing inside one
            stream: the decoding steps are the response (from the prompt's last token on, each predicting
            the next token), the pointers start at the prompt's first and last tokens (`p_B`, `p_E`), and
            positions before the response get the backbone's output alone. In training the prompt is what
            precedes each row's first supervised label (or `prompt_mask` / `prompt_lengths`); in
            `generate()` it is the prompt given. Other PANM heads ignore this field.
        eos_decision (`str`, *optional*, defaults to `"shared"`):
            where `PanmForSeq2SeqLM` and `PanmForCausalLM` take the end-of-sequence logit from. `"shared"`:
            from what the LM head reads, as every other token's. `"panm"`: from PANM's output alone (the LM
            head's `eos_token_id` rows applied to the Controller's output, before drop-path), so the stop
            decision is made by the Controller, which sees the pointers' place in the source, and not by the
            backbone's decoder, whose count of its own tokens stops at the training lengths
            (docs/results/scan.md). With `output_decoder_input=True` `g^o`'s `z_t` columns are left out of that
            logit, so the decoder's state reaches it only through the Controller GRU. With `"stack"` it breaks
            the zero-initialised equivalence to the backbone for that one logit only. In `PanmForCausalLM` it
            applies where PANM decodes (with
            `causal_memory="prompt"`, from the prompt's last token on; the prompt keeps the backbone's). The QA
            head accepts `"shared"` only.
        decoder_positions (`str`, *optional*, defaults to `"absolute"`):
            beyond the paper, `PanmForSeq2SeqLM` only: the backbone decoder's position signal. `"absolute"`: the
            backbone's own; `"none"`: its absolute position embeddings zeroed and frozen (BART, Marian), so no
            decoder step past the training length looks new; `"offset"`: they start at a random offset in
            `[0, max_position_offset]` per sample in training (0 in eval); `"alibi"`: none, and ALiBi's distance
            bias on the decoder's self-attention; `"relative"`: none, and a learned bias per head and distance
            inside `decoder_window` (which it needs; a `relative_attention_bias` table per self-attention, saved
            with the weights). SCAN's length split needs `"none"` (docs/results/scan.md).
        decoder_window (`int`, *optional*, defaults to 0):
            beyond the paper, `PanmForSeq2SeqLM` only: each decoder query attends to its last `decoder_window`
            tokens (0: the whole prefix). With it no bigger than the training outputs, no decoder query past the
            training length attends to more tokens than in training. Both live in the attention function,
            which transformers does not save; the model applies them from this config when built or loaded.
        max_position_offset (`int`, *optional*, defaults to 64):
            the largest random offset of `decoder_positions="offset"`.
        input_feeding (`bool`, *optional*, defaults to `False`):
            beyond the paper, `PanmForSeq2SeqLM` only: the decoder's input at step `t` is its token's embedding
            plus a learned projection (zero at first) of the Controller's state `h^c_{t-1}`, as Luong et al.'s
            input feeding does with the attention output. The decoder then runs one token at a time in training
            too (`input_feeding.py`).
        **kwargs: the `PanmMemoryConfig` fields and `PreTrainedConfig`'s arguments.
    """

    model_type = "panm"
    sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="bart")}

    text_config: dict | PreTrainedConfig | None = None
    placement: str = "stack"
    causal_memory: str = "sequence"
    eos_decision: str = "shared"
    decoder_positions: str = "absolute"
    decoder_window: int = 0
    max_position_offset: int = 64
    input_feeding: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    tie_word_embeddings: bool | None = None
    vocab_size: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)  # PreTrainedConfig's; PanmMemoryConfig's check runs in validate_panm
        for name in MIRRORED_ATTRIBUTES:
            if getattr(self, name, None) is None and getattr(self.text_config, name, None) is not None:
                setattr(self, name, getattr(self.text_config, name))
        # generate() picks encoder-decoder decoding from the outer config; it has a base-class default.
        self.is_encoder_decoder = bool(getattr(self.text_config, "is_encoder_decoder", False))
        self.validate_panm()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> PanmConfig:
        """`PreTrainedConfig.from_pretrained`, which also reads a backbone's folder or Hub id.

        A config of another `model_type` (a BART or GPT-2 checkpoint) becomes the `PanmConfig` that
        `from_backbone` builds around it (it as `text_config`, default PANM fields, `kwargs` applied)
        instead of a PANM config over a default BART. PEFT reads an adapter's base model this way
        when it saves (to check whether its vocabulary was resized).
        """
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type", cls.model_type) != cls.model_type:
            config_dict = {"text_config": config_dict}
        return cls.from_dict(config_dict, **kwargs)

    def validate_panm(self) -> None:
        """`PanmMemoryConfig.validate` plus `placement`; ValueError naming the offending field."""
        PanmMemoryConfig.validate(self)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r} is not supported; choose one of {PLACEMENTS}.")
        if self.causal_memory not in CAUSAL_MEMORIES:
            raise ValueError(
                f"causal_memory={self.causal_memory!r} is not supported; choose one of {CAUSAL_MEMORIES} "
                '("sequence": every token so far, "prompt": the prompt only).'
            )
        if self.eos_decision not in EOS_DECISIONS:
            raise ValueError(
                f"eos_decision={self.eos_decision!r} is not supported; choose one of {EOS_DECISIONS} (\"shared\": "
                'the end-of-sequence logit from what the LM head reads, "panm": from PANM\'s output alone).'
            )
        check_decoder_positions(self.decoder_positions, self.decoder_window, self.max_position_offset)
        if not isinstance(self.input_feeding, bool):
            raise ValueError(f"input_feeding must be True or False (got {self.input_feeding!r}).")
        for name, what in (("controller_truncation", "cuts the Controller's gradient"),
                           ("controller_reset_rate", "resets the Controller's state")):  # fmt: skip
            if self.input_feeding and getattr(self, name) > 0:
                raise ValueError(
                    f"{name}={getattr(self, name)} {what} within a call, and input_feeding runs the Controller one "
                    f"token a call; set {name}=0 or input_feeding=False."
                )
        if self.eos_decision == "panm" and self.eos_token_id is None:
            raise ValueError(
                'eos_decision="panm" needs eos_token_id (the logit PANM decides): set it on the config or on its '
                "text_config."
            )
        if self.placement in PANM_ONLY_PLACEMENTS and self.panm_drop_path > 0:
            # these feed the logits from the Controller alone: a dropped sample would predict from zeros.
            raise ValueError(
                f"panm_drop_path={self.panm_drop_path} needs a backbone path beside PANM's output; with "
                f'placement="{self.placement}" there is none. Use placement="stack" or "residual", or '
                "panm_drop_path=0."
            )

    def validate(self) -> None:
        """PreTrainedConfig's checks (run by `save_pretrained`) and PANM's."""
        super().validate()
        self.validate_panm()

    @property
    def replaces_last_decoder_layer(self) -> bool:
        """True when `placement` puts the Controller in place of the backbone's last decoder layer."""
        return self.placement in LAYER_REPLACING_PLACEMENTS

    @property
    def memory_config(self) -> PanmMemoryConfig:
        """The PANM hyperparameters alone, as a `PanmMemoryConfig`."""
        return PanmMemoryConfig(**{f.name: getattr(self, f.name) for f in fields(PanmMemoryConfig)})


__all__ = ["CAUSAL_MEMORIES", "EOS_DECISIONS", "PanmConfig"]
