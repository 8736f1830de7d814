"""PanmForCausalLM: PANM's Controller after the last layer of any HF decoder-only LM.

The autoregressive form of PANM (the paper's Dyck model, "masking M so the decoder only
sees tokens up to the current step"):

* memory ``M``: the backbone's last hidden states (after its final norm, what the LM head
  reads) of the tokens so far; slot ``s`` holds token ``s``. Step ``t`` reads only slots
  ``s <= t`` (its own token included), in the Pointer Units' address attention, in Mode 2
  and in ``h^c_0``;
* ``z_t``: the same hidden state of token ``t``, fed to the Controller;
* addresses: slot ``s`` of a sample gets the physical address ``p_B + rank(s)``, its rank
  among the sample's real tokens, so padding is not memory and does not shift addresses.
  PANM runs in that real-token frame: each sample's real tokens are gathered to the front
  (left-aligned), decoded, and scattered back to their positions; padded positions get a
  zero PANM output;
* pointers: unit 0 (base pointer) starts at ``p_B``, the first real token, and moves freely
  (the paper's Pointer Unit). Unit 1 is the end pointer ``p_E``; the end of a causal memory
  moves with every token, so unit 1 restarts from the newest slot (the current token) at
  every step and its attention reads relative to it. Further units start at ``p_B``.
  ``h^c_0`` is computed from the first real slot (all a causal first step may see);
* output: ``h_t + g^o(...)`` into the backbone's own LM head. ``g^o``'s last layer is
  zero-initialised, so a freshly wrapped model returns exactly the backbone's logits
  (``placement="stack"``, the only placement offered here).

Cached decoding (``generate()``) keeps the backbone's KV cache and PANM's state and memory
in one ``PanmDynamicCache``; every cached token costs one PANM step and appends one slot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .backbones import causal_parts, get_path
from .cache_panm import BACKBONE_CACHE_KWARG, PanmDynamicCache, pop_cache_argument
from .configuration_panm import PanmConfig
from .memory import PanmMemory, PanmMemoryOutput
from .modeling_panm import PanmPreTrainedModel


@dataclass
class PanmCausalLMOutputWithPast(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus PANM's attention maps (with `output_attentions=True`).

    Attributes:
        address_attentions: `(batch, steps, H^a, slots)` Mode-1 address attention per input position;
            slots are the sample's real tokens in order (padding removed).
        mode2_attentions: `(batch, steps, H^c, slots)` Mode-2 attention, slots as above.
    """

    address_attentions: torch.FloatTensor | None = None
    mode2_attentions: torch.FloatTensor | None = None


def _gather_steps(values: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """`values[b, index[b, t]]` along axis 1 for any trailing shape; `index (batch, steps)`."""
    if values is None:
        return None
    index = index.reshape(*index.shape, *[1] * (values.dim() - 2)).expand(-1, -1, *values.shape[2:])
    return values.gather(1, index)


class PanmForCausalLM(PanmPreTrainedModel, GenerationMixin):
    """An HF decoder-only LM with PANM's Controller added after its last layer.

    Args:
        config: a `PanmConfig` whose `text_config` is a supported causal LM
            (see `panm_hf.backbones.CAUSAL_BACKBONES`); `placement` must be `"stack"`.
        backbone: an already built `...ForCausalLM` (used by `from_backbone`); built from
            `config.text_config` when None.

    `PanmForCausalLM.from_backbone(model_or_path, **panm_kwargs)` (from `PanmPreTrainedModel`) wraps a
    loaded or saved causal LM; only PANM's weights are new.
    """

    def __init__(self, config: PanmConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        self.parts = causal_parts(config.text_config)
        if config.placement != "stack":
            raise ValueError(
                f"PanmForCausalLM supports placement='stack' only (got placement={config.placement!r}): the "
                "Controller is added after the last layer through a zero-initialised residual."
            )
        if config.recurrence_kernel == "fused":
            raise ValueError(
                'PanmForCausalLM cannot run recurrence_kernel="fused": causal decoding masks every step '
                "differently (step t reads slots <= t only), which the fused kernel does not cover. Use "
                'recurrence_kernel="auto" (fused where it applies) or "eager".'
            )
        if backbone is None:
            backbone = AutoModelForCausalLM.from_config(config.text_config)
        if get_path(backbone, self.parts.lm_head) is None or get_path(backbone, self.parts.body) is None:
            raise ValueError(
                f"The backbone {type(backbone).__name__} has no `{self.parts.body}` and `{self.parts.lm_head}`; "
                "pass the causal LM with its head (e.g. GPT2LMHeadModel, LlamaForCausalLM), not the bare model."
            )
        self.backbone = backbone
        hidden_size = get_path(config.text_config, self.parts.hidden_size)
        self.panm = PanmMemory(config, memory_dim=hidden_size, decoder_input_size=hidden_size, output_size=hidden_size)
        self.post_init()

    def _zero_init_module(self) -> torch.nn.Module:
        # g^o's last layer: zero so that the residual starts at exactly 0.
        return self.panm.controller.output_mlp[-1]

    # -- HF plumbing ---------------------------------------------------------------------------
    @classmethod
    def _load_backbone(cls, path: str | os.PathLike, **kwargs) -> PreTrainedModel:
        """A causal LM (`AutoModelForCausalLM`); an unsupported kind is refused before its weights load."""
        causal_parts(AutoConfig.from_pretrained(path, **kwargs))
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)

    def get_decoder(self):
        return get_path(self.backbone, self.parts.body)

    # -- generation ------------------------------------------------------------------------------
    def _prepare_generation_config(self, generation_config, **kwargs):
        # generate() works on its own copy of the generation config: the prompt's padding count travels on
        # that copy to _validate_generated_length, so concurrent generate() calls never see each other's.
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        mask = model_kwargs.get("attention_mask")
        pads = int((mask == 0).sum(dim=-1).min()) if mask is not None and mask.dim() == 2 and mask.numel() else 0
        generation_config._panm_pad_columns = pads
        return generation_config, model_kwargs

    def _validate_generated_length(self, generation_config, input_ids_length, has_default_max_length):
        """Also check that prompt + new tokens fit in `2^address_bits` slots; padding columns shared by every
        prompt are not memory and do not count. Runs inside generate() once max_length is final and before
        any token is generated."""
        super()._validate_generated_length(generation_config, input_ids_length, has_default_max_length)
        pads = getattr(generation_config, "_panm_pad_columns", 0)
        slots = generation_config.max_length - pads
        if slots > self.panm.max_slots:
            bits = max(1, (slots - 1).bit_length())
            prompt = input_ids_length - pads
            raise ValueError(
                f"generate() would put up to {slots} tokens (the prompt's {prompt} "
                f"plus {generation_config.max_length - input_ids_length} new) in PANM's causal memory, but "
                f"address_bits={self.panm.address_bits} gives only {self.panm.max_slots} addresses; "
                f"{bits} address bits are needed: set PanmConfig.address_bits >= {bits} or generate fewer tokens."
            )

    # -- forward ---------------------------------------------------------------------------------
    def _panm_prefill(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        base_address: torch.Tensor | None,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, PanmMemoryOutput]:
        """PANM over a whole sequence: left-align the real tokens, decode causally, put outputs back."""
        batch_size, length, _ = hidden.shape
        # (batch, length): the positions of each sample's real tokens first (in order), then its padding
        order = torch.argsort((~mask).long(), dim=1, stable=True)
        inverse = torch.argsort(order, dim=1)  # (batch, length): aligned index of every position
        real = int(mask.sum(dim=1).max()) if batch_size else 0
        real = max(real, 1)  # an all-padding batch still decodes one (masked) step
        aligned = _gather_steps(hidden, order[:, :real])  # (batch, real, dim)
        aligned_mask = mask.gather(1, order[:, :real])  # (batch, real), real slots first
        memory = self.panm.bind(aligned, aligned_mask, base_address=base_address)
        positions = torch.arange(real, device=hidden.device).expand(batch_size, -1)  # (batch, real)
        out = self.panm(memory, aligned, causal_positions=positions, output_attentions=output_attentions)
        pad = length - real
        outputs = torch.nn.functional.pad(out.hidden_states, (0, 0, 0, pad))  # (batch, length, dim)
        outputs = _gather_steps(outputs, inverse) * mask.unsqueeze(-1).to(outputs.dtype)  # (batch, length, dim)
        if output_attentions:
            out.address_attentions = _gather_steps(
                torch.nn.functional.pad(out.address_attentions, (0, 0, 0, 0, 0, pad)), inverse
            )  # (batch, length, units, real)
            if out.mode2_attentions is not None:
                out.mode2_attentions = _gather_steps(
                    torch.nn.functional.pad(out.mode2_attentions, (0, 0, 0, 0, 0, pad)), inverse
                )  # (batch, length, heads, real)
        return outputs, out

    def _panm_step(
        self, hidden: torch.Tensor, mask: torch.Tensor, cache: PanmDynamicCache, output_attentions: bool
    ) -> tuple[torch.Tensor, PanmMemoryOutput]:
        """PANM for new tokens after cached ones: append them to the memory, one PANM step each."""
        if not bool(mask.all()):
            raise ValueError(
                "attention_mask marks some of the new tokens of a cached call as padding; PanmForCausalLM pads "
                "on the left only: pad the prompt, and pass only real tokens after it."
            )
        memory, state, positions = self.panm.append(cache.panm_memory, hidden, cache.panm_state)
        out = self.panm(memory, hidden, state=state, causal_positions=positions, output_attentions=output_attentions)
        return out.hidden_states, out

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: PanmDynamicCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        base_address: torch.LongTensor | None = None,
        **kwargs,
    ) -> PanmCausalLMOutputWithPast | tuple:
        r"""Causal LM forward with PANM after the backbone's last layer.

        Args:
            input_ids, inputs_embeds: the tokens (or their embeddings); with a cache, only the new ones.
            attention_mask: `(batch, past + new)`, 0 on padding (left padding for generation); padding
                is neither attended by the backbone nor PANM memory.
            position_ids: passed to the backbone (`generate()` derives them from the mask).
            past_key_values: a `PanmDynamicCache` (a plain `DynamicCache` is upgraded to one) holding
                the backbone's KV cache and PANM's state and memory; also accepted as `cache`, its
                name from transformers 5.24 on.
            labels: `(batch, length)` targets aligned with `input_ids` (shifted inside, as in HF causal
                LMs); `-100` is ignored by the loss.
            base_address: `(batch,)` PANM base addresses; default random in training, 0 in eval.
            output_attentions: also return PANM's address and Mode-2 attention maps.
            output_hidden_states: also return the hidden states; they end with PANM's output added to
                the backbone's last state (what the LM head reads), after the backbone's own.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        past_key_values = pop_cache_argument(past_key_values, kwargs)
        if labels is not None and past_key_values is None:
            use_cache = False
        use_cache = use_cache if use_cache is not None else getattr(self.config.text_config, "use_cache", True)
        extra = self._output_flags(output_attentions, output_hidden_states)

        cache = PanmDynamicCache.from_cache(past_key_values) if use_cache else None
        past_length = cache.get_seq_length() if cache is not None else 0
        body_outputs = self.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{BACKBONE_CACHE_KWARG: cache},
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **extra,
        )
        hidden = body_outputs.last_hidden_state  # (batch, new, dim): memory slots and z_t alike
        batch_size, new_length, _ = hidden.shape
        if attention_mask is not None:
            mask = attention_mask[:, -new_length:].bool()  # (batch, new)
        else:
            mask = torch.ones(batch_size, new_length, dtype=torch.bool, device=hidden.device)

        if cache is not None and cache.panm_state is not None:
            if cache.panm_steps != past_length:
                raise ValueError(
                    f"past_key_values holds {past_length} cached tokens but PANM state for {cache.panm_steps}; "
                    "pass the PanmDynamicCache returned by this model."
                )
            panm_hidden, panm_output = self._panm_step(hidden, mask, cache, bool(output_attentions))
        else:
            if past_length:
                raise ValueError(
                    f"past_key_values holds {past_length} cached tokens but no PANM state; pass the "
                    "PanmDynamicCache returned by this model (not a backbone-only cache)."
                )
            panm_hidden, panm_output = self._panm_prefill(hidden, mask, base_address, bool(output_attentions))
        if cache is not None:
            cache.panm_state, cache.panm_memory = panm_output.state, panm_output.memory
            cache.panm_steps = past_length + new_length

        head_input = hidden + panm_hidden.to(hidden.dtype)  # (batch, new, dim): what the LM head reads
        logits = get_path(self.backbone, self.parts.lm_head)(head_input)  # (batch, new, vocab)
        hidden_states = getattr(body_outputs, "hidden_states", None)
        if hidden_states is not None:  # PANM is the last layer: what the LM head reads comes last
            hidden_states = (*hidden_states, head_input)

        loss = None
        if labels is not None:
            shift_logits = logits[:, :-1].float()  # (batch, new - 1, vocab): token t predicts t + 1
            shift_labels = labels[:, 1:].to(logits.device)  # (batch, new - 1)
            loss = torch.nn.functional.cross_entropy(
                shift_logits.flatten(0, 1), shift_labels.flatten(), ignore_index=-100
            )

        output = PanmCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **{BACKBONE_CACHE_KWARG: cache},
            hidden_states=hidden_states,
            attentions=getattr(body_outputs, "attentions", None),
            address_attentions=panm_output.address_attentions,
            mode2_attentions=panm_output.mode2_attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = ["PanmCausalLMOutputWithPast", "PanmForCausalLM"]
