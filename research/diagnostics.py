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
