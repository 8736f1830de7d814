"""Score-profile diagnostic of the Pointer Units (beyond-the-paper issue).

A Pointer Unit scores addresses with `q_t . g^a(code(a))` (Eq. 2). During training it
only ever compares a window of at most `L + 2` consecutive addresses, which the low
bits of the code alone tell apart. `address_score_periodicity` runs a trained PANM on
test inputs, scores *every* one of the `2^b` addresses with each unit's query at each
decoding step, and measures how much the profile repeats: the Pearson correlation
between the profile and itself rolled by `period` addresses. Near 1 means the unit
cannot tell address `a` from `a + period`, so beyond `period` slots its weight spreads
over look-alikes.
"""

from __future__ import annotations

import torch

from panm_hf.addressing import binary_codes
from panm_hf.memory import PanmMemory

from .algorithmic import make_batch


def _profile_correlation(profiles: torch.Tensor, period: int) -> torch.Tensor:
    """Pearson correlation of `(..., addresses)` profiles with themselves rolled by `period` -> `(...)`."""
    centred = profiles - profiles.mean(dim=-1, keepdim=True)
    rolled = torch.roll(centred, shifts=period, dims=-1)
    numerator = (centred * rolled).sum(dim=-1)
    denominator = centred.pow(2).sum(dim=-1).clamp_min(torch.finfo(profiles.dtype).tiny)
    return numerator / denominator  # rolling keeps the norm, so this is the Pearson correlation


@torch.no_grad()
def address_score_periodicity(
    model: torch.nn.Module,
    task: str,
    length: int,
    *,
    periods: tuple[int, ...] = (16, 32, 64),
    num_samples: int = 32,
    seed: int = 4321,
) -> dict:
    """Periodicity of each Pointer Unit's address scores over all `2^b` addresses.

    Args:
        model: a suite model with a `memory` attribute holding its `PanmMemory` (`PanmSeq2Seq`).
        task: the task whose test inputs drive the decoding.
        length: test length (number of input tokens).
        periods: shifts (in addresses) at which the correlation is measured.
        num_samples: test samples.
        seed: seeds the test inputs.

    Returns:
        `{"correlation": {period: [mean over samples and steps, per unit]}, "usage": [mean
        max Mode-1 weight per unit], "example_profile": [per unit, the scores of all addresses
        for the first sample at the middle step]}`; with `pointer_update="shift"` also
        `"shift_gate"`: per unit, the mean share of the steps among the moves (1 = the pointer
        moved by arithmetic only), and `"gamma"`: each unit's sharpening exponent.
    """
    memory_module: PanmMemory = model.memory
    was_training = model.training
    model.eval()
    batch = make_batch(task, num_samples, length, generator=torch.Generator().manual_seed(seed))
    device = next(model.parameters()).device
    batch = batch.to(device)
    states, _ = model.encoder(batch.inputs, batch.attention_mask)
    memory = memory_module.bind(states, batch.attention_mask)
    state = memory_module.initial_state(memory)
    units = memory_module.pointer_units
    all_codes = binary_codes(torch.arange(memory_module.max_slots, device=device), memory_module.address_bits)
    all_keys = units.address_keys(all_codes.unsqueeze(0).to(states.dtype))[0]  # (units, addresses, hidden)
    hiddens, max_weights = [], []
    for _ in range(batch.labels.shape[1]):
        out = memory_module(memory, num_steps=1, state=state, output_attentions=True)
        state = out.state
        hiddens.append(state.pointer_hidden)  # (batch, units, hidden)
        max_weights.append(out.address_attentions[:, 0].amax(dim=-1))  # (batch, units)
    hidden = torch.stack(hiddens, dim=1)  # (batch, steps, units, hidden)
    queries = units.scorer.prepare_queries(hidden)
    profiles = torch.einsum("btuh,uah->btua", queries, all_keys)  # (batch, steps, units, addresses)
    result = {
        "correlation": {
            period: _profile_correlation(profiles, period).mean(dim=(0, 1)).tolist() for period in periods
        },
        "usage": torch.stack(max_weights, dim=1).mean(dim=(0, 1)).tolist(),
        "example_profile": profiles[0, profiles.shape[1] // 2].tolist(),
    }
    if units.arithmetic_head is not None:
        steps_units = hidden.transpose(0, 2).flatten(1, 2)  # (units, steps*batch, hidden)
        moves = torch.softmax(units.arithmetic_head(steps_units), dim=-1)  # (units, steps*batch, 2K + 2)
        result["shift_gate"] = (1.0 - moves[..., -1]).mean(dim=-1).tolist()  # share of the steps, not "attend"
        result["gamma"] = units.arithmetic_head.gamma(1).flatten().tolist()  # one per unit
    model.train(was_training)
    return result


# The slot that holds the token a Copy / Reverse step must output: slot 0 is START, slots 1..n the tokens.
WALK_TARGETS = {
    "copy": lambda steps, length: steps,  # step t (1-based) reads x_t in slot t
    "reverse": lambda steps, length: length + 1 - steps,  # step t reads x_{n+1-t}
}


@torch.no_grad()
def pointer_walk(model: torch.nn.Module, task: str, length: int, *, num_samples: int = 256, seed: int = 4321) -> dict:
    """Where each Pointer Unit stands at each decoding step of Copy or Reverse, against the slot it should read.

    A unit is *on track* at step `t` when its address attention's largest weight is on the slot holding
    the step's target token. Off track, `offset` is the slot it stands on minus that slot; a multiple
    of 16 is the period-16 look-alike of the target (same low four address bits, see
    `address_score_periodicity`), anything else a far address that out-scores the target.

    Args:
        model: a suite PANM (`PanmSeq2Seq`).
        task: `"copy"` or `"reverse"`.
        length: test length (number of input tokens).
        num_samples: test samples.
        seed: seeds the test inputs.

    Returns:
        `{"token_accuracy": [per step], "on_track": [per unit, [per step]], "first_step_off_track":
        [per unit, the first step (1-based) at which fewer than half the samples are on track, or None],
        "off_track_period16": [per unit, share of off-track (sample, step) pairs whose offset is a
        nonzero multiple of 16]}`.
    """
    if task not in WALK_TARGETS:
        raise ValueError(f"pointer_walk covers {sorted(WALK_TARGETS)}, whose targets are single slots; got {task!r}.")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batch = make_batch(task, num_samples, length, generator=torch.Generator().manual_seed(seed)).to(device)
    steps = batch.labels.shape[1]
    out = model(batch.inputs, batch.attention_mask, steps, output_attentions=True)
    token_accuracy = (out.logits.argmax(dim=-1) == batch.labels).float().mean(dim=0)  # (steps,)
    stands_on = out.address_attentions.argmax(dim=-1)  # (batch, steps, units)
    target = WALK_TARGETS[task](torch.arange(1, steps + 1, device=device), length)  # (steps,)
    offset = stands_on - target.reshape(1, steps, 1)  # (batch, steps, units)
    on_track = (offset == 0).float().mean(dim=0)  # (steps, units)
    off = offset != 0
    period16 = off & (offset % 16 == 0)
    first_off = []
    for unit_track in on_track.T:  # per unit
        below = torch.nonzero(unit_track < 0.5)
        first_off.append(int(below[0, 0]) + 1 if len(below) else None)
    model.train(was_training)
    return {
        "token_accuracy": token_accuracy.tolist(),
        "on_track": on_track.T.tolist(),
        "first_step_off_track": first_off,
        "off_track_period16": (period16.sum(dim=(0, 1)) / off.sum(dim=(0, 1)).clamp_min(1)).tolist(),
    }
