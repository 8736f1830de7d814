"""PanmForSeq2SeqLM: PANM's Controller as the last decoder layer of any HF encoder-decoder.

Memory ``M`` = the backbone encoder's last hidden states; ``z_t`` = the backbone
decoder's hidden states. With ``placement="stack"`` the Controller's output is
added to ``z_t`` through a zero-initialised projection (``g^o``'s last layer), so a
freshly wrapped pretrained backbone returns exactly the backbone's logits; with
``placement="replace"`` the backbone's last decoder layer is removed and the
Controller's output takes its place (the paper's setup); ``placement="top"`` keeps every
decoder layer and the LM head reads the Controller's output alone. Either way the result is
read out through the backbone's own LM head (tied embeddings and
``final_logits_bias`` keep working).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModelForSeq2SeqLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from panm_hf.kernels import copy_for_remote_code

from .adapter import from_panm as _from_panm
from .adapter import save_panm as _save_panm
from .backbones import check_seq2seq_backbone, get_path, seq2seq_parts, without_last_layer
from .cache_panm import BACKBONE_CACHE_KWARG, PanmCache, pop_cache_argument
from .configuration_panm import PanmConfig
from .decoder_positions import DEFAULTS as DECODER_DEFAULTS
from .decoder_positions import apply as apply_decoder_positions
from .input_feeding import InputFeed, fed_decode
from .memory import PanmMemory, PanmMemoryOutput
from .state import PanmState


@dataclass
class PanmSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus PANM's attention maps (with `output_attentions=True`).

    Attributes:
        address_attentions: `(batch, steps, H^a, src_len)` Mode-1 address attention per decoding step.
        mode2_attentions: `(batch, steps, H^c, src_len)` Mode-2 attention per decoding step.
        content_attentions: `(batch, steps, src_len)` the content read's attention per decoding step
            (`content_read="decoder"` or `"controller"`; None without one).
    """

    address_attentions: torch.FloatTensor | None = None
    mode2_attentions: torch.FloatTensor | None = None
    content_attentions: torch.FloatTensor | None = None


# from_pretrained arguments that say where a config lives (passed on when peeking at a folder's model_type).
_CONFIG_LOCATION_KWARGS = (
    "cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "subfolder",
)  # fmt: skip


class PanmPreTrainedModel(PreTrainedModel):
    """What every PANM adapter shares: loading and wrapping a backbone, embeddings, weight init.

    An adapter's `__init__(config, backbone=None)` sets `self.backbone` (built from
    `config.text_config` when None) and `self.panm`; it overrides `_load_backbone` (which Auto
    class loads a folder) and, when a loaded model is more than the backbone, `_wrap`.
    """

    config_class = PanmConfig
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    # The loss is already averaged over tokens: Trainer must not pass num_items_in_batch and rescale it.
    accepts_loss_kwargs = False
    # Whether the head reads `config.eos_decision` (the seq2seq and causal LMs); the QA head accepts "shared" only.
    reads_eos_decision = False
    takes_decoder_signal = False  # decoder_positions and decoder_window: PanmForSeq2SeqLM sets it
    takes_input_feeding = False  # input_feeding: PanmForSeq2SeqLM sets it

    def __init__(self, config: PanmConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        if config.eos_decision != "shared" and not self.reads_eos_decision:
            raise ValueError(
                f'{type(self).__name__} accepts eos_decision="shared" only (got {config.eos_decision!r}): PANM '
                "deciding the end-of-sequence logit is an option of PanmForSeq2SeqLM and PanmForCausalLM."
            )
        if config.input_feeding and not self.takes_input_feeding:
            raise ValueError(
                f"{type(self).__name__} has no decoder input to feed (got input_feeding=True): input_feeding is an "
                "option of PanmForSeq2SeqLM; leave it False."
            )
        signal = (config.decoder_positions, config.decoder_window)
        plain = (DECODER_DEFAULTS["decoder_positions"], DECODER_DEFAULTS["decoder_window"])
        if signal != plain and not self.takes_decoder_signal:
            raise ValueError(
                f"{type(self).__name__} keeps its backbone's positions (got decoder_positions={signal[0]!r}, "
                f"decoder_window={signal[1]}): decoder_positions and decoder_window are options of "
                "PanmForSeq2SeqLM; leave them at 'absolute' and 0."
            )

    def _lm_head_rows(self, states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """The backbone's LM head applied with only the rows of `token_ids`: `(..., dim)` -> `(..., tokens)`."""
        head = get_path(self.backbone, self.parts.lm_head)
        bias = head.bias.index_select(0, token_ids) if head.bias is not None else None
        return nn.functional.linear(states, head.weight.index_select(0, token_ids), bias)

    def _eos_token_ids(self, device: torch.device) -> torch.Tensor:
        """`config.eos_token_id` as a `(num_eos,)` tensor: the logits `eos_decision="panm"` takes from PANM."""
        eos = self.config.eos_token_id
        return torch.as_tensor(eos if isinstance(eos, list) else [eos], device=device)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained` for a saved PANM model.

        A folder whose config is not `model_type="panm"` (a plain BART or BERT checkpoint) gets a
        ValueError pointing to `from_backbone`, instead of a default-size model that fails on every
        weight. With an explicit `config=PanmConfig(...)` any folder is loaded as usual.
        """
        if kwargs.get("config") is None and pretrained_model_name_or_path is not None:
            location = {name: kwargs[name] for name in _CONFIG_LOCATION_KWARGS if name in kwargs}
            config_dict, _ = PreTrainedConfig.get_config_dict(pretrained_model_name_or_path, **location)
            model_type = config_dict.get("model_type")
            if model_type != cls.config_class.model_type:
                raise ValueError(
                    f"{os.fspath(pretrained_model_name_or_path)!r} holds a model_type={model_type!r} checkpoint, "
                    f"not a saved PANM model (model_type='panm'). Wrap it with "
                    f"{cls.__name__}.from_backbone({os.fspath(pretrained_model_name_or_path)!r}, ...) instead."
                )
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded)._after_load()  # a tuple with output_loading_info
        return loaded

    def _after_load(self) -> None:
        """What the loaded weights undo of `__init__` (nothing here)."""

    def _take_name_or_path(self, backbone: PreTrainedModel, path: str | os.PathLike | None) -> None:
        # PEFT records `name_or_path` as the base model of an adapter; a wrapped model starts with the backbone's.
        name_or_path = os.fspath(path) if path is not None else getattr(backbone, "name_or_path", "")
        if name_or_path:
            self.config.name_or_path = name_or_path
            self.name_or_path = self.config.name_or_path

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the backbone's token embeddings (and LM head), and every `vocab_size` that describes them.

        The backbone's own `resize_token_embeddings` does the work (so BART-family backbones resize
        `final_logits_bias` too); an `EncoderDecoderModel` backbone resizes its encoder and decoder.
        Afterwards `config.vocab_size` and `config.text_config.vocab_size` (for bert2bert, the
        encoder's and decoder's) hold the new size, so a saved model reloads with it.

        Args: as `PreTrainedModel.resize_token_embeddings`.

        Returns:
            The backbone's (encoder's) input embeddings.
        """
        for path in self._vocab_models():
            get_path(self.backbone, path).resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        embeddings = self.get_input_embeddings()
        vocab_size = embeddings.weight.shape[0]
        for path in self._vocab_models():
            get_path(self.config.text_config, path).vocab_size = vocab_size
        self.config.vocab_size = vocab_size
        return embeddings

    def _vocab_models(self) -> tuple[str, ...]:
        # Paths, from `backbone`, of the PreTrainedModels whose resize_token_embeddings resizes the vocabulary.
        return ("",)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # Backbones are PreTrainedModels and get their own init (or keep their loaded
        # weights); only PANM's modules reach this method.
        if isinstance(module, PanmMemory):
            return
        if hasattr(module, "reset_parameters") and not isinstance(module, PreTrainedModel):
            module.reset_parameters()
        if module is self._zero_init_module():
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    def _zero_init_module(self) -> nn.Module | None:
        """A linear layer `_init_weights` zeroes so that PANM starts as a no-op (None: none)."""
        return None

    @classmethod
    def _load_backbone(cls, path: str | os.PathLike, **kwargs) -> PreTrainedModel:
        """Load the backbone from a local folder or Hub id (`kwargs` go to `from_pretrained`)."""
        raise NotImplementedError(f"{cls.__name__} cannot load a backbone from {path!r}; pass a loaded model.")

    @classmethod
    def _wrap(cls, backbone: PreTrainedModel, config: PanmConfig) -> PanmPreTrainedModel:
        """Build the model around a loaded backbone (an adapter may take parts of it, e.g. a span head)."""
        return cls(config, backbone=backbone)

    @classmethod
    def from_backbone(
        cls,
        backbone: PreTrainedModel | str | os.PathLike,
        *,
        backbone_kwargs: dict | None = None,
        **panm_kwargs,
    ) -> PanmPreTrainedModel:
        """Wrap a pretrained backbone with a freshly initialised PANM.

        Args:
            backbone: a loaded model, or a local folder / Hub id (loaded by `_load_backbone`).
            backbone_kwargs: extra arguments for that `from_pretrained` call (`dtype`, `revision`, ...).
            **panm_kwargs: `PanmConfig` fields (`address_bits`, `placement`, `scoring`, ...).

        The backbone's weights are kept as loaded; only PANM's are initialised. The model is
        moved to the backbone's device, PANM's modules take the backbone's dtype, and a generating
        model takes a copy of the backbone's `generation_config` (beams, penalties, ...).
        A model of the wrong kind (no LM head, encoder for decoder, ...) gets a ValueError naming it.
        """
        path = backbone if isinstance(backbone, (str, os.PathLike)) else None
        if path is not None:
            backbone = cls._load_backbone(path, **(backbone_kwargs or {}))
        if not isinstance(backbone, PreTrainedModel):
            raise TypeError(
                f"backbone must be a transformers PreTrainedModel or a path; got {type(backbone).__name__}."
            )
        cls._check_backbone(backbone)
        config = cls.config_class(text_config=backbone.config.to_dict(), **panm_kwargs)
        model = cls._wrap(backbone, config)
        model._take_name_or_path(backbone, path)
        model._take_backbone_dtype()
        if model.can_generate() and getattr(backbone, "generation_config", None) is not None:
            model.generation_config = copy.deepcopy(backbone.generation_config)
        return model.to(backbone.device)

    @classmethod
    def _check_backbone(cls, backbone: PreTrainedModel) -> None:
        """ValueError naming `backbone` when this adapter cannot wrap its kind (checked before wrapping)."""

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`; the copied modeling code (remote code) also gets the kernels."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if self.is_remote_code():
            copy_for_remote_code(save_directory)
        return result

    def save_panm(self, save_directory: str | os.PathLike, *, base_model_name_or_path: str | None = None) -> None:
        """Save PANM's own weights and config, not the backbone's (as a PEFT adapter), for `from_panm`.

        Writes `panm_config.json` (PANM's hyperparameters, `placement`, the model class and the base
        model's name or path) and `panm_model.safetensors` (the weights outside `backbone.`: `panm.*`,
        plus `output_norm.*` for `placement="residual"` or `qa_outputs.*` for QA). The backbone must
        still hold the base's weights (train PANM alone, or save a fine-tuned backbone with
        `save_pretrained` or PEFT); with `placement="replace"` the base keeps its last decoder layer.

        Args:
            save_directory: the folder to write (created if needed); push it to the Hub as any folder.
            base_model_name_or_path: the base to record; defaults to `config.name_or_path`, which
                `from_backbone` sets from the backbone's path.

        Example:

        ```python
        model = PanmForSeq2SeqLM.from_backbone("facebook/bart-base", address_bits=8)
        ...  # train PANM
        model.save_panm("bart-base-panm")  # a few MB: PANM only
        model = PanmForSeq2SeqLM.from_panm("bart-base-panm")  # loads facebook/bart-base, then PANM
        ```
        """
        _save_panm(self, save_directory, base_model_name_or_path)

    @classmethod
    def from_panm(
        cls,
        panm_name_or_path: str | os.PathLike,
        backbone: PreTrainedModel | str | os.PathLike | None = None,
        **backbone_kwargs,
    ) -> PanmPreTrainedModel:
        """Wrap a base model with PANM weights saved by `save_panm`.

        Args:
            panm_name_or_path: the folder `save_panm` wrote, or a Hub repo id holding its files.
            backbone: the base to wrap: a loaded model, or a local folder / Hub id (loaded by
                `_load_backbone`); default the base recorded in `panm_config.json`. Any base of
                the same shapes works (e.g. the recorded one in another dtype).
            **backbone_kwargs: arguments for the base's `from_pretrained` (`dtype`, `revision`, ...);
                `cache_dir`, `token`, `local_files_only`, `force_download`, `proxies` also fetch the
                PANM files.

        Returns:
            The wrapped model in eval mode. PANM's weights are loaded strictly: a missing or unexpected
            key, a shape the base does not fit (another hidden size) or a base that cannot be found
            raises a ValueError naming it and the fix.

        Example:

        ```python
        model = PanmForSeq2SeqLM.from_panm("bart-base-panm")
        base = AutoModelForSeq2SeqLM.from_pretrained("facebook/bart-base", dtype=torch.bfloat16)
        model = PanmForSeq2SeqLM.from_panm("bart-base-panm", backbone=base)
        ```
        """
        return _from_panm(cls, panm_name_or_path, backbone, backbone_kwargs)

    def _take_backbone_dtype(self) -> None:
        # PANM's modules are built in the default dtype; a bf16/fp16 backbone would meet float32 weights.
        dtype = self.backbone.dtype
        for name, module in self.named_children():
            if name != "backbone":
                module.to(dtype)

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.backbone.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        return self.backbone.get_output_embeddings()

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.backbone.set_output_embeddings(value)

    @staticmethod
    def _output_flags(output_attentions: bool | None, output_hidden_states: bool | None) -> dict:
        """The backbone's `output_attentions` / `output_hidden_states`, passed only when set."""
        flags = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
        return {name: True for name, value in flags.items() if value}


class PanmForSeq2SeqLM(PanmPreTrainedModel, GenerationMixin):
    """An HF encoder-decoder with PANM plugged in as its last decoder layer.

    Args:
        config: a `PanmConfig` whose `text_config` is a supported encoder-decoder backbone
            (see `panm_hf.backbones.SEQ2SEQ_BACKBONES`).
        backbone: an already built backbone (used by `from_backbone`); built from
            `config.text_config` when None.
    """

    reads_eos_decision = True
    takes_decoder_signal = True  # decoder_positions, decoder_window
    takes_input_feeding = True

    def __init__(self, config: PanmConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        self.parts = seq2seq_parts(config.text_config)
        built_here = backbone is None
        if built_here:
            backbone = AutoModelForSeq2SeqLM.from_config(config.text_config)
        if config.replaces_last_decoder_layer:
            layers = get_path(backbone, self.parts.decoder_layers)
            if len(layers) < 2:
                raise ValueError(
                    f"placement={config.placement!r} removes the backbone's last decoder layer, but it has "
                    f"{len(layers)}; use placement='stack' or a backbone with at least 2 decoder layers."
                )
            if built_here:
                del layers[-1]
            else:  # a caller's backbone keeps all its layers; the wrapper shares their weights
                backbone = without_last_layer(backbone, self.parts.decoder_layers)
        self.backbone = backbone
        decoder_dim = get_path(config.text_config, self.parts.decoder_dim)
        self.panm = PanmMemory(
            config,
            memory_dim=get_path(config.text_config, self.parts.memory_dim),
            decoder_input_size=decoder_dim,
            output_size=decoder_dim,
            undecoded_output=config.eos_decision == "panm",  # the stop decision without g^o's z_t columns
        )
        # placement="residual": the Controller's output joins z_t as a post-LN Transformer sublayer.
        self.output_norm = nn.LayerNorm(decoder_dim) if config.placement == "residual" else None
        # input_feeding: h^c_{t-1} into the decoder's input at step t (input_feeding.py), zero at first
        self.input_feed = InputFeed(config.controller_hidden_size, decoder_dim) if config.input_feeding else None
        self.post_init()
        self._after_load()  # after post_init, which would initialise zeroed positions again

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if self.input_feed is not None and module is self.input_feed.projection:  # the feed starts at zero
            nn.init.zeros_(module.weight)

    def _zero_init_module(self) -> nn.Module | None:
        # g^o's last layer: zero in "stack" placement so the residual starts at exactly 0.
        return self.panm.controller.output_mlp[-1] if self.config.placement == "stack" else None

    # -- HF plumbing ---------------------------------------------------------------------------
    @classmethod
    def _check_backbone(cls, backbone: PreTrainedModel) -> None:
        """A supported encoder-decoder with its LM head (`BartForConditionalGeneration`, not `BartModel`)."""
        check_seq2seq_backbone(backbone)

    def _after_load(self) -> None:
        # the decoder settings (`PanmConfig.decoder_positions`, `decoder_window`), when built and again when loaded:
        # Marian's sinusoidal positions are not saved, so loading computes them again over the zeros of "none"
        config = self.config
        apply_decoder_positions(self, config.decoder_positions, config.max_position_offset, config.decoder_window)

    @classmethod
    def _load_backbone(cls, path: str | os.PathLike, **kwargs) -> PreTrainedModel:
        """An encoder-decoder (`AutoModelForSeq2SeqLM`); `placement="replace"` drops its last decoder layer."""
        return AutoModelForSeq2SeqLM.from_pretrained(path, **kwargs)

    def get_encoder(self, modality: str | None = None):
        return get_path(self.backbone, self.parts.encoder)

    def get_decoder(self):
        return get_path(self.backbone, self.parts.decoder)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return self.backbone.prepare_decoder_input_ids_from_labels(labels=labels)

    def _vocab_models(self) -> tuple[str, ...]:
        return self.parts.vocab_models

    # -- forward ---------------------------------------------------------------------------------
    def _logits(self, decoder_states: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head's logits `(batch, tgt_len, vocab)`, or only those of `token_ids` `(batch, tgt_len, tokens)`."""
        if self.parts.output_scale is not None:
            decoder_states = decoder_states * self.parts.output_scale(self.config.text_config)
        bias = get_path(self.backbone, self.parts.final_logits_bias)  # (1, vocab) where the backbone has one
        if token_ids is None:
            logits = get_path(self.backbone, self.parts.lm_head)(decoder_states)
        else:  # the head's rows for these tokens only
            logits = self._lm_head_rows(decoder_states, token_ids)
            bias = bias.to(logits.device).index_select(-1, token_ids) if bias is not None else None
        return logits + bias.to(logits.device) if bias is not None else logits

    def _panm_eos_logits(self, logits: torch.Tensor, panm_output: PanmMemoryOutput) -> torch.Tensor:
        """`logits` with the end-of-sequence ones taken from PANM's output alone, before drop-path
        (`eos_decision="panm"`): the LM head's EOS rows applied to the Controller's output (without `g^o`'s `z_t`
        columns when it reads them, `output_decoder_input`)."""
        states = panm_output.stop_states(panm_output.hidden_states)  # (batch, tgt_len, decoder_dim)
        eos_ids = self._eos_token_ids(logits.device)  # (num_eos,)
        eos_logits = self._logits(states.to(logits.dtype), eos_ids)  # (batch, tgt_len, num_eos)
        return logits.index_copy(-1, eos_ids, eos_logits)  # (batch, tgt_len, vocab)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: PanmCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        base_address: torch.LongTensor | None = None,
        **kwargs,
    ) -> PanmSeq2SeqLMOutput | tuple:
        r"""Seq2seq forward with PANM as the last decoder layer.

        Args:
            input_ids, attention_mask: source tokens and mask; the mask also masks PANM's memory.
            decoder_input_ids, decoder_attention_mask: target-side inputs; when omitted, derived from
                `labels` by the backbone's own shift, or without labels from `input_ids` where the
                backbone's own forward does so (BART, mBART); other backbones ask for them.
            encoder_outputs: precomputed encoder outputs (as `generate()` passes them).
            past_key_values: a `PanmCache` (any backbone cache is upgraded to one) holding the
                backbone's KV cache and PANM's state for incremental decoding; also accepted as
                `cache`, its name from transformers 5.24 on.
            labels: target tokens; `-100` is ignored by the loss.
            base_address: `(batch,)` PANM base addresses; default random in training, 0 in eval.
            output_attentions: also return PANM's address, Mode-2 and content-read attention maps.
            output_hidden_states: also return the hidden states; `decoder_hidden_states` ends with
                PANM's output (what the LM head reads), after the backbone decoder's own.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None:
            use_cache = False
        decoder_input_ids = self._decoder_input_ids(input_ids, decoder_input_ids, decoder_inputs_embeds, labels)
        use_cache = use_cache if use_cache is not None else getattr(self.config.text_config, "use_cache", True)
        extra = self._output_flags(output_attentions, output_hidden_states)
        encoder_outputs = self._encode(input_ids, attention_mask, inputs_embeds, encoder_outputs, extra)
        memory_states = encoder_outputs.last_hidden_state  # (batch, src_len, memory_dim)
        projection = get_path(self.backbone, self.parts.encoder_to_decoder)
        cross_states = projection(memory_states) if projection is not None else memory_states

        past_key_values = pop_cache_argument(past_key_values, kwargs)
        cache = PanmCache.from_cache(past_key_values) if use_cache else None
        if self.input_feed is not None:  # the decoder one token at a time, h^c_{t-1} in its input
            decoder_states, decoder_outputs, panm_output = fed_decode(
                self, decoder_input_ids, decoder_inputs_embeds, decoder_attention_mask, cross_states, memory_states,
                attention_mask, cache, base_address, output_attentions, extra,
            )  # fmt: skip
        else:
            past_length = cache.get_seq_length() if cache is not None else 0
            decoder_outputs = self.get_decoder()(
                input_ids=decoder_input_ids,
                attention_mask=decoder_attention_mask,
                encoder_hidden_states=cross_states,
                encoder_attention_mask=attention_mask,
                inputs_embeds=decoder_inputs_embeds,
                **{BACKBONE_CACHE_KWARG: cache},
                use_cache=use_cache,
                **extra,
            )
            decoder_states = decoder_outputs.last_hidden_state  # (batch, tgt_len, decoder_dim) = z_t
            panm_output = self._panm(
                memory_states, attention_mask, decoder_states, cache, past_length, base_address, output_attentions
            )
        hidden = self._combine(decoder_states, panm_output.hidden_states)  # (batch, tgt_len, decoder_dim)
        output = self._output(hidden, labels, cache, encoder_outputs, decoder_outputs, panm_output)
        return output if return_dict else output.to_tuple()

    def _output(
        self,
        hidden: torch.Tensor,
        labels: torch.LongTensor | None,
        cache: PanmCache | None,
        encoder_outputs: BaseModelOutput,
        decoder_outputs,
        panm_output: PanmMemoryOutput,
    ) -> PanmSeq2SeqLMOutput:
        """Logits, the loss against `labels` (`-100` ignored) and the outputs of every part."""
        logits = self._logits(hidden)  # (batch, tgt_len, vocab)
        if self.config.eos_decision == "panm":
            logits = self._panm_eos_logits(logits, panm_output)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.float().flatten(0, 1), labels.to(logits.device).flatten(), ignore_index=-100
            )
        decoder_hidden_states = getattr(decoder_outputs, "hidden_states", None)
        if decoder_hidden_states is not None:  # PANM is the last decoder layer: what the LM head reads comes last
            decoder_hidden_states = (*decoder_hidden_states, hidden)
        return PanmSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{BACKBONE_CACHE_KWARG: cache},
            decoder_hidden_states=decoder_hidden_states,
            decoder_attentions=getattr(decoder_outputs, "attentions", None),
            cross_attentions=getattr(decoder_outputs, "cross_attentions", None),
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            address_attentions=panm_output.address_attentions,
            mode2_attentions=panm_output.mode2_attentions,
            content_attentions=panm_output.content_attentions,
        )

    def _decoder_input_ids(
        self,
        input_ids: torch.LongTensor | None,
        decoder_input_ids: torch.LongTensor | None,
        decoder_inputs_embeds: torch.Tensor | None,
        labels: torch.LongTensor | None,
    ) -> torch.LongTensor | None:
        """The given decoder inputs; else `labels` shifted right; else what the backbone's own forward derives
        from `input_ids` (BART: the source shifted right); a ValueError where it derives none."""
        if decoder_input_ids is not None or decoder_inputs_embeds is not None:
            return decoder_input_ids
        if labels is not None:
            return self.prepare_decoder_input_ids_from_labels(labels)
        from_source = self.parts.decoder_inputs_from_source
        if from_source is None or input_ids is None:
            reason = (
                "input_ids is None" if from_source is not None
                else f"a {self.config.text_config.model_type!r} backbone makes none from input_ids"
            )  # fmt: skip
            raise ValueError(
                f"PanmForSeq2SeqLM got no decoder inputs and {reason}: pass decoder_input_ids (or "
                "decoder_inputs_embeds), or labels to derive them from."
            )
        return from_source(input_ids, self.config.text_config)

    def _encode(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        encoder_outputs: tuple | BaseModelOutput | None,
        extra: dict,
    ) -> BaseModelOutput:
        """The backbone encoder's outputs: run here, or the given ones (a tuple is wrapped)."""
        if encoder_outputs is None:
            return self.get_encoder()(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **extra
            )
        if isinstance(encoder_outputs, BaseModelOutput):
            return encoder_outputs
        return BaseModelOutput(
            last_hidden_state=encoder_outputs[0],
            hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
            attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
        )

    def _panm(
        self,
        memory_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        decoder_states: torch.Tensor,
        cache: PanmCache | None,
        past_length: int,
        base_address: torch.LongTensor | None,
        output_attentions: bool | None,
    ) -> PanmMemoryOutput:
        """PANM over the decoder states, continuing from (and updating) the cache's state when there is one."""
        state: PanmState | None = None
        memory = None
        if cache is not None:
            fix = "pass the PanmCache returned by this model (not a backbone-only cache)."
            state, memory = cache.panm_resume(past_length, fix)
        if memory is None:
            memory = self.panm.bind(memory_states, attention_mask, base_address=base_address)
        panm_output = self.panm(memory, decoder_states, state=state, output_attentions=bool(output_attentions))
        if cache is not None:
            cache.panm_store(panm_output.state, panm_output.memory, past_length, decoder_states.shape[1])
        return panm_output

    def _combine(self, decoder_states: torch.Tensor, panm_states: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: z_t plus PANM's output ("stack"), its post-LN sum ("residual"), or PANM's alone
        ("replace", "top")."""
        if self.config.placement == "stack":
            return decoder_states + panm_states.to(decoder_states.dtype)
        if self.config.placement == "residual":
            return self.output_norm(decoder_states + panm_states.to(decoder_states.dtype))
        return panm_states


__all__ = ["PanmForSeq2SeqLM", "PanmPreTrainedModel", "PanmSeq2SeqLMOutput"]
