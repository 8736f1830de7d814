"""`controller_reset_rate`: in training, some samples' Controller state goes back to `h^c_0` at one step (beyond
the paper)."""

import pytest
import torch
from conftest import tiny_memory

from panm_hf import PanmConfig, PanmMemoryConfig

STEPS = 9
KINDS = [
    {"recurrence_kernel": "eager"},
    {"recurrence_kernel": "auto"},  # the fused C kernel where a compiler is found, else eager again
    {"controller_cell": "lstm"},
    {"content_read": "controller"},  # the Controller steps one at a time
    {"controller_truncation": 3},  # the reset splits the truncated spans again
]


def spy_draws(controller):
    """Record each `reset_draw` the controller makes: a list of `(step, chosen (batch, 1))`."""
    draws, draw = [], controller.reset_draw

    def recorded(hidden, steps):
        result = draw(hidden, steps)
        draws.append(result)
        return result

    controller.reset_draw = recorded
    return draws


def run(memory, states, decoder, base):
    """`(outputs (batch, steps, out), the gradient of the last step's output per sample and decoder step (batch,
    steps))`: the last step's output reaches an earlier step's `z_t` only through the Controller's recurrence."""
    decoder = decoder.clone().requires_grad_(True)
    out = memory(states, decoder, base_address=base)
    out.hidden_states[:, -1].sum().backward()
    return out.hidden_states.detach(), decoder.grad.abs().sum(dim=-1)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: "-".join(map(str, kind.values())))
def test_a_reset_sample_forgets_the_steps_before_it_and_the_others_run_as_without(kind):
    plain, reset = tiny_memory(**kind), tiny_memory(controller_reset_rate=0.5, **kind)
    reset.load_state_dict(plain.state_dict())
    states, decoder, base = torch.randn(6, 5, 8), torch.randn(6, STEPS, 6), torch.tensor([3, 9, 0, 1, 30, 7])
    plain.train(), reset.train()
    draws = spy_draws(reset.controller)
    seen_reset, seen_kept = False, False
    for seed in range(4):
        torch.manual_seed(seed)  # the truncated spans draw the same first cut in both models
        plain_out, plain_grad = run(plain, states, decoder, base)
        torch.manual_seed(seed)
        reset_out, reset_grad = run(reset, states, decoder, base)
        step, chosen = draws[-1]
        chosen = chosen.squeeze(-1)  # (batch,)
        assert 1 <= step < STEPS
        torch.testing.assert_close(reset_out[:, :step], plain_out[:, :step])  # nothing changes before the reset
        torch.testing.assert_close(reset_out[~chosen], plain_out[~chosen])  # nor for the samples kept
        torch.testing.assert_close(reset_grad[~chosen], plain_grad[~chosen])
        if chosen.any():
            seen_reset = True
            assert not torch.allclose(reset_out[chosen, step:], plain_out[chosen, step:])
            assert torch.all(reset_grad[chosen, :step] == 0)  # the steps before the reset no longer reach the output
            assert torch.all(reset_grad[chosen, -1] > 0)
        seen_kept = seen_kept or bool((~chosen).any())
    assert seen_reset and seen_kept


def test_the_reset_step_is_drawn_per_call_and_eval_draws_none():
    controller = tiny_memory(controller_reset_rate=0.5).controller.train()
    hidden = torch.zeros(400, 12)
    steps, shares = set(), []
    for seed in range(60):
        torch.manual_seed(seed)
        step, chosen = controller.reset_draw(hidden, 6)
        steps.add(step)
        shares.append(chosen.float().mean().item())
    assert steps == {1, 2, 3, 4, 5}
    assert 0.45 < sum(shares) / len(shares) < 0.55
    assert controller.reset_draw(hidden, 1) == (None, None)
    controller.eval()
    assert controller.reset_draw(hidden, 6) == (None, None)


@pytest.mark.parametrize("value", [-0.1, 1.0, True, "0.5"])
def test_reset_rate_must_be_a_probability(value):
    with pytest.raises(ValueError, match=r"controller_reset_rate must be a probability in \[0, 1\)"):
        PanmMemoryConfig(controller_reset_rate=value)


def test_reset_refuses_input_feeding():
    with pytest.raises(ValueError, match="controller_reset_rate=0.5 .* input_feeding runs the Controller one token"):
        PanmConfig(controller_reset_rate=0.5, input_feeding=True)
