"""Where each supported backbone keeps its parts: data, not ``if`` chains.

Every entry names, as attribute paths from the backbone's ``...ForConditionalGeneration``
(or ``EncoderDecoderModel``) instance, the encoder, the decoder stack, the decoder's
layer list, the LM head and optional extras. Adding a backbone is adding a row.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import torch
from torch import nn
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)
from transformers.models.bart.modeling_bart import shift_tokens_right as _bart_shift_tokens_right
from transformers.models.mbart.modeling_mbart import shift_tokens_right as _mbart_shift_tokens_right


def _t5_output_scale(config: Any) -> float:
    # T5 rescales the decoder output before a tied LM head (modeling_t5: scale_decoder_outputs).
    scale = getattr(config, "scale_decoder_outputs", getattr(config, "tie_word_embeddings", False))
    return config.d_model**-0.5 if scale else 1.0


def _bart_decoder_inputs(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    # BartModel.forward: without decoder inputs, the source shifted right behind decoder_start_token_id.
    return _bart_shift_tokens_right(input_ids, config.pad_token_id, config.decoder_start_token_id)


def _mbart_decoder_inputs(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    # MBartModel.forward: the source shifted right, its last real token (the language code) moved to the front.
    return _mbart_shift_tokens_right(input_ids, config.pad_token_id)


@dataclass(frozen=True)
class Seq2SeqBackboneParts:
    """Attribute paths of one seq2seq backbone family.

    Attributes:
        encoder: the encoder stack.
        decoder: the decoder stack (called with `encoder_hidden_states`).
        decoder_layers: the decoder's `nn.ModuleList` of layers (`placement="replace"` drops the last).
        lm_head: the module mapping decoder states to vocabulary logits.
        final_logits_bias: buffer added to the logits, if the family has one.
        memory_dim: config attribute (dotted) with the encoder output size.
        decoder_dim: config attribute (dotted) with the decoder state size.
        encoder_to_decoder: projection applied to encoder outputs before cross-attention, if any.
        output_scale: factor applied to decoder states before the LM head, from the config.
        vocab_models: the `PreTrainedModel`s whose `resize_token_embeddings` resizes the vocabulary
            ("" is the backbone itself; `EncoderDecoderModel` resizes its encoder and decoder).
        decoder_inputs_from_source: `(input_ids, config) -> decoder_input_ids`, what the backbone's own
            forward uses when it gets neither decoder inputs nor labels; None where it asks for them.
    """

    encoder: str
    decoder: str
    decoder_layers: str
    lm_head: str
    final_logits_bias: str | None = None
    memory_dim: str = "d_model"
    decoder_dim: str = "d_model"
    encoder_to_decoder: str | None = None
    output_scale: Callable[[Any], float] | None = None
    vocab_models: tuple[str, ...] = ("",)
    decoder_inputs_from_source: Callable[[torch.Tensor, Any], torch.Tensor] | None = None

    @property
    def required(self) -> tuple[str, ...]:
        """The paths a backbone must have for the adapter to run."""
        return (self.encoder, self.decoder, self.decoder_layers, self.lm_head)


_BART_LIKE = Seq2SeqBackboneParts(
    encoder="model.encoder",
    decoder="model.decoder",
    decoder_layers="model.decoder.layers",
    lm_head="lm_head",
    final_logits_bias="final_logits_bias",
)
_T5_LIKE = Seq2SeqBackboneParts(
    encoder="encoder",
    decoder="decoder",
    decoder_layers="decoder.block",
    lm_head="lm_head",
    output_scale=_t5_output_scale,
)

SEQ2SEQ_BACKBONES: dict[str, Seq2SeqBackboneParts] = {
    "bart": replace(_BART_LIKE, decoder_inputs_from_source=_bart_decoder_inputs),
    "mbart": replace(_BART_LIKE, decoder_inputs_from_source=_mbart_decoder_inputs),
    "marian": _BART_LIKE,
    "pegasus": _BART_LIKE,
    "t5": _T5_LIKE,
    "mt5": _T5_LIKE,
    "encoder-decoder": Seq2SeqBackboneParts(
        encoder="encoder",
        decoder="decoder.bert",
        decoder_layers="decoder.bert.encoder.layer",
        lm_head="decoder.cls",
        memory_dim="encoder.hidden_size",
        decoder_dim="decoder.hidden_size",
        encoder_to_decoder="enc_to_dec_proj",
        vocab_models=("encoder", "decoder"),
    ),
}


def seq2seq_parts(config: Any) -> Seq2SeqBackboneParts:
    """The table row for a backbone config; ValueError naming `text_config` if unsupported."""
    model_type = getattr(config, "model_type", None)
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"text_config must be an encoder-decoder backbone for PanmForSeq2SeqLM; got "
            f"model_type={model_type!r}. Supported: {sorted(SEQ2SEQ_BACKBONES)} (for an encoder such as BERT "
            "use BertWithPanmForQuestionAnswering)."
        )
    if model_type not in SEQ2SEQ_BACKBONES:
        raise ValueError(
            f"text_config.model_type={model_type!r} is not supported yet; supported seq2seq backbones: "
            f"{sorted(SEQ2SEQ_BACKBONES)}. Add a row to panm_hf.backbones.SEQ2SEQ_BACKBONES."
        )
    return SEQ2SEQ_BACKBONES[model_type]


def check_seq2seq_backbone(backbone: nn.Module) -> Seq2SeqBackboneParts:
    """The table row for a model passed to `PanmForSeq2SeqLM.from_backbone`; ValueError naming it otherwise.

    The model must be a supported encoder-decoder with its LM head (`BartForConditionalGeneration`,
    `T5ForConditionalGeneration`, an `EncoderDecoderModel` over a decoder with an LM head), not the bare
    `BartModel` or an encoder or decoder alone.
    """
    given = type(backbone).__name__
    model_type = getattr(backbone.config, "model_type", None)
    expected = MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(model_type, "BartForConditionalGeneration")
    try:
        parts = seq2seq_parts(backbone.config)
    except ValueError as error:
        raise ValueError(
            f"PanmForSeq2SeqLM needs an encoder-decoder with an LM head such as BartForConditionalGeneration; "
            f"got {given}. {error}"
        ) from None
    missing = [path for path in parts.required if get_path(backbone, path) is None]
    if missing:
        raise ValueError(
            f"PanmForSeq2SeqLM needs an encoder-decoder with an LM head such as {expected}; got {given}, which "
            f"has no {', '.join(missing)}. Pass the model with its LM head."
        )
    return parts


def get_path(root: Any, path: str | None) -> Any:
    """Follow a dotted attribute path; None for a None path or a missing attribute."""
    if path is None:
        return None
    if path == "":
        return root
    try:
        return attrgetter(path)(root)
    except AttributeError:
        return None


def without_last_layer(root: nn.Module, layers_path: str) -> nn.Module:
    """A copy of `root` whose `nn.ModuleList` at `layers_path` lacks its last module; `root` is not changed.

    The copy's parameters are new `nn.Parameter`s over the same storage as `root`'s (tied ones stay
    tied), and its buffers are `root`'s, so no weight is duplicated in memory and an optimizer step
    on one is seen by the other. Its modules and config are its own, so dropping the layer here, or
    resizing the copy's embeddings later (transformers swaps a parameter's `.data`), leaves `root` whole.
    """
    shared = {id(buffer): buffer for buffer in root.buffers()}
    for parameter in root.parameters():  # tied parameters are one object: listed once, mapped once
        plain = type(parameter) is nn.Parameter  # a subclass (e.g. quantized) is shared as it is
        shared[id(parameter)] = nn.Parameter(parameter.data, parameter.requires_grad) if plain else parameter
    copied = copy.deepcopy(root, memo=shared)
    *parents, layers_name = layers_path.split(".")
    parent = get_path(copied, ".".join(parents))
    setattr(parent, layers_name, nn.ModuleList(list(getattr(parent, layers_name))[:-1]))
    return copied


@dataclass(frozen=True)
class CausalBackboneParts:
    """Attribute paths of one decoder-only (causal LM) backbone family.

    Attributes:
        body: the decoder stack with its final norm (the `...Model` inside `...ForCausalLM`); its
            `last_hidden_state` is what the LM head reads.
        lm_head: the module mapping hidden states to vocabulary logits.
        hidden_size: config attribute (dotted) with the size of those hidden states.
    """

    body: str
    lm_head: str = "lm_head"
    hidden_size: str = "hidden_size"


_LLAMA_LIKE = CausalBackboneParts(body="model")

CAUSAL_BACKBONES: dict[str, CausalBackboneParts] = {
    "gpt2": CausalBackboneParts(body="transformer"),
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gpt_neox": CausalBackboneParts(body="gpt_neox"),
}


def causal_parts(config: Any) -> CausalBackboneParts:
    """The table row for a decoder-only backbone config; ValueError naming the supported kinds otherwise."""
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"PanmForCausalLM wraps a decoder-only causal LM; got the encoder-decoder model_type={model_type!r}. "
            f"Use PanmForSeq2SeqLM for encoder-decoders. Supported causal LMs: {sorted(CAUSAL_BACKBONES)}."
        )
    if model_type not in CAUSAL_BACKBONES:
        raise ValueError(
            f"text_config.model_type={model_type!r} is not a supported causal LM backbone for PanmForCausalLM; "
            f"supported: {sorted(CAUSAL_BACKBONES)} (encoder-decoders: PanmForSeq2SeqLM; BERT-style encoders: "
            "BertWithPanmForQuestionAnswering). Add a row to panm_hf.backbones.CAUSAL_BACKBONES."
        )
    return CAUSAL_BACKBONES[model_type]


def is_decoder_only(config: Any) -> bool:
    """True for a decoder-only (causal) LM kind: a `CAUSAL_BACKBONES` row, or a model type with a causal-LM
    class and no masked-LM one (encoders such as BERT have both)."""
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    has_masked_lm = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return model_type in CAUSAL_BACKBONES or (model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not has_masked_lm)


def check_encoder_backbone(backbone: nn.Module) -> None:
    """ValueError naming the model unless it is an encoder (`BertModel`, ...) or an encoder QA model
    (`BertForQuestionAnswering`, ...), what `BertWithPanmForQuestionAnswering.from_backbone` wraps."""
    given, config = type(backbone).__name__, backbone.config
    expected = "BertWithPanmForQuestionAnswering needs an encoder such as BertModel or BertForQuestionAnswering"
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{expected}; got the encoder-decoder {given} (use PanmForSeq2SeqLM for it).")
    if is_decoder_only(config):
        raise ValueError(
            f"{expected}; got {given}, a decoder-only model of model_type={config.model_type!r} whose states see "
            "only earlier tokens (use PanmForCausalLM for it)."
        )
    if getattr(backbone, "qa_outputs", None) is None and backbone.base_model is not backbone:
        raise ValueError(
            f"{expected}; got {given}, a model with another head. Pass its encoder "
            f"(`model.{backbone.base_model_prefix}`) or a ...ForQuestionAnswering model."
        )
