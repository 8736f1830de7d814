"""`controller_truncation`: truncated backpropagation through the Controller's recurrence (beyond the paper)."""

import pytest
import torch
from conftest import tiny_memory, tiny_replace_seq2seq

from panm_hf import PanmConfig, PanmMemoryConfig

STEPS, K = 10, 3
KINDS = [
    {"recurrence_kernel": "eager"},
    {"recurrence_kernel": "auto"},  # the fused C kernel where a compiler is found, else eager again
    {"controller_cell": "lstm"},
    {"content_read": "controller"},  # the Controller steps one at a time
]


def read_gradient(memory, states, decoder, base):
    """The gradient of the last step's output with respect to each step's decoder input `(steps,)`: it reaches
    an earlier step only through the Controller's recurrence."""
    decoder = decoder.clone().requires_grad_(True)
    out = memory(states, decoder, base_address=base)  # training draws the base addresses unless given
    out.hidden_states[:, -1].sum().backward()
    return decoder.grad.abs().sum(dim=(0, 2)), out.hidden_states.detach()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: "-".join(map(str, kind.values())))
def test_truncation_cuts_the_gradient_past_k_steps_and_leaves_the_forward_pass(kind):
    full, cut = tiny_memory(**kind), tiny_memory(controller_truncation=K, **kind)
    cut.load_state_dict(full.state_dict())
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, STEPS, 6)
    base = torch.tensor([3, 9])
    full.train(), cut.train()
    full_grad, full_out = read_gradient(full, states, decoder, base)
    for seed in range(4):  # the first cut falls at step 1-K, drawn per call
        torch.manual_seed(seed)
        cut_grad, cut_out = read_gradient(cut, states, decoder, base)
        torch.testing.assert_close(cut_out, full_out)  # the forward pass is the same
        assert torch.all(cut_grad[: STEPS - K] == 0)  # the last span holds at most K steps
        assert cut_grad[-1] > 0
    assert torch.all(full_grad[: STEPS - K] > 0)
    assert cut.controller.truncated_spans(STEPS) != [(0, STEPS)]
    cut.eval()  # eval: one span
    assert cut.controller.truncated_spans(STEPS) == [(0, STEPS)]


def test_truncated_spans_cover_every_step_once_with_the_first_cut_drawn():
    controller = tiny_memory(controller_truncation=4).controller.train()
    firsts = set()
    for seed in range(40):
        torch.manual_seed(seed)
        spans = controller.truncated_spans(11)
        assert [start for start, _ in spans[1:]] == [end for _, end in spans[:-1]]
        assert spans[0][0] == 0 and spans[-1][1] == 11
        assert all(end - start == 4 for start, end in spans[1:-1]) and 1 <= spans[-1][1] - spans[-1][0] <= 4
        firsts.add(spans[0][1])
    assert firsts == {1, 2, 3, 4}
    assert controller.truncated_spans(1) == [(0, 1)]


@pytest.mark.parametrize("option", [{"controller_truncation": 2}, {"controller_reset_rate": 0.5}], ids=str)
def test_a_model_with_a_training_only_controller_option_trains_and_in_eval_equals_the_plain_one(option):
    """`controller_truncation` and `controller_reset_rate` (test_controller_reset.py) act in training only."""
    model, source, mask, labels = tiny_replace_seq2seq(**option)
    uncut, *_ = tiny_replace_seq2seq()  # the same seed: the same weights
    model.train()
    loss = model(input_ids=source, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.panm.controller.gru.weight_hh_l0.grad.abs().sum() > 0
    model.eval(), uncut.eval()
    with torch.no_grad():  # eval runs every step in one span
        torch.testing.assert_close(model(input_ids=source, attention_mask=mask, labels=labels).logits,
                                   uncut(input_ids=source, attention_mask=mask, labels=labels).logits)  # fmt: skip
    generate = {"input_ids": source, "attention_mask": mask, "max_new_tokens": 4, "do_sample": False}
    assert torch.equal(model.generate(**generate), uncut.generate(**generate))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"controller_truncation": -1}, r"controller_truncation must be an integer >= 0 \(got -1\); 0 disables"),
        ({"controller_truncation": True}, "controller_truncation must be an integer, not the bool True"),
        ({"controller_truncation": 2.5}, r"controller_truncation must be an integer >= 0 \(got 2.5\)"),
    ],
)
def test_truncation_errors_name_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PanmMemoryConfig(**kwargs)


def test_truncation_refuses_input_feeding():
    with pytest.raises(ValueError, match="controller_truncation=4 .* input_feeding runs the Controller one token"):
        PanmConfig(controller_truncation=4, input_feeding=True)
