"""Input feeding (`PanmConfig.input_feeding`): the Controller's state in the decoder's next input."""

from __future__ import annotations

import pytest
import torch
from conftest import BACKBONES, TINY_PANM, greedy_matching_teacher_forcing
from transformers import GPT2Config

from panm_hf import PanmConfig, PanmForCausalLM, PanmForSeq2SeqLM, PanmMemoryConfig

SOURCE = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 1]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
LABELS = torch.tensor([[7, 8, 9, 10, 2], [11, 9, 2, -100, -100]])
# the SCAN one design's decoder: no positions, a window, g^o reading z_t, the decoder content read
ONE_DESIGN = {"decoder_positions": "none", "decoder_window": 3, "output_decoder_input": True, "content_read": "decoder"}


def pair(backbone: str = "bart", **fields) -> tuple[PanmForSeq2SeqLM, PanmForSeq2SeqLM]:
    """The same seeded model with and without input feeding, sharing every other weight, in eval mode."""
    made = []
    for feed in (False, True):
        torch.manual_seed(0)
        config = PanmConfig(text_config=BACKBONES[backbone]().to_dict(), placement="replace", input_feeding=feed,
                            **TINY_PANM, **fields)  # fmt: skip
        made.append(PanmForSeq2SeqLM(config).eval())
    plain, fed = made
    fed.load_state_dict(plain.state_dict(), strict=False)  # all but the feed's projection
    return plain, fed


def activate_feed(model: PanmForSeq2SeqLM, seed: int = 3) -> None:
    generator = torch.Generator().manual_seed(seed)
    weight = model.input_feed.projection.weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=generator))


@pytest.mark.parametrize("backbone", ["bart", "marian", "mbart", "t5", "encoder-decoder"])
def test_an_untrained_feed_leaves_the_model_as_without_it(backbone):
    windowed = backbone in ("bart", "marian", "mbart")
    fields = ONE_DESIGN if windowed else {"output_decoder_input": True, "content_read": "decoder"}
    plain, fed = pair(backbone, **fields)
    assert torch.count_nonzero(fed.input_feed.projection.weight) == 0
    with torch.no_grad():
        expected = plain(input_ids=SOURCE, attention_mask=MASK, labels=LABELS)
        got = fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-5)


def test_the_fed_state_changes_the_logits_and_learns():
    plain, fed = pair(**ONE_DESIGN)
    activate_feed(fed)
    with torch.no_grad():
        expected = plain(input_ids=SOURCE, attention_mask=MASK, labels=LABELS).logits
    fed.train()
    output = fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS)
    fed.eval()
    with torch.no_grad():
        got = fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS).logits
    # the first step reads h^c_0, the later ones the state after each token: every step moves
    assert (got - expected).abs().amax(dim=(0, 2)).min() > 1e-4
    output.loss.backward()
    assert fed.input_feed.projection.weight.grad.abs().sum() > 0
    # the Controller's GRU gets gradient through the decoder's input as well as through its own output
    assert fed.panm.controller.gru.weight_hh_l0.grad.abs().sum() > 0


@pytest.mark.parametrize("backbone,cell", [("bart", "gru"), ("t5", "gru"), ("bart", "lstm")])
def test_cached_decoding_equals_the_teacher_forced_pass(backbone, cell):
    # an LSTM Controller's state is [h, c]: the feed reads its h (a 2x-wide input would not fit the projection)
    fields = {**(ONE_DESIGN if backbone == "bart" else {"content_read": "decoder"}), "controller_cell": cell}
    _, fed = pair(backbone, **fields)
    activate_feed(fed)
    generated = greedy_matching_teacher_forcing(fed, SOURCE, MASK, steps=7)
    # the same tokens fed one call at a time through the cache give the one-call logits
    with torch.no_grad():
        whole = fed(input_ids=SOURCE, attention_mask=MASK, decoder_input_ids=generated).logits
        cache, steps = None, []
        for t in range(generated.shape[1]):
            out = fed(input_ids=SOURCE, attention_mask=MASK, decoder_input_ids=generated[:, t : t + 1], cache=cache,
                      use_cache=True)  # fmt: skip
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-5, atol=1e-5)


def test_beam_search_reorders_the_fed_state_with_the_beams():
    _, fed = pair(**ONE_DESIGN)
    activate_feed(fed)
    beams = fed.generate(input_ids=SOURCE, attention_mask=MASK, num_beams=3, num_return_sequences=3, max_new_tokens=6,
                         length_penalty=0.0, do_sample=False, output_scores=True, return_dict_in_generate=True,
                         forced_eos_token_id=None)  # fmt: skip
    # each returned beam's score is its teacher-forced log-likelihood: the fed state followed its beam
    with torch.no_grad():
        logits = fed(input_ids=SOURCE.repeat_interleave(3, 0), attention_mask=MASK.repeat_interleave(3, 0),
                     decoder_input_ids=beams.sequences[:, :-1]).logits  # fmt: skip
    targets = beams.sequences[:, 1:]  # (beams, new_tokens)
    log_probs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (beams, new_tokens)
    is_eos = (targets == fed.config.eos_token_id).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # padding after each beam's first EOS
    expected = log_probs.masked_fill(after_eos, 0.0).sum(-1)
    torch.testing.assert_close(beams.sequences_scores, expected, rtol=1e-4, atol=1e-4)
    assert len(set(map(tuple, beams.sequences.tolist()))) > 2  # distinct beams, so reordering mattered


def test_hidden_states_and_attentions_are_joined_as_one_call_gives_them():
    plain, fed = pair(**ONE_DESIGN)
    for model in (plain, fed):
        model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = plain(input_ids=SOURCE, attention_mask=MASK, labels=LABELS, output_attentions=True,
                         output_hidden_states=True)  # fmt: skip
        got = fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS, output_attentions=True,
                  output_hidden_states=True)  # fmt: skip
    for name in ("decoder_hidden_states", "decoder_attentions", "cross_attentions"):
        assert len(getattr(got, name)) == len(getattr(expected, name)) > 0, name
        for a, b in zip(getattr(got, name), getattr(expected, name)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    for name in ("address_attentions", "mode2_attentions"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-5, msg=name)


def test_the_feed_saves_and_loads(tmp_path):
    _, fed = pair(**ONE_DESIGN)
    activate_feed(fed)
    fed.save_pretrained(tmp_path)
    loaded = PanmForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.config.input_feeding is True
    torch.testing.assert_close(loaded.input_feed.projection.weight, fed.input_feed.projection.weight, rtol=0, atol=0)
    with torch.no_grad():
        expected = fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS).logits
        got = loaded(input_ids=SOURCE, attention_mask=MASK, labels=LABELS).logits
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_bad_input_feeding_settings_name_the_field_and_the_fix():
    with pytest.raises(ValueError, match="input_feeding must be True or False"):
        PanmConfig(text_config=BACKBONES["bart"]().to_dict(), input_feeding="yes")
    gpt2 = GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, vocab_size=40).to_dict()
    with pytest.raises(ValueError, match="input_feeding is an option of PanmForSeq2SeqLM"):
        PanmForCausalLM(PanmConfig(text_config=gpt2, input_feeding=True))
    _, fed = pair(**ONE_DESIGN)
    decoder_inputs = torch.tensor([[2, 7, 8], [2, 11, 9]])
    with pytest.raises(ValueError, match="decoder_attention_mask covers 2 tokens"):
        fed(input_ids=SOURCE, attention_mask=MASK, decoder_input_ids=decoder_inputs,
            decoder_attention_mask=torch.ones(2, 2, dtype=torch.long))  # fmt: skip
    enable = getattr(fed, "activation_checkpointing_enable", None) or fed.gradient_checkpointing_enable
    enable()
    fed.train()
    with pytest.raises(ValueError, match="gradient checkpointing drops the cache"):
        fed(input_ids=SOURCE, attention_mask=MASK, labels=LABELS)


def test_the_examples_flag_builds_and_reloads_a_fed_model(tmp_path):
    from panm_hf.pipelines.seq2seq import ModelArguments, build_model

    panm_args = PanmMemoryConfig(**TINY_PANM)
    fed = build_model("panm", ModelArguments(placement="replace", input_feeding=True), panm_args, BACKBONES["bart"]())
    assert fed.config.input_feeding and fed.input_feed is not None
    plain = build_model("panm", ModelArguments(placement="replace"), panm_args, BACKBONES["bart"]())
    assert plain.input_feed is None
    activate_feed(fed)
    fed.save_pretrained(tmp_path / "panm")
    transformer = build_model("transformer", ModelArguments(), panm_args, BACKBONES["bart"]())
    transformer.save_pretrained(tmp_path / "transformer")
    # evaluating the checkpoint with the flag left out keeps the feed it was trained with
    loaded = build_model("panm", ModelArguments(placement="replace"), panm_args, str(tmp_path / "panm"))
    assert loaded.config.input_feeding and loaded.input_feed is not None
    torch.testing.assert_close(loaded.input_feed.projection.weight, fed.input_feed.projection.weight, rtol=0, atol=0)
    # a plain Transformer's checkpoint wrapped with the flag gets a feed
    wrapped = build_model("panm", ModelArguments(placement="replace", input_feeding=True), panm_args,
                          str(tmp_path / "transformer"))  # fmt: skip
    assert wrapped.config.input_feeding and wrapped.input_feed is not None


FED_CORES = [
    {"controller_cell": "gru"},
    {"controller_cell": "lstm"},
    {"content_read": "decoder", "content_read_keys": "end_distance", "output_decoder_input": True},
    {"content_read": "controller", "num_mode2_heads": 0},
    {"content_read": "decoder", "controller_cell": "lstm", "num_mode2_heads": 2},
]


@pytest.mark.parametrize("fields", FED_CORES, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_the_fed_core_equals_forward_on_the_same_decoder_states(fields):
    # a decoder step that ignores h^c: the stepwise order must give forward's outputs, state, attentions, gradients
    from conftest import tiny_memory

    memory = tiny_memory(**fields)
    states = torch.randn(2, 6, 8, requires_grad=True)
    decoder = torch.randn(2, 5, 6, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    bound = memory.bind(states, mask)
    expected = memory(bound, decoder, output_attentions=True)
    got = memory.forward_fed(bound, lambda t, hidden: decoder[:, t : t + 1], 5, output_attentions=True)
    for name in ("hidden_states", "address_attentions", "mode2_attentions", "content_attentions"):
        if getattr(expected, name) is None:
            assert getattr(got, name) is None, name
            continue
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-6)
    for name in ("controller_hidden", "pointers", "pointer_hidden", "pointer_weights"):
        torch.testing.assert_close(getattr(got.state, name), getattr(expected.state, name), rtol=1e-5, atol=1e-6)
    expected_grads = torch.autograd.grad(expected.hidden_states.square().sum(), (states, decoder))
    got_grads = torch.autograd.grad(got.hidden_states.square().sum(), (states, decoder))
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_the_fed_core_gives_each_step_the_previous_controller_state():
    from conftest import tiny_memory

    memory = tiny_memory()
    bound = memory.bind(torch.randn(2, 6, 8), torch.ones(2, 6, dtype=torch.long))
    seen, projection = [], torch.randn(12, 6)

    def decoder_step(t, hidden):
        seen.append(hidden)
        return (hidden @ projection).unsqueeze(1)  # (batch, 1, 6)

    output = memory.forward_fed(bound, decoder_step, 4)
    torch.testing.assert_close(seen[0], memory.initial_state(bound).controller_hidden)
    for t in range(1, 4):  # step t saw h^c_{t-1}: rerunning steps 0..t-1 ends in it
        state = memory.forward_fed(bound, decoder_step, t).state
        torch.testing.assert_close(seen[t], state.controller_hidden)
    assert not torch.equal(output.state.controller_hidden, seen[-1])


@pytest.mark.parametrize("field,scope", [("panm_drop_path", None), ("output_decoder_drop_path", "sample"),
                                         ("output_decoder_drop_path", "step")])  # fmt: skip
def test_fed_drop_path_keeps_or_drops_a_sample_at_every_step(field, scope):
    # drop-path is per sample over the whole target, as in forward (not drawn anew at every step), unless
    # output_decoder_drop_scope="step" asks for each step on its own
    from conftest import tiny_memory

    scoped = {} if scope is None else {"output_decoder_drop_scope": scope}
    memory = tiny_memory(
        **{field: 0.5, "output_decoder_input": True, "panm_dropout": 0.0, **scoped}, undecoded_output=True
    ).train()
    batch, steps = 64, 6
    decoder = torch.randn(batch, steps, 6)
    bound = memory.bind(torch.randn(batch, 5, 8), torch.ones(batch, 5, dtype=torch.long))
    torch.manual_seed(1)
    output = memory.forward_fed(bound, lambda t, hidden: decoder[:, t : t + 1], steps)
    if field == "panm_drop_path":
        dropped = (output.hidden_states == 0).all(dim=-1)  # (batch, steps)
    else:  # a step whose g^o lost z_t gives g^o's output without the z_t columns
        dropped = torch.isclose(output.hidden_states, output.undecoded_hidden_states, atol=1e-6).all(dim=-1)
    if scope == "step":  # about half of all (sample, step) pairs, and samples dropped at some steps only
        assert 0.3 < dropped.float().mean() < 0.7
        assert not torch.equal(dropped, dropped[:, :1].expand(-1, steps))
        return
    assert torch.equal(dropped, dropped[:, :1].expand(-1, steps)), "a sample dropped at some steps only"
    assert 0 < dropped[:, 0].sum() < batch


@pytest.mark.parametrize("scope", ["sample", "step"])
def test_the_drop_scope_is_the_same_with_and_without_input_feeding(scope):
    # forward and forward_fed draw the same masks from the same seed: equal outputs in training
    from conftest import tiny_memory

    memory = tiny_memory(output_decoder_input=True, output_decoder_drop_path=0.5, panm_dropout=0.0,
                         output_decoder_drop_scope=scope).train()  # fmt: skip
    decoder = torch.randn(16, 5, 6)
    bound = memory.bind(torch.randn(16, 6, 8), torch.ones(16, 6, dtype=torch.long))
    torch.manual_seed(2)
    expected = memory(bound, decoder).hidden_states
    torch.manual_seed(2)
    got = memory.forward_fed(bound, lambda t, hidden: decoder[:, t : t + 1], 5).hidden_states
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
