"""Training-time controls: a PANM model with its pointers switched off, trained and tested that way.

The ablations of `examples/translation/ablate_reads.py` switch a part of PANM off at test time on a model trained with
it. A control switches it off from the first step, so the model learns without it: the difference
between PANM and its control is what that part brings to training and to the test alike.

`no_pointer_reads`: the Mode-1 and Mode-2 values are zeroed where the Controller takes them (its
GRU input and `g^o`'s input). What is left of PANM's branch is the Controller GRU over `z_t` and the
decoder-queried content read (`content_read="decoder"`), its `h^c_0` from the memory, the zero-
initialised output projection and drop-path: the same parameters, the same branch, no pointers.
The Pointer Units still run (their output is discarded) and get zero gradient.

`no_reads`: every read is zeroed, the content read too. The Controller GRU then sees `z_t` alone
(its `h^c_0` still pools the memory): PANM's branch as an extra recurrent layer with drop-path.

`no_decoder_input`: `z_t` is zeroed where the Controller takes it, its GRU and (with `output_decoder_input`) `g^o`
(what the decoder has written reaches PANM only through the decoder-queried content read, `content_read="decoder"`,
whose query is `z_t`): does the stop decision need the decoder's state, or do the reads and the Controller's own
recurrence make it?

`no_controller_decoder_input`: only the Controller GRU's `z_t` columns are zeroed (and kept at zero: their gradient
is masked), so its recurrence runs over the reads alone while `g^o` still reads `z_t` (`output_decoder_input`). The
GRU can then count only what the reads show, not the actions it has written (docs/results/scan_count.md, point 30).

The first three controls live in a forward pre-hook, not in the saved weights: a saved control model scores as
trained only with the same hook, which `ablate_reads.py` re-applies from the run's `results.json`. The last lives in
the weights (its columns are zero) and a gradient hook that only training needs.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.hooks import RemovableHandle


def _panm(model: torch.nn.Module) -> torch.nn.Module:
    """`model.panm`; ValueError unless `model` is a PANM model whose Controller runs in one forward."""
    panm = getattr(model, "panm", None)
    if panm is None or not hasattr(panm, "controller"):
        raise ValueError(f"--control needs a PANM model (got {type(model).__name__}); use --model panm or both.")
    if panm.controller.content_reader is not None:
        raise ValueError(
            "--control cannot run with --content_read controller (the Controller then reads step "
            "by step outside the hooked forward); use --content_read decoder or none."
        )
    return panm


def zero_reads(model: torch.nn.Module, *, include_content_read: bool = False) -> RemovableHandle:
    """Zero the Mode-1 and Mode-2 values (and the content read with `include_content_read`) at the
    Controller's input of `model.panm`; returns the hook's handle.

    Raises:
        ValueError: `model` has no PANM memory, or its Controller reads with its own state
            (`content_read="controller"`, whose steps bypass `Controller.forward`).
    """
    panm = _panm(model)
    pointer_width = (panm.num_pointer_units + panm.num_mode2_heads) * panm.memory_dim

    def hook(module, inputs):
        reads = inputs[0]  # (batch*steps or batch, steps, num_reads*dim): pointer reads first, content read last
        keep = torch.ones(reads.shape[-1], dtype=reads.dtype, device=reads.device)  # (num_reads*dim,)
        keep[: reads.shape[-1] if include_content_read else pointer_width] = 0
        return (reads * keep, *inputs[1:])

    return panm.controller.register_forward_pre_hook(hook)


def zero_decoder_input(model: torch.nn.Module) -> RemovableHandle:
    """Zero `z_t` where the Controller of `model.panm` takes it (its GRU input); returns the hook's handle.

    Raises:
        ValueError: as `zero_reads`.
    """

    def hook(module, inputs):
        reads, decoder_states, *rest = inputs
        return (reads, None if decoder_states is None else torch.zeros_like(decoder_states), *rest)

    return _panm(model).controller.register_forward_pre_hook(hook)


def zero_controller_decoder_input(model: torch.nn.Module) -> RemovableHandle:
    """Zero the `z_t` columns of the Controller GRU's input weights of `model.panm` and mask their gradient, so
    they stay zero under any optimizer whose step is zero for a zero gradient (Adam, AdamW, SGD); returns the
    gradient hook's handle. The weights themselves carry the control: a saved model scores as trained without it.

    Raises:
        ValueError: as `zero_reads`, or the Controller takes no `z_t` (no decoder input) or is an LSTM.
    """
    controller = _panm(model).controller
    if controller.gru is None or controller.decoder_input_size == 0:
        raise ValueError(
            "--control no_controller_decoder_input needs a GRU Controller that reads z_t; use "
            "--controller_cell gru with a decoder (placement replace, stack or residual)."
        )
    weight = controller.gru.weight_ih_l0  # (3 * hidden, reads + z_t): z_t's columns last
    keep = torch.ones_like(weight)
    keep[:, weight.shape[1] - controller.decoder_input_size :] = 0
    with torch.no_grad():
        weight.mul_(keep)
    return weight.register_hook(lambda grad: grad * keep)


# Each control's name and the hook that makes it (on a freshly built PANM model).
CONTROL_HOOKS = {
    "no_pointer_reads": zero_reads,
    "no_reads": partial(zero_reads, include_content_read=True),
    "no_decoder_input": zero_decoder_input,
    "no_controller_decoder_input": zero_controller_decoder_input,
}
CONTROLS = tuple(CONTROL_HOOKS)


def validate_control(control: str | None) -> None:
    """ValueError naming `--control` unless it is one of `CONTROLS` or None."""
    if control is not None and control not in CONTROLS:
        raise ValueError(f"--control must be one of {CONTROLS} or omitted (got {control!r}).")


def apply_control(model: torch.nn.Module, control: str | None) -> RemovableHandle | None:
    """Apply `--control` (one of `CONTROLS`, or None for none) to a freshly built PANM model."""
    validate_control(control)
    return None if control is None else CONTROL_HOOKS[control](model)
