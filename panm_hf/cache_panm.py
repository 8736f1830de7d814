"""PanmCache: the backbone's KV cache plus PANM's recurrent state, reordered together.

``generate()`` reorders only the cache object during beam search, so the PANM
state must live inside it: state kept anywhere else is silently left in the old
beam order (greedy still looks right).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput

from .state import AddressedMemory, PanmState

# transformers 5.24 renamed the cache argument and output field `past_key_values` to `cache`
# (the old name is deprecated, to go in 5.40): `generate()` passes the cache under this name,
# and the backbones take it under it.
BACKBONE_CACHE_KWARG = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def pop_cache_argument(past_key_values: Cache | None, kwargs: dict) -> Cache | None:
    """The cache a forward was given, under either name (`cache`, transformers >= 5.24, or `past_key_values`).

    Removes `cache` from `kwargs`; a ValueError when both names carry one.
    """
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None:
        raise ValueError(
            "Got both `cache` and `past_key_values`; pass the cache once (as `cache` on transformers >= 5.24)."
        )
    return cache if cache is not None else past_key_values


def _is_empty_dynamic(cache: EncoderDecoderCache) -> bool:
    """True for an EncoderDecoderCache of two plain DynamicCaches that hold no tokens yet."""
    parts = (cache.self_attention_cache, cache.cross_attention_cache)
    return all(type(part) is DynamicCache and part.get_seq_length() == 0 for part in parts)


class _PanmStateCache:
    """PANM's state kept beside a backbone cache and reordered with it (mixed into a `Cache` subclass).

    Attributes:
        panm_state: recurrent state after the last decoded token, or None before the first.
        panm_memory: the addressed memory (bound on the first step; grown per token by the causal LM).
        panm_steps: number of tokens PANM has decoded into `panm_state`.
    """

    def _init_panm(self) -> None:
        self.panm_state: PanmState | None = None
        self.panm_memory: AddressedMemory | None = None
        self.panm_steps = 0

    def panm_resume(self, past_length: int, fix: str) -> tuple[PanmState | None, AddressedMemory | None]:
        """The handshake of a cached call after `past_length` tokens: PANM's state and memory, or a ValueError
        ending in `fix` when they were decoded for another number of tokens (a cache from elsewhere)."""
        if self.panm_steps != past_length:
            raise ValueError(
                f"past_key_values holds {past_length} cached tokens but PANM state for {self.panm_steps}; {fix}"
            )
        return self.panm_state, self.panm_memory

    def panm_store(self, state: PanmState, memory: AddressedMemory, past_length: int, new_length: int) -> None:
        """Keep PANM's state after a cached call that decoded `new_length` tokens after `past_length`."""
        self.panm_state, self.panm_memory = state, memory
        self.panm_steps = past_length + new_length

    def _select(self, indices: torch.Tensor) -> None:
        if self.panm_state is not None:
            self.panm_state = self.panm_state.index_select(indices)
        if self.panm_memory is not None:
            self.panm_memory = self.panm_memory.index_select(indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._select(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.panm_memory is not None:
            batch_size = self.panm_memory.memory_states.shape[0]
            self._select(torch.arange(batch_size).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._select(indices)

    def reset(self) -> None:
        super().reset()
        self._init_panm()

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError(
            "PanmCache cannot be cropped: PANM's recurrent state cannot be rolled back to an earlier "
            "token. Decoding strategies that crop the cache (assisted/speculative decoding) are not supported."
        )

    @property
    def is_croppable(self) -> bool:
        return False


class PanmCache(_PanmStateCache, EncoderDecoderCache):
    """An `EncoderDecoderCache` that also carries PANM's decoding state (`PanmForSeq2SeqLM`).

    Attributes:
        panm_state: recurrent state after the last decoded token, or None before the first.
        panm_memory: the addressed memory bound on the first step (reused afterwards).
        panm_steps: number of tokens PANM has decoded into `panm_state`.
    """

    def __init__(self, *caches) -> None:
        super().__init__(*caches)
        self._init_panm()

    @classmethod
    def from_cache(cls, cache: Cache | None) -> PanmCache:
        """Wrap the cache `generate()` created (or None) without copying its tensors."""
        if isinstance(cache, PanmCache):
            return cache
        if cache is None:
            return cls(DynamicCache(), DynamicCache())
        if isinstance(cache, EncoderDecoderCache):
            if _is_empty_dynamic(cache):
                # generate() sizes its DynamicCache from the backbone config, which can disagree with the
                # decoder that actually runs (placement="replace" drops a layer; T5 with
                # num_decoder_layers != num_layers gets num_layers). Empty, it holds nothing to keep, so
                # start with layers created lazily for whatever decoder layers exist.
                return cls(DynamicCache(), DynamicCache())
            wrapped = cls(cache.self_attention_cache, cache.cross_attention_cache)
            wrapped.is_updated = dict(cache.is_updated)
            return wrapped
        if isinstance(cache, Cache):
            return cls(cache, DynamicCache())
        raise TypeError(f"past_key_values must be a transformers Cache or None; got {type(cache).__name__}.")


class PanmDynamicCache(_PanmStateCache, DynamicCache):
    """A `DynamicCache` (a decoder-only backbone's KV cache) that also carries PANM's state (`PanmForCausalLM`).

    `panm_memory` is the causal memory so far, left-aligned (each sample's real tokens first), grown by
    `PanmMemory.append` on every cached call (`causal_memory="sequence"`), or the prompt, bound on the first
    call and kept (`causal_memory="prompt"`).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._init_panm()

    @classmethod
    def from_cache(cls, cache: Cache | None) -> PanmDynamicCache:
        """Adopt the `DynamicCache` `generate()` created (or None) without copying its tensors."""
        if isinstance(cache, PanmDynamicCache):
            return cache
        if cache is None:
            return cls()
        if type(cache) is DynamicCache:
            wrapped = cls.__new__(cls)
            wrapped.__dict__.update(cache.__dict__)  # the same layer objects: no copy
            wrapped._init_panm()
            return wrapped
        raise TypeError(
            f"past_key_values must be a DynamicCache (or None) for PanmForCausalLM; got {type(cache).__name__}. "
            "Static, quantized and offloaded caches are not supported."
        )
