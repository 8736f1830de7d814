"""Input feeding (beyond the paper): the Controller's state enters the decoder's next input.

With `PanmConfig.input_feeding` the decoder's input at step `t` is its token's embedding plus a learned
projection of the Controller's GRU state `h^c_{t-1}` (`h^c_0` at the first step). The decoder's own tokens then
carry where the Controller's recurrence stood when each was written: with a position-free, windowed decoder
(docs/results/scan.md), a window that holds the same tokens at two steps no longer looks the same at both.

`z_t` now depends on the Controller's previous step, so the decoder runs one token at a time in training too
(a KV cache inside the call), as in `generate()`, inside `PanmMemory.forward_fed`: what needs no `z_t` (the Pointer
Units, the Mode-1 and Mode-2 reads; then `g^o` and drop-path) runs once for all the call's steps. The projection
starts at zero, so an untrained feed leaves the model exactly as without it (`tests/test_input_feeding.py`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

from .cache_panm import BACKBONE_CACHE_KWARG, PanmCache
from .memory import PanmMemoryOutput


class InputFeed(nn.Module):
    """`h^c_{t-1}` -> a vector added to the decoder's input embedding at step `t`, zero at initialisation.

    Args:
        controller_hidden_size: the Controller's `h^c` size (an LSTM Controller's `[h, c]` feeds its `h`).
        decoder_dim: the decoder's embedding size.
    """

    def __init__(self, controller_hidden_size: int, decoder_dim: int):
        super().__init__()
        self.controller_hidden_size = controller_hidden_size
        self.projection = nn.Linear(controller_hidden_size, decoder_dim, bias=False)

    def forward(self, controller_hidden: torch.Tensor) -> torch.Tensor:
        hidden = controller_hidden[..., : self.controller_hidden_size]  # (batch, hidden): h of an LSTM's [h, c]
        return self.projection(hidden).unsqueeze(1)  # (batch, 1, decoder_dim)


def _pad_keys(attention: torch.Tensor, length: int) -> torch.Tensor:
    """A step's self-attention `(batch, heads, 1, keys)` padded with zeros to `length` keys (the later ones,
    which a causal decoder gives no weight)."""
    return nn.functional.pad(attention, (0, length - attention.shape[-1]))


def _join_decoder_outputs(steps: list, total_keys: int) -> BaseModelOutputWithPastAndCrossAttentions:
    """The per-token decoder outputs as one call's: states and attentions joined along the queries."""
    last = steps[-1]
    hidden = torch.cat([s.last_hidden_state for s in steps], dim=1)  # (batch, tokens, dim)
    joined = {"last_hidden_state": hidden}
    if getattr(last, "hidden_states", None) is not None:
        layers = zip(*(s.hidden_states for s in steps))
        joined["hidden_states"] = tuple(torch.cat(layer, dim=1) for layer in layers)  # each (batch, tokens, dim)
    if getattr(last, "attentions", None) is not None:
        layers = zip(*(s.attentions for s in steps))
        joined["attentions"] = tuple(
            torch.cat([_pad_keys(a, total_keys) for a in layer], dim=2) for layer in layers
        )  # each (batch, heads, tokens, keys)
    if getattr(last, "cross_attentions", None) is not None:
        layers = zip(*(s.cross_attentions for s in steps))
        joined["cross_attentions"] = tuple(torch.cat(layer, dim=2) for layer in layers)  # (batch, heads, tokens, src)
    return BaseModelOutputWithPastAndCrossAttentions(**joined)


def fed_decode(
    model,
    decoder_input_ids: torch.LongTensor | None,
    decoder_inputs_embeds: torch.Tensor | None,
    decoder_attention_mask: torch.Tensor | None,
    cross_states: torch.Tensor,
    memory_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: PanmCache | None,
    base_address: torch.LongTensor | None,
    output_attentions: bool | None,
    extra: dict,
) -> tuple[torch.Tensor, object, PanmMemoryOutput]:
    """`PanmForSeq2SeqLM`'s decoder and PANM, one target token at a time with the Controller's state fed in.

    Returns `z_t` `(batch, tokens, decoder_dim)`, the decoder's outputs and PANM's, as the unfed path does. With
    no `cache` (training) a call-local one holds the decoder's keys and values; with one, it continues from it.
    """
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.24's name
    if checkpointing is None:
        checkpointing = model.is_gradient_checkpointing
    if checkpointing and model.training and torch.is_grad_enabled():
        raise ValueError(
            "input_feeding runs the decoder one token at a time through a KV cache, and gradient checkpointing "
            "drops the cache in training: call model.activation_checkpointing_disable() (gradient_checkpointing_"
            "disable() before transformers 5.24; or gradient_checkpointing=False in the training arguments), or set "
            "input_feeding=False."
        )
    decoder = model.get_decoder()
    embeds = decoder_inputs_embeds
    if embeds is None:
        embeds = decoder.get_input_embeddings()(decoder_input_ids)  # (batch, tokens, dim), the decoder's own scale
    run_cache = cache if cache is not None else PanmCache.from_cache(None)
    past_length = run_cache.get_seq_length()
    num_tokens = embeds.shape[1]
    if decoder_attention_mask is not None and decoder_attention_mask.shape[1] != past_length + num_tokens:
        raise ValueError(
            f"decoder_attention_mask covers {decoder_attention_mask.shape[1]} tokens; with input_feeding it must "
            f"cover the cached and the new tokens ({past_length} + {num_tokens}): pass the whole target's mask."
        )
    state, memory = run_cache.panm_resume(past_length, "pass the PanmCache returned by this model.")
    if memory is None:  # bound once (a training call draws its random base addresses here), then kept
        memory = model.panm.bind(memory_states, attention_mask, base_address=base_address)
    decoder_steps = []

    def decoder_step(t: int, controller_hidden: torch.Tensor) -> torch.Tensor:
        """The decoder on target token `t`, its input fed `h^c_{t-1}`: `z_t` `(batch, 1, dim)`."""
        step_embeds = embeds[:, t : t + 1] + model.input_feed(controller_hidden).to(embeds.dtype)  # (batch, 1, dim)
        step_mask = decoder_attention_mask[:, : past_length + t + 1] if decoder_attention_mask is not None else None
        step = decoder(
            inputs_embeds=step_embeds,
            attention_mask=step_mask,
            encoder_hidden_states=cross_states,
            encoder_attention_mask=attention_mask,
            **{BACKBONE_CACHE_KWARG: run_cache},
            use_cache=True,
            **extra,
        )
        decoder_steps.append(step)
        return step.last_hidden_state

    panm_output = model.panm.forward_fed(
        memory, decoder_step, num_tokens, state=state, output_attentions=bool(output_attentions)
    )
    run_cache.panm_store(panm_output.state, memory, past_length, num_tokens)
    decoder_outputs = _join_decoder_outputs(decoder_steps, past_length + num_tokens)
    return decoder_outputs.last_hidden_state, decoder_outputs, panm_output
