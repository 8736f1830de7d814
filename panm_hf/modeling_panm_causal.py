"""PanmForCausalLM: PANM's Controller after the last layer of any HF decoder-only LM.

Two framings, chosen by ``PanmConfig.causal_memory``.

``"sequence"`` (the default), the autoregressive form of PANM (the paper's Dyck model, "masking M
so the decoder only sees tokens up to the current step"):

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
  ``h^c_0`` is computed from the first real slot (all a causal first step may see).

``"prompt"``, the seq2seq framing inside one stream (where PANM's copy mechanism works):

* memory ``M``: the backbone's hidden states over the prompt only, bound once to addresses
  ``p_B ..``; in training the prompt is what precedes a row's first supervised label
  (``labels != -100``) or is given by ``prompt_mask`` / ``prompt_lengths``; in ``generate()``
  it is the prompt given;
* decoding steps: the response, from the prompt's last token on (each step predicts the next
  token), with ``z_t`` the step token's hidden state; the pointers start at the prompt's first
  and last tokens (``p_B``, ``p_E``) and move freely, and ``h^c_0`` is computed from the whole
  prompt, exactly as ``PanmForSeq2SeqLM`` starts from the source. Positions before the
  response get the backbone's output alone. Rows with different prompt and response lengths
  are gathered into a left-aligned ``(batch, max_prompt, dim)`` memory and ``(batch,
  max_response, dim)`` steps, and PANM's outputs are scattered back to the rows' positions.

Either way the Pointer Units see addresses only (principle II), and the output is ``h_t +
g^o(...)`` into the backbone's own LM head. ``g^o``'s last layer is zero-initialised, so a
freshly wrapped model returns exactly the backbone's logits (``placement="stack"``, the only
placement offered here).

Cached decoding (``generate()``) keeps the backbone's KV cache and PANM's state and memory in
one ``PanmDynamicCache``; every cached token costs one PANM step (and, with ``"sequence"``,
appends one slot; with ``"prompt"`` the memory stays the prompt bound on the first forward).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .addressing import check_capacity
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
            slots are the memory's tokens in order (padding removed): the sample's real tokens
            (`causal_memory="sequence"`) or its prompt (`"prompt"`, zero at positions before the response).
        mode2_attentions: `(batch, steps, H^c, slots)` Mode-2 attention, slots as above.
        content_attentions: `(batch, steps, slots)` the content read's attention (`content_read="decoder"` or
            `"controller"`; None without one), slots as above.
    """

    address_attentions: torch.FloatTensor | None = None
    mode2_attentions: torch.FloatTensor | None = None
    content_attentions: torch.FloatTensor | None = None


def _gather_steps(values: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """`values[b, index[b, t]]` along axis 1 for any trailing shape; `index (batch, steps)`."""
    if values is None:
        return None
    index = index.reshape(*index.shape, *[1] * (values.dim() - 2)).expand(-1, -1, *values.shape[2:])
    return values.gather(1, index)


def _left_align(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row's selected positions go when gathered to the front, in order.

    `selected (batch, length)` bool -> `(order, aligned_mask)`, both `(batch, width)` with `width` the
    most positions any row selects (at least 1): `order[b, j]` is the position of row `b`'s `j`-th
    selected one, and `aligned_mask[b, j]` is False past the row's own count.
    """
    order = torch.argsort((~selected).long(), dim=1, stable=True)  # (batch, length): selected positions first
    width = max(int(selected.sum(dim=1).max()) if selected.shape[0] else 0, 1)
    order = order[:, :width]  # (batch, width)
    return order, selected.gather(1, order)


def _put_back(values: torch.Tensor | None, order: torch.Tensor, aligned_mask: torch.Tensor, length: int):
    """Undo `_left_align`: `values (batch, width, ...)` go to positions `order` of `(batch, length, ...)`;
    padded entries and every other position hold 0."""
    if values is None:
        return None
    trailing = [1] * (values.dim() - 2)
    keep = aligned_mask.reshape(*aligned_mask.shape, *trailing)  # (batch, width, 1, ...)
    values = torch.where(keep, values, values.new_zeros(()))  # (batch, width, ...)
    index = order.reshape(*order.shape, *trailing).expand_as(values)  # (batch, width, ...)
    return values.new_zeros(values.shape[0], length, *values.shape[2:]).scatter(1, index, values)


def _check_prompt_lengths(prompt_lengths: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """`prompt_lengths` as `(batch,)` long, checked against each row's `real` token count."""
    lengths = torch.as_tensor(prompt_lengths, device=real.device)
    if lengths.shape != real.shape or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"prompt_lengths must be an integer tensor of shape ({real.shape[0]},), the number of real (unpadded) "
            f"prompt tokens per row; got {lengths.dtype} {tuple(lengths.shape)}."
        )
    bad = ((lengths < 1) | (lengths > real)).nonzero()
    if bad.numel():
        row = int(bad[0, 0])
        raise ValueError(
            f"prompt_lengths[{row}]={int(lengths[row])} is out of range: a row's prompt holds at least 1 and at most "
            f"all of its real tokens ({int(real[row])} in row {row}); padding does not count."
        )
    return lengths.long()


def _prompt_lengths_from_mask(prompt_mask: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """The `(batch,)` prompt lengths a `prompt_mask` marks; it must mark a non-empty prefix of the real tokens."""
    if tuple(prompt_mask.shape) != tuple(mask.shape):
        raise ValueError(
            f"prompt_mask must have the shape of the input tokens {tuple(mask.shape)}; got {tuple(prompt_mask.shape)}."
        )
    prompt = prompt_mask.to(mask.device).bool()
    lengths = (prompt & mask).sum(dim=1)  # (batch,)
    expected = mask & (rank < lengths.unsqueeze(1))  # (batch, length): the first `lengths` real tokens
    if not torch.equal(prompt, expected) or bool((lengths < 1).any()):
        raise ValueError(
            "prompt_mask must mark a non-empty prefix of each row's real tokens: 1 on the prompt, 0 on the "
            "response and on padding."
        )
    return lengths


def _prompt_lengths_from_labels(labels: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """`(batch,)` real tokens before each row's first supervised label (all of them when none is)."""
    if tuple(labels.shape) != tuple(mask.shape):
        raise ValueError(
            f"labels must have the shape of the input tokens {tuple(mask.shape)}; got {tuple(labels.shape)}."
        )
    # A row's first real token is never predicted (nothing precedes it), so its label cannot end the prompt.
    supervised = (labels.to(mask.device) != -100) & mask & (rank >= 1)  # (batch, length)
    real = mask.sum(dim=1, keepdim=True)  # (batch, 1)
    return torch.where(supervised, rank, real).amin(dim=1)  # (batch,)


class PanmForCausalLM(PanmPreTrainedModel, GenerationMixin):
    """An HF decoder-only LM with PANM's Controller added after its last layer.

    Args:
        config: a `PanmConfig` whose `text_config` is a supported causal LM
            (see `panm_hf.backbones.CAUSAL_BACKBONES`); `placement` must be `"stack"`;
            `causal_memory` picks the memory (every token so far, or the prompt).
        backbone: an already built `...ForCausalLM` (used by `from_backbone`); built from
            `config.text_config` when None.

    `PanmForCausalLM.from_backbone(model_or_path, **panm_kwargs)` (from `PanmPreTrainedModel`) wraps a
    loaded or saved causal LM; only PANM's weights are new.
    """

    reads_eos_decision = True  # eos_decision="panm": the EOS logit from PANM's output where PANM decodes

    def __init__(self, config: PanmConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        self.parts = causal_parts(config.text_config)
        if config.placement != "stack":
            raise ValueError(
                f"PanmForCausalLM supports placement='stack' only (got placement={config.placement!r}): the "
                "Controller is added after the last layer through a zero-initialised residual."
            )
        if config.recurrence_kernel == "fused" and not self.prompt_memory:
            raise ValueError(
                'PanmForCausalLM cannot run recurrence_kernel="fused" with causal_memory="sequence": causal '
                "decoding masks every step differently (step t reads slots <= t only), which the fused kernel does "
                'not cover. Use recurrence_kernel="auto" (fused where it applies), "eager", or causal_memory="prompt".'
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
        self.panm = PanmMemory(
            config,
            memory_dim=hidden_size,
            decoder_input_size=hidden_size,
            output_size=hidden_size,
            undecoded_output=config.eos_decision == "panm",  # the stop decision without g^o's z_t columns
        )
        self.post_init()

    @property
    def prompt_memory(self) -> bool:
        """True when PANM's memory is the prompt (`causal_memory="prompt"`), not every token so far."""
        return getattr(self.config, "causal_memory", "sequence") == "prompt"

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

    def _prepare_model_inputs(self, inputs=None, bos_token_id=None, model_kwargs=None):
        """With the prompt as memory, also pass `prompt_lengths` (each prompt's real tokens) to every forward:
        without a cache every call sees the whole sequence so far and must know where the prompt ends."""
        inputs_tensor, input_name, model_kwargs = super()._prepare_model_inputs(inputs, bos_token_id, model_kwargs)
        given = model_kwargs.get("prompt_lengths") is not None or model_kwargs.get("prompt_mask") is not None
        if self.prompt_memory and not given:
            mask = model_kwargs.get("attention_mask")
            if mask is not None and mask.dim() == 2 and mask.shape[1] == inputs_tensor.shape[1]:
                model_kwargs["prompt_lengths"] = mask.bool().sum(dim=1)  # (batch,)
            else:
                model_kwargs["prompt_lengths"] = torch.full(
                    (inputs_tensor.shape[0],), inputs_tensor.shape[1], dtype=torch.long, device=inputs_tensor.device
                )  # (batch,)
        return inputs_tensor, input_name, model_kwargs

    def _validate_generated_length(self, generation_config, input_ids_length, has_default_max_length):
        """Also check that PANM's memory fits in `2^address_bits` slots: prompt + new tokens (`"sequence"`) or
        the prompt (`"prompt"`); padding columns shared by every prompt are not memory and do not count. Runs
        inside generate() once max_length is final and before any token is generated."""
        super()._validate_generated_length(generation_config, input_ids_length, has_default_max_length)
        pads = getattr(generation_config, "_panm_pad_columns", 0)
        new_tokens = generation_config.max_length - input_ids_length
        slots = input_ids_length - pads + (0 if self.prompt_memory else new_tokens)
        what = f"the prompt's {input_ids_length - pads}" + ("" if self.prompt_memory else f" plus {new_tokens} new")
        check_capacity(
            slots,
            self.panm.address_bits,
            holds=f"generate() would put up to {slots} tokens ({what}) in PANM's causal memory,",
            fix="{bits} address bits are needed: set PanmConfig.address_bits >= {bits} or generate fewer tokens",
        )

    # -- PANM over the new tokens ----------------------------------------------------------------
    def _panm_prefill(
        self, hidden: torch.Tensor, mask: torch.Tensor, base_address: torch.Tensor | None, output_attentions: bool
    ) -> tuple[torch.Tensor, PanmMemoryOutput]:
        """`"sequence"`: PANM over a whole sequence: left-align the real tokens, decode causally, put outputs back."""
        batch_size, length, _ = hidden.shape
        order, aligned_mask = _left_align(mask)  # (batch, real) each: an all-padding batch decodes one masked step
        aligned = _gather_steps(hidden, order)  # (batch, real, dim)
        memory = self.panm.bind(aligned, aligned_mask, base_address=base_address)
        positions = torch.arange(order.shape[1], device=hidden.device).expand(batch_size, -1)  # (batch, real)
        out = self.panm(memory, aligned, causal_positions=positions, output_attentions=output_attentions)
        out.address_attentions = _put_back(out.address_attentions, order, aligned_mask, length)
        out.mode2_attentions = _put_back(out.mode2_attentions, order, aligned_mask, length)
        out.content_attentions = _put_back(out.content_attentions, order, aligned_mask, length)
        out.undropped_hidden_states = _put_back(out.undropped_hidden_states, order, aligned_mask, length)
        out.undecoded_hidden_states = _put_back(out.undecoded_hidden_states, order, aligned_mask, length)
        return _put_back(out.hidden_states, order, aligned_mask, length), out  # (batch, length, dim)

    def _prompt_prefill(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        prompt_lengths: torch.Tensor,
        base_address: torch.Tensor | None,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, PanmMemoryOutput, torch.Tensor]:
        """`"prompt"`: bind each row's prompt as the memory, decode its response steps, put outputs back; also
        where PANM decodes, `(batch, length)` bool (the prompt's last token on)."""
        length = hidden.shape[1]
        rank = mask.long().cumsum(dim=1) - 1  # (batch, length): each real token's index among its row's
        in_prompt = mask & (rank < prompt_lengths.unsqueeze(1))  # (batch, length)
        is_step = mask & (rank >= prompt_lengths.unsqueeze(1) - 1)  # (batch, length): the prompt's last token on
        prompt_order, memory_mask = _left_align(in_prompt)  # (batch, max_prompt) each
        memory_mask[:, 0] = True  # a row without tokens binds one unused slot (no softmax over nothing)
        memory = self.panm.bind(_gather_steps(hidden, prompt_order), memory_mask, base_address=base_address)
        step_order, step_mask = _left_align(is_step)  # (batch, max_response) each
        steps = _gather_steps(hidden, step_order)  # (batch, max_response, dim): z_t of the response steps
        out = self.panm(memory, steps, output_attentions=output_attentions)
        if not bool(step_mask.all()):  # padded steps ran after the short rows' last one: the end state is not theirs
            out.state = None
        out.address_attentions = _put_back(out.address_attentions, step_order, step_mask, length)
        out.mode2_attentions = _put_back(out.mode2_attentions, step_order, step_mask, length)
        out.content_attentions = _put_back(out.content_attentions, step_order, step_mask, length)
        out.undropped_hidden_states = _put_back(out.undropped_hidden_states, step_order, step_mask, length)
        out.undecoded_hidden_states = _put_back(out.undecoded_hidden_states, step_order, step_mask, length)
        return _put_back(out.hidden_states, step_order, step_mask, length), out, is_step  # (batch, length, ...)

    def _cached_step(
        self, hidden: torch.Tensor, mask: torch.Tensor, cache: PanmDynamicCache, output_attentions: bool
    ) -> tuple[torch.Tensor, PanmMemoryOutput]:
        """New tokens after cached ones, one PANM step each; `"sequence"` also appends them to the memory."""
        if not bool(mask.all()):
            raise ValueError(
                "attention_mask marks some of the new tokens of a cached call as padding; PanmForCausalLM pads "
                "on the left only: pad the prompt, and pass only real tokens after it."
            )
        if self.prompt_memory:
            out = self.panm(cache.panm_memory, hidden, state=cache.panm_state, output_attentions=output_attentions)
            return out.hidden_states, out
        memory, state, positions = self.panm.append(cache.panm_memory, hidden, cache.panm_state)
        out = self.panm(memory, hidden, state=state, causal_positions=positions, output_attentions=output_attentions)
        return out.hidden_states, out

    def _prompt_lengths(self, mask, labels, prompt_mask, prompt_lengths) -> torch.Tensor:
        """`(batch,)` real prompt tokens per row: from `prompt_mask`, `prompt_lengths`, `labels`, else all of them."""
        if prompt_mask is not None and prompt_lengths is not None:
            raise ValueError("Got both prompt_mask and prompt_lengths; pass one of them.")
        rank = mask.long().cumsum(dim=1) - 1  # (batch, length): each real token's index among its row's
        if prompt_mask is not None:
            return _prompt_lengths_from_mask(prompt_mask, mask, rank)
        if prompt_lengths is not None:
            return _check_prompt_lengths(prompt_lengths, mask.sum(dim=1))
        if labels is not None:
            return _prompt_lengths_from_labels(labels, mask, rank)
        return mask.sum(dim=1)

    def _panm(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        cache: PanmDynamicCache | None,
        past_length: int,
        prompt: dict,
        base_address: torch.Tensor | None,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, PanmMemoryOutput]:
        """PANM's output for the new tokens (0 where it adds nothing), continuing from and updating the cache;
        where PANM decodes (`(batch, new)` bool, or None: at every real new token) and PANM's outputs.

        `prompt` holds `labels`, `prompt_mask` and `prompt_lengths`, read on a first (uncached) call only."""
        given = [name for name in ("prompt_mask", "prompt_lengths") if prompt[name] is not None]
        if given and not self.prompt_memory:
            raise ValueError(
                f"{given[0]} is read only with causal_memory='prompt' (this model has "
                f"causal_memory={self.config.causal_memory!r}); set PanmConfig.causal_memory='prompt' or drop it."
            )
        steps = None
        if cache is not None and cache.panm_memory is not None:
            if cache.panm_state is None:
                raise ValueError(
                    "past_key_values comes from a forward whose rows' responses had different lengths; PANM's state "
                    "after each row's own last step was not kept, so decoding cannot continue from it. Prefill with "
                    "the prompts alone (as generate() does) or with responses of one length."
                )
            cache.panm_resume(past_length, "pass the PanmDynamicCache returned by this model.")
            panm_hidden, out = self._cached_step(hidden, mask, cache, output_attentions)
        elif past_length:
            raise ValueError(
                f"past_key_values holds {past_length} cached tokens but no PANM state; pass the "
                "PanmDynamicCache returned by this model (not a backbone-only cache)."
            )
        elif self.prompt_memory:
            lengths = self._prompt_lengths(mask, **prompt)
            panm_hidden, out, steps = self._prompt_prefill(hidden, mask, lengths, base_address, output_attentions)
        else:
            panm_hidden, out = self._panm_prefill(hidden, mask, base_address, output_attentions)
        if cache is not None:
            cache.panm_store(out.state, out.memory, past_length, hidden.shape[1])
        return panm_hidden, steps, out

    def _head(
        self, hidden: torch.Tensor, panm_hidden: torch.Tensor, steps: torch.Tensor | None, panm_output: PanmMemoryOutput
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the LM head reads (`hidden` plus PANM's output, `(batch, new, dim)`) and its logits."""
        head_input = hidden + panm_hidden.to(hidden.dtype)  # (batch, new, dim)
        logits = get_path(self.backbone, self.parts.lm_head)(head_input)  # (batch, new, vocab)
        if self.config.eos_decision == "panm":
            logits = self._panm_eos_logits(logits, panm_output, panm_hidden, steps)
        return head_input, logits

    def _panm_eos_logits(
        self, logits: torch.Tensor, panm_output: PanmMemoryOutput, panm_hidden: torch.Tensor, steps: torch.Tensor | None
    ) -> torch.Tensor:
        """`logits` with the end-of-sequence ones taken from PANM's output alone, before drop-path, at the
        positions PANM decodes (`eos_decision="panm"`; without `g^o`'s `z_t` columns when it reads them); elsewhere
        (the prompt, padding) they stay the backbone's."""
        states = panm_output.stop_states(panm_hidden)  # (batch, new, dim)
        eos_ids = self._eos_token_ids(logits.device)  # (num_eos,)
        eos_logits = self._lm_head_rows(states.to(logits.dtype), eos_ids)  # (batch, new, num_eos)
        if steps is not None:  # (batch, new) bool where PANM decodes; None: at every new token
            eos_logits = torch.where(steps.unsqueeze(-1), eos_logits, logits.index_select(-1, eos_ids))
        return logits.index_copy(-1, eos_ids, eos_logits)  # (batch, new, vocab)

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.LongTensor | None) -> torch.Tensor | None:
        """Mean next-token cross-entropy over the labels that are not -100 (token t predicts t + 1)."""
        if labels is None:
            return None
        shift_logits = logits[:, :-1].float()  # (batch, new - 1, vocab)
        shift_labels = labels[:, 1:].to(logits.device)  # (batch, new - 1)
        return torch.nn.functional.cross_entropy(shift_logits.flatten(0, 1), shift_labels.flatten(), ignore_index=-100)

    # -- forward ---------------------------------------------------------------------------------
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
        prompt_mask: torch.Tensor | None = None,
        prompt_lengths: torch.LongTensor | None = None,
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
                LMs); `-100` is ignored by the loss. With `causal_memory="prompt"` and no `prompt_mask` /
                `prompt_lengths`, each row's prompt is what precedes its first supervised label.
            base_address: `(batch,)` PANM base addresses; default random in training, 0 in eval.
            prompt_mask: `(batch, length)`, `causal_memory="prompt"` only: 1 on each row's prompt, a
                non-empty prefix of its real tokens. Read on the first (uncached) call.
            prompt_lengths: `(batch,)` integers, `causal_memory="prompt"` only: each row's number of real
                (unpadded) prompt tokens, the alternative to `prompt_mask`; `generate()` passes the
                prompt's. Without either (and without labels) the whole input is the prompt.
            output_attentions: also return PANM's address and Mode-2 attention maps.
            output_hidden_states: also return the hidden states; they end with PANM's output added to
                the backbone's last state (what the LM head reads), after the backbone's own.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        past_key_values = pop_cache_argument(past_key_values, kwargs)
        if labels is not None and past_key_values is None:
            use_cache = False
        use_cache = use_cache if use_cache is not None else getattr(self.config.text_config, "use_cache", True)
        cache = PanmDynamicCache.from_cache(past_key_values) if use_cache else None
        past_length = cache.get_seq_length() if cache is not None else 0
        body_outputs = self.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{BACKBONE_CACHE_KWARG: cache},
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **self._output_flags(output_attentions, output_hidden_states),
        )
        hidden = body_outputs.last_hidden_state  # (batch, new, dim): memory slots and z_t alike
        if attention_mask is not None:
            mask = attention_mask[:, -hidden.shape[1] :].bool()  # (batch, new)
        else:
            mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)  # (batch, new)
        prompt = {"labels": labels, "prompt_mask": prompt_mask, "prompt_lengths": prompt_lengths}
        panm_hidden, steps, panm_output = self._panm(
            hidden, mask, cache, past_length, prompt, base_address, bool(output_attentions)
        )
        head_input, logits = self._head(hidden, panm_hidden, steps, panm_output)
        hidden_states = getattr(body_outputs, "hidden_states", None)
        if hidden_states is not None:  # PANM is the last layer: what the LM head reads comes last
            hidden_states = (*hidden_states, head_input)
        output = PanmCausalLMOutputWithPast(
            loss=self._loss(logits, labels),
            logits=logits,
            **{BACKBONE_CACHE_KWARG: cache},
            hidden_states=hidden_states,
            attentions=getattr(body_outputs, "attentions", None),
            address_attentions=panm_output.address_attentions,
            mode2_attentions=panm_output.mode2_attentions,
            content_attentions=panm_output.content_attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = ["PanmCausalLMOutputWithPast", "PanmForCausalLM"]
