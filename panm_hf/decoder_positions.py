"""An encoder-decoder's decoder position signal (`PanmConfig.decoder_positions`, the examples' `--decoder_positions`):
the backbone's own absolute positions, none, a random offset in training, ALiBi's linear distance bias, or a learned
bias per head and distance inside the window (`relative`) in place of them; and `decoder_window`, a sliding window
on the decoder's self-attention (each query attends to its last W tokens), so no decoder query past the training
length attends to more tokens than in training.

Measured on SCAN's length split (docs/results/scan_diagnosis.md), where the decoder's absolute positions are
what a model past the training lengths has never seen. Only `relative` adds parameters (a `(window, heads)` table
per self-attention, saved with the weights). ALiBi and the window live
in the attention function, which transformers does not save, so the settings are recorded in the config
instead: `PanmForSeq2SeqLM` applies its `PanmConfig`'s when it is built or loaded, and the examples record them
in a plain backbone's config (`record`) and apply them again when they load it (`recorded`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

DECODER_POSITIONS = ("absolute", "none", "offset", "alibi", "relative")
DEFAULTS = {"decoder_positions": "absolute", "decoder_window": 0, "max_position_offset": 64}  # the backbone as is
ALIBI_ATTENTION = "panm_decoder_alibi"  # the attention implementation's registered name


def remove_decoder_positions(model: torch.nn.Module, flag: str = "none") -> None:
    """Zero and freeze the decoder's absolute position embeddings (BART's learned, Marian's sinusoidal);
    `flag` is the `--decoder_positions` value the error names."""
    positions = getattr(model.get_decoder(), "embed_positions", None)
    if positions is None:
        raise ValueError(f"decoder_positions={flag!r} (--decoder_positions {flag}) needs a decoder with absolute "
                         "positions (bart or marian); keep decoder_positions='absolute' for this backbone.")
    with torch.no_grad():
        positions.weight.zero_()
    positions.weight.requires_grad_(False)


def randomise_decoder_positions(model: torch.nn.Module, max_offset: int) -> None:
    """In training, start each sample's decoder positions at a random offset in [0, max_offset] (at 0 in eval).

    A forward hook on the decoder's position embedding re-reads it at the shifted positions, so the saved
    weights are the backbone's own and a saved model loads and decodes as the plain backbone (offset 0).
    Every position up to the longest training output + `max_offset` gets trained, and no absolute position
    marks the training lengths (Ruoss et al. 2023; PANM's base address p_B for the decoder).
    """
    positions = getattr(model.get_decoder(), "embed_positions", None)
    if positions is None or not hasattr(positions, "weight"):
        raise ValueError("decoder_positions='offset' (--decoder_positions offset) needs a decoder with absolute "
                         "positions (bart or marian); keep decoder_positions='absolute' for this backbone.")
    if getattr(positions, "panm_max_offset", None) is not None:  # applied already (a model built, then loaded)
        positions.panm_max_offset = max_offset
        return
    positions.panm_max_offset = max_offset
    table_size = positions.weight.shape[0] - getattr(positions, "offset", 0)

    def shifted(module, args, output):
        if not module.training:
            return None
        steps = output.shape[-2]
        shape = args[0] if isinstance(args[0], torch.Size) else args[0].shape  # Marian passes the ids' shape
        batch = shape[0]
        if steps - 1 + module.panm_max_offset >= table_size:  # checked on sizes: no device sync per step
            raise ValueError(f"max_position_offset={module.panm_max_offset} runs past the {table_size} decoder "
                             "positions; lower it or raise the backbone's max_position_embeddings.")
        offsets = torch.randint(0, module.panm_max_offset + 1, (batch, 1), device=module.weight.device)  # (b, 1)
        ids = torch.arange(steps, device=module.weight.device) + offsets  # (batch, steps)
        return torch.nn.functional.embedding(ids + getattr(module, "offset", 0), module.weight)  # (batch, steps, d)

    positions.register_forward_hook(shifted)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Press et al. 2022's per-head slopes, the geometric sequence 2^(-8 h / heads) for h = 1..heads."""
    return torch.exp2(-8.0 * torch.arange(1, num_heads + 1) / num_heads)  # (heads,)


def query_key_distance(queries: int, keys: int, device) -> torch.Tensor:
    """`i - j` for query i and key j, the queries being the last `queries` of the `keys` positions (a cached step
    is the newest); negative for future keys."""
    query_positions = torch.arange(keys - queries, keys, device=device)  # (queries,)
    return query_positions[:, None] - torch.arange(keys, device=device)  # (queries, keys)


def alibi_bias(num_heads: int, queries: int, keys: int, device, dtype) -> torch.Tensor:
    """`-slope_h * (i - j)` for query i and key j <= i (`query_key_distance`). Future keys get 0 here: the
    causal mask removes them."""
    distance = query_key_distance(queries, keys, device).clamp(min=0)  # (queries, keys)
    slopes = alibi_slopes(num_heads).to(device=device, dtype=dtype)  # (heads,)
    return -(slopes[:, None, None] * distance)[None]  # (1, heads, queries, keys)


def relative_bias(table: torch.Tensor, queries: int, keys: int, dtype) -> torch.Tensor:
    """The learned bias `table[i - j, h]` for query i and key j <= i, the distance capped at the table's last row
    (keys that far back are masked by the window anyway)."""
    distance = query_key_distance(queries, keys, table.device).clamp(0, table.shape[0] - 1)  # (queries, keys)
    bias = table[distance].to(dtype)  # (queries, keys, heads)
    return bias.permute(2, 0, 1)[None]  # (1, heads, queries, keys)


def alibi_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA with the decoder's self-attention bias on causal self-attention; every other attention is plain SDPA.

    The bias is the learned `relative_attention_bias` where the module has one (`use_relative_bias`), else ALiBi's
    `-slope_h * distance` (unless `module.alibi` is False: `use_window` alone) and, where `module.window` is set,
    -inf on keys `window` or more steps back (a sliding window)."""
    if not getattr(module, "is_causal", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    heads, queries, keys = query.shape[1], query.shape[2], key.shape[2]
    table = getattr(module, "relative_attention_bias", None)
    if table is not None:
        bias = relative_bias(table.weight, queries, keys, query.dtype)  # (1, heads, queries, keys)
    elif getattr(module, "alibi", True):
        bias = alibi_bias(heads, queries, keys, query.device, query.dtype)  # (1, heads, queries, keys)
    else:
        bias = query.new_zeros(1, 1, queries, keys)  # (1, 1, queries, keys)
    window = getattr(module, "window", 0)
    if window:
        distance = query_key_distance(queries, keys, query.device)  # (queries, keys)
        bias = bias.masked_fill(distance >= window, float("-inf"))  # every query keeps itself (distance 0)
    return sdpa_attention_forward(module, query, key, value, attention_mask, position_bias=bias, **kwargs)


def _register(model: torch.nn.Module) -> None:
    """Every attention module of `model` dispatches to `alibi_attention` (transformers' `AttentionInterface`,
    its masks built as SDPA's)."""
    AttentionInterface.register(ALIBI_ATTENTION, alibi_attention)
    AttentionMaskInterface.register(ALIBI_ATTENTION, sdpa_mask)
    configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "sub_configs")}
    for config in configs.values():  # the wrapper's config and the backbone's, which its layers read
        config._attn_implementation = ALIBI_ATTENTION


def _causal_attentions(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's self-attention modules (transformers marks them `is_causal`)."""
    return [module for module in model.modules() if getattr(module, "is_causal", False) is True]


def use_alibi(model: torch.nn.Module) -> None:
    """Replace the decoder's absolute positions with ALiBi (Press et al. 2022) in its self-attention.

    The absolute positions are zeroed and frozen (`remove_decoder_positions`), and every attention module
    of the model dispatches to `alibi_attention`, which biases causal self-attention by `-slope_h * distance`:
    a head's scores depend only on how far back a token is, so no step past the training length looks new.
    """
    remove_decoder_positions(model, "alibi")
    for module in _causal_attentions(model):
        module.alibi = True
    _register(model)


def use_relative_bias(model: torch.nn.Module, window: int) -> None:
    """Replace the decoder's absolute positions with a learned bias per head and distance inside the window.

    Each causal self-attention gets `relative_attention_bias`, an `nn.Embedding(window, heads)` like T5's (one
    bucket per distance 0..window-1, starting at zero: the model starts as `none`). Every distance it can hold is
    seen in training once the training outputs reach `window` tokens, so no step past the training length looks
    new, and the decoder can tell how far back each token in its window is (a count that ALiBi's fixed slopes and
    `none` blur). The tables are parameters, saved with the weights; applying it again keeps them.
    """
    check("relative", window, DEFAULTS["max_position_offset"])  # needs a window
    remove_decoder_positions(model, "relative")
    for module in _causal_attentions(model):
        table = getattr(module, "relative_attention_bias", None)
        if table is None or table.num_embeddings != window:
            weight = next(module.parameters())
            module.relative_attention_bias = torch.nn.Embedding(window, module.num_heads, device=weight.device,
                                                                dtype=weight.dtype)  # (window, heads)
            torch.nn.init.zeros_(module.relative_attention_bias.weight)
        module.alibi = False
    _register(model)


def load_relative_bias(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Copy the `relative_attention_bias` tables a checkpoint at `path` saved into `model`'s (`use_relative_bias`).

    A plain backbone's class has no such tables, so `AutoModelForSeq2SeqLM.from_pretrained` drops them and
    `use_relative_bias` makes new ones at zero; this puts the trained ones back. `model` is the backbone, or a PANM
    model that wraps it under `backbone` (its names are tried with and without that prefix)."""
    saved = {}
    for weights in sorted(Path(path).glob("*.safetensors")):
        with safe_open(weights, framework="pt") as handle:
            saved.update({key: handle.get_tensor(key) for key in handle.keys() if "relative_attention_bias" in key})
    for name, table in model.named_parameters():
        if "relative_attention_bias" not in name:
            continue
        key = name if name in saved else name.removeprefix("backbone.")
        if key not in saved:
            raise ValueError(f"{path} records decoder_positions='relative' but saves no {key!r}: train the model "
                             "again, or load it with --decoder_positions none.")
        with torch.no_grad():
            table.copy_(saved[key])


def use_window(model: torch.nn.Module, window: int) -> None:
    """Limit the decoder's self-attention to the last `window` tokens (the query's own included).

    With `window` at most the training outputs' length, every decoder query attends to no more tokens than
    it did in training, however long the output grows: what the decoder sees past the training length is
    in distribution, and where the output stands overall is left to PANM's pointers. Keeps the decoder's
    position signal as it is (combine with `--decoder_positions none` or `alibi`).
    """
    if window < 1:
        raise ValueError(f"decoder_window must be >= 1 to limit the decoder's attention (got {window}).")
    attentions = _causal_attentions(model)
    # a BART-family decoder (absolute positions, attention through transformers' attention functions); T5's
    # attention marks is_causal too but adds its own position bias, past the registered function
    bart_family = getattr(model.get_decoder(), "embed_positions", None) is not None
    if not attentions or not bart_family:
        raise ValueError("decoder_window needs a decoder whose self-attention transformers marks is_causal and "
                         "runs through its attention functions (bart, marian, mbart); set decoder_window=0 for "
                         "this backbone.")  # fmt: skip
    for module in attentions:
        module.window = window
        if not hasattr(module, "alibi"):
            module.alibi = False  # the window alone
    _register(model)


def apply(model: torch.nn.Module, decoder_positions: str, max_offset: int = 64, window: int = 0) -> None:
    """Give `model`'s decoder the position signal named by `--decoder_positions`, and with `window` a sliding
    window on its self-attention (`--decoder_window`)."""
    check(decoder_positions, window, max_offset)
    if decoder_positions == "none":
        remove_decoder_positions(model)
    elif decoder_positions == "offset":
        randomise_decoder_positions(model, max_offset)
    elif decoder_positions == "alibi":
        use_alibi(model)
    elif decoder_positions == "relative":
        use_relative_bias(model, window)
    if window:
        use_window(model, window)


def check(decoder_positions: str, window: int, max_offset: int) -> None:
    """ValueError naming the field unless the three settings are valid (before any model is touched)."""
    if decoder_positions not in DECODER_POSITIONS:
        raise ValueError(f"decoder_positions must be one of {DECODER_POSITIONS} (got {decoder_positions!r}).")
    if window < 0:
        raise ValueError(f"decoder_window must be >= 0 (0: the whole prefix; got {window}).")
    if decoder_positions == "relative" and window < 1:
        raise ValueError("decoder_positions='relative' learns a bias per distance inside the decoder's window: set "
                         f"decoder_window >= 1 (--decoder_window, got {window}).")
    if max_offset < 0:
        raise ValueError(f"max_position_offset must be >= 0 (got {max_offset}).")


def record(config, decoder_positions: str, decoder_window: int, max_position_offset: int) -> None:
    """Write the settings into a plain backbone's config (saved with it) where they change the model."""
    if (decoder_positions, decoder_window) != (DEFAULTS["decoder_positions"], DEFAULTS["decoder_window"]):
        config.decoder_positions, config.decoder_window = decoder_positions, decoder_window
        config.max_position_offset = max_position_offset


def recorded(config) -> dict:
    """The settings a saved config records (`record`, or a `PanmConfig`'s fields), else the defaults."""
    return {name: getattr(config, name, default) for name, default in DEFAULTS.items()}
