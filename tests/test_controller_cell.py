"""`controller_cell="lstm"`: the Controller's recurrence as an LSTM (beyond the paper), its state `[h, c]`."""

import pytest
import torch
from conftest import greedy_matching_teacher_forcing, tiny_memory, tiny_replace_seq2seq

from panm_hf import PanmForSeq2SeqLM, PanmMemoryConfig


def written_out(memory, states, decoder, mask):
    """The LSTM Controller's outputs and last `[h, c]` from nn.LSTMCell's equations, one step at a time."""
    start = memory.initial_state(memory.bind(states, mask))
    controller, seen = memory.controller, []
    hook = controller.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    full = memory(states, decoder, attention_mask=mask)
    hook.remove()
    lstm = controller.lstm
    cell = torch.nn.LSTMCell(lstm.input_size, lstm.hidden_size)
    cell.load_state_dict({name[:-3]: value for name, value in lstm.state_dict().items()})  # drop "_l0"
    pooled = (states * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)  # (batch, dim): h_0's mean
    h, c = controller.initial_state(pooled), torch.zeros(states.shape[0], lstm.hidden_size)
    torch.testing.assert_close(start.controller_hidden, torch.cat([h, c], dim=-1))
    # the reads the memory passed (they do not depend on the Controller's state), then the Controller by hand
    reads = seen[0].reshape(states.shape[0], decoder.shape[1], -1)  # (batch, steps, read_size)
    outputs = []
    for t in range(decoder.shape[1]):
        h, c = cell(torch.cat([reads[:, t], decoder[:, t]], dim=-1), (h, c))
        outputs.append(controller.output_mlp(torch.cat([reads[:, t], h], dim=-1)))
    return full, torch.stack(outputs, dim=1), torch.cat([h, c], dim=-1)


def test_lstm_controller_is_an_lstm_from_h0_and_zero_cell_and_g_o_reads_h():
    memory = tiny_memory(controller_cell="lstm")
    assert memory.controller.gru is None and isinstance(memory.controller.lstm, torch.nn.LSTM)
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    full, outputs, last = written_out(memory, states, decoder, mask)
    torch.testing.assert_close(full.hidden_states, outputs)
    torch.testing.assert_close(full.state.controller_hidden, last)
    assert full.state.controller_hidden.shape == (2, 24)  # [h, c], twice controller_hidden_size
    gru = tiny_memory()
    assert not torch.allclose(gru(states, decoder, attention_mask=mask).hidden_states, full.hidden_states)


def test_lstm_controller_gets_gradients_in_every_parameter():  # step-by-step decoding: tests/test_memory.py
    memory = tiny_memory(controller_cell="lstm").train()
    states, decoder = torch.randn(2, 6, 8), torch.randn(2, 5, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    memory(states, decoder, attention_mask=mask).hidden_states.square().sum().backward()
    for name, parameter in memory.controller.lstm.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_lstm_controller_keeps_its_state_on_steps_outside_the_step_mask():
    controller = tiny_memory(controller_cell="lstm").controller
    reads, decoder = torch.randn(2, 4, 24), torch.randn(2, 4, 6)
    hidden = torch.randn(2, 24)
    step_mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    _, last, _ = controller(reads, decoder, hidden, step_mask=step_mask)
    _, first_two, _ = controller(reads[:, :2], decoder[:, :2], hidden)  # what row 0 ends on
    _, all_four, _ = controller(reads, decoder, hidden)
    torch.testing.assert_close(last[0], first_two[0])
    torch.testing.assert_close(last[1], all_four[1])
    _, none, _ = controller(reads, decoder, hidden, step_mask=torch.zeros(2, 4, dtype=torch.bool))
    torch.testing.assert_close(none, hidden)  # no real step: the state passes through


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"controller_cell": "rnn"}, "controller_cell='rnn' is not supported"),
        ({"controller_cell": "lstm", "recurrence_kernel": "fused"}, 'controller_cell is "lstm"'),
        ({"controller_cell": "lstm", "content_read": "controller"}, 'content_read="controller" steps'),
    ],
)
def test_controller_cell_errors_name_the_field_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PanmMemoryConfig(**kwargs)


def test_seq2seq_model_with_an_lstm_controller_generates_with_cache_and_beams_and_round_trips(tmp_path):
    model, source, mask, labels = tiny_replace_seq2seq(controller_cell="lstm", content_read="decoder")
    model(input_ids=source, attention_mask=mask, labels=labels).loss.backward()
    assert model.panm.controller.lstm.weight_hh_l0.grad.abs().sum() > 0
    model.eval()
    generated = greedy_matching_teacher_forcing(model, source, mask, 6)  # the cached [h, c] continues the recurrence
    beams = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=3,
                           forced_eos_token_id=None, min_new_tokens=6)  # fmt: skip
    assert beams.shape == (2, 7)
    model.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.controller_cell == "lstm" and "panm.controller.lstm.weight_hh_l0" in loaded.state_dict()
    inputs = {"input_ids": source, "attention_mask": mask, "decoder_input_ids": generated}
    torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits)
