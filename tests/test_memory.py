"""The backbone-agnostic memory core: principle II, masking, state, shapes, errors."""

import pytest
import torch
from conftest import tiny_memory

from panm_hf.addressing import binary_codes
from panm_hf.memory import initial_pointer_offsets

tiny = tiny_memory


@pytest.mark.parametrize("address_key", ["mlp", "linear"])
@pytest.mark.parametrize("scoring", ["dot", "cosine"])
def test_pointer_units_never_see_memory_content(scoring, address_key):
    memory = tiny(scoring=scoring, address_key=address_key)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    states = torch.randn(2, 5, 8, requires_grad=True)
    decoder = torch.randn(2, 4, 6)
    out = memory(states, decoder, attention_mask=mask, output_attentions=True)
    other = memory(torch.randn(2, 5, 8) * 10, torch.randn(2, 4, 6), attention_mask=mask, output_attentions=True)
    # same addresses => same pointers, whatever the content and the decoder inputs
    assert torch.equal(out.address_attentions, other.address_attentions)
    assert torch.equal(out.state.pointers, other.state.pointers)
    # and there is no autograd path from memory content to the pointers
    (grad,) = torch.autograd.grad(out.address_attentions.sum(), states, allow_unused=True)
    assert grad is None
    # while the Controller output does depend on the content
    assert not torch.allclose(out.hidden_states, other.hidden_states)


def test_padding_invariance_and_zero_weight_on_padding():
    memory = tiny()
    states, decoder = torch.randn(1, 4, 8), torch.randn(1, 3, 6)
    alone = memory(states, decoder, output_attentions=True)
    padded_states = torch.cat([states, torch.randn(1, 3, 8) * 100], dim=1)
    padded = memory(padded_states, decoder, attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0, 0]]),
                    output_attentions=True)
    assert torch.allclose(alone.hidden_states, padded.hidden_states, atol=1e-5)
    assert torch.equal(padded.address_attentions[..., 4:], torch.zeros_like(padded.address_attentions[..., 4:]))
    assert torch.equal(padded.mode2_attentions[..., 4:], torch.zeros_like(padded.mode2_attentions[..., 4:]))
    assert torch.allclose(padded.address_attentions.sum(-1), torch.ones(1, 3, 2))


def test_batch_independence():
    memory = tiny()
    states, decoder = torch.randn(3, 5, 8), torch.randn(3, 4, 6)
    batched = memory(states, decoder, base_address=torch.tensor([3, 17, 30]))
    for i, base in enumerate([3, 17, 30]):
        single = memory(states[i : i + 1], decoder[i : i + 1], base_address=torch.tensor([base]))
        assert torch.allclose(batched.hidden_states[i], single.hidden_states[0], atol=1e-5)


@pytest.mark.parametrize("controller_cell", ["gru", "lstm"])
def test_step_by_step_equals_all_steps_at_once(controller_cell):
    memory = tiny(controller_cell=controller_cell)
    states, decoder = torch.randn(2, 6, 8), torch.randn(2, 5, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    full = memory(states, decoder, attention_mask=mask)
    bound, state, outputs = memory.bind(states, mask), None, []
    for t in range(5):
        step = memory(bound, decoder[:, t : t + 1], state=state)
        state = step.state
        outputs.append(step.hidden_states)
    assert torch.allclose(torch.cat(outputs, dim=1), full.hidden_states, atol=1e-6)
    assert torch.allclose(state.controller_hidden, full.state.controller_hidden, atol=1e-6)


def test_state_index_select_reorders_every_field():
    memory = tiny()
    out = memory(torch.randn(3, 4, 8), torch.randn(3, 2, 6))
    order = torch.tensor([2, 0, 0])
    reordered = out.state.index_select(order)
    assert torch.equal(reordered.pointers, out.state.pointers[order])
    assert torch.equal(reordered.pointer_hidden, out.state.pointer_hidden[order])
    assert torch.equal(reordered.controller_hidden, out.state.controller_hidden[order])
    assert torch.equal(out.memory.index_select(order).address_bank, out.memory.address_bank[order])


@pytest.mark.parametrize("units", range(1, 9))
def test_integer_start_offsets_equal_the_rounded_fractions(units):
    """Unit k >= 2 at fraction (k - 1) / (units - 1) of the last slot, rounded half up (the float formula)."""
    lengths = torch.arange(0, 300)
    fractions = [0.0, 1.0] + [k / (units - 1) for k in range(1, units - 1)]
    last = (lengths - 1).clamp(min=0).unsqueeze(-1).double()  # (batch, 1)
    expected = torch.floor(last * torch.tensor(fractions[:units], dtype=torch.float64) + 0.5).long()
    assert torch.equal(initial_pointer_offsets(lengths, units), expected)


def test_initial_pointers_base_end_middle():
    lengths = torch.tensor([5, 1, 8])
    assert initial_pointer_offsets(lengths, 2).tolist() == [[0, 4], [0, 0], [0, 7]]
    assert initial_pointer_offsets(lengths, 3).tolist() == [[0, 4, 2], [0, 0, 0], [0, 7, 4]]
    memory = tiny(num_pointer_units=3)
    bound = memory.bind(torch.randn(1, 5, 8), base_address=torch.tensor([29]))
    pointers = memory.initial_state(bound).pointers[0]
    assert torch.equal(pointers, binary_codes(torch.tensor([29, 1, 31]), 5))  # 29+4 and 29+2 wrap mod 32


def test_all_padding_row_is_finite():
    memory = tiny()
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    out = memory(torch.randn(2, 3, 8), torch.randn(2, 2, 6), attention_mask=mask, output_attentions=True)
    assert torch.isfinite(out.hidden_states).all()
    assert torch.equal(out.address_attentions[0], torch.zeros(2, 2, 3))


def test_controller_without_decoder_input_and_without_mode2():
    memory = tiny(decoder_input_size=0, num_mode2_heads=0)
    out = memory(torch.randn(2, 4, 8), num_steps=7, output_attentions=True)
    assert out.hidden_states.shape == (2, 7, 5)
    assert out.address_attentions.shape == (2, 7, 2, 4)
    assert out.mode2_attentions is None


def test_sum_and_mean_controller_init():
    states = torch.ones(1, 4, 8)
    mean_memory, sum_memory = tiny(controller_init="mean"), tiny(controller_init="sum")
    sum_memory.load_state_dict(mean_memory.state_dict())
    projection = mean_memory.controller.initial_state
    mean_h = mean_memory.initial_state(mean_memory.bind(states)).controller_hidden
    sum_h = sum_memory.initial_state(sum_memory.bind(states)).controller_hidden
    assert torch.allclose(mean_h, projection(torch.ones(1, 8)), atol=1e-6)
    assert torch.allclose(sum_h, projection(4 * torch.ones(1, 8)), atol=1e-6)


def test_gradients_reach_every_parameter():
    for scoring in ("dot", "cosine"):
        memory = tiny(scoring=scoring).train()
        out = memory(torch.randn(4, 6, 8), torch.randn(4, 5, 6))
        out.hidden_states.pow(2).sum().backward()
        for name, parameter in memory.named_parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_shape_errors_name_expected_and_actual():
    memory = tiny()
    with pytest.raises(ValueError, match=r"\(batch, slots, 8\).*\(2, 4, 7\)"):
        memory(torch.randn(2, 4, 7), torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"\(2, steps, 6\)"):
        memory(torch.randn(2, 4, 8), torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        memory(torch.randn(2, 4, 8), torch.randn(2, 3, 6), attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="base_address"):
        memory(torch.randn(2, 4, 8), torch.randn(2, 3, 6), base_address=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="num_steps"):
        tiny(decoder_input_size=0)(torch.randn(2, 4, 8))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"address_bits": 0}, "address_bits"), ({"num_pointer_units": 0}, "num_pointer_units"),
     ({"num_mode2_heads": -1}, "num_mode2_heads"), ({"scoring": "l2"}, "scoring"),
     ({"controller_init": "max"}, "controller_init")],
)
def test_hyperparameter_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kwargs)


def test_bf16_autocast_is_finite():
    memory = tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = memory(torch.randn(2, 5, 8), torch.randn(2, 3, 6))
    assert torch.isfinite(out.hidden_states.float()).all()


def reference_pointer_units(units, pointers, hidden, bank, mask, num_steps):
    """Eqs. 1-3 written plainly, one Pointer Unit at a time (the fused path must match it)."""
    cell, mlp, scorer = units.cell, units.address_mlp, units.scorer
    all_weights = []
    for _ in range(num_steps):
        new_pointers, new_hidden, step_weights = [], [], []
        for h in range(units.num_pointer_units):
            gates_i = pointers[:, h] @ cell.input_gates.weight[h] + cell.input_gates.bias[h]
            gates_h = hidden[:, h] @ cell.hidden_gates.weight[h] + cell.hidden_gates.bias[h]
            r_i, z_i, n_i = gates_i.chunk(3, -1)
            r_h, z_h, n_h = gates_h.chunk(3, -1)
            r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
            h_new = (1 - z) * torch.tanh(n_i + r * n_h) + z * hidden[:, h]
            if len(mlp) == 1:  # address_key="linear": g^a_h is affine
                keys = bank @ mlp[0].weight[h] + mlp[0].bias[h]  # (batch, slots, hidden)
            else:
                key_hidden = torch.relu(bank @ mlp[0].weight[h] + mlp[0].bias[h])
                keys = key_hidden @ mlp[2].weight[h] + mlp[2].bias[h]  # (batch, slots, hidden) = g^a_h(A)
            if scorer.scoring == "cosine":
                scores = torch.nn.functional.cosine_similarity(h_new.unsqueeze(1), keys, dim=-1)
                scores = scores * scorer.inverse_temperature
            else:
                scores = (keys @ h_new.unsqueeze(-1)).squeeze(-1) / keys.shape[-1] ** 0.5
            weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            new_pointers.append(weights.unsqueeze(1) @ bank)
            new_hidden.append(h_new)
            step_weights.append(weights)
        pointers = torch.cat(new_pointers, dim=1)
        hidden = torch.stack(new_hidden, dim=1)
        all_weights.append(torch.stack(step_weights, dim=1))
    return torch.stack(all_weights, dim=1), pointers, hidden


@pytest.mark.parametrize("address_key", ["mlp", "linear"])
@pytest.mark.parametrize("scoring", ["dot", "cosine"])
def test_fused_pointer_units_match_the_plain_equations(scoring, address_key):
    memory = tiny(scoring=scoring, num_pointer_units=3, address_key=address_key)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    bound = memory.bind(torch.randn(2, 6, 8), mask, base_address=torch.tensor([7, 30]))
    state = memory.initial_state(bound)
    fused = memory.pointer_units(state.pointers, state.pointer_hidden, bound.address_bank,
                                 bound.address_keys, mask, 4)
    plain = reference_pointer_units(memory.pointer_units, state.pointers, state.pointer_hidden,
                                    bound.address_bank, mask, 4)
    for got, expected in zip(fused, plain):
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("address_key", ["mlp", "linear"])
@pytest.mark.parametrize("scoring", ["dot", "cosine"])
def test_fused_pointer_units_gradients_match_the_plain_equations(scoring, address_key):
    """The fused loop's backward equals the plain transcription's, parameter by parameter."""
    memory = tiny(scoring=scoring, num_pointer_units=2, address_key=address_key)
    units = memory.pointer_units
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    bound = memory.bind(torch.randn(2, 5, 8), mask, base_address=torch.tensor([3, 1021]))
    state = memory.initial_state(bound)
    probe = [torch.randn(2, 4, 2, 5), torch.randn(2, 2, memory.address_bits), torch.randn(2, 2, units.hidden_size)]

    def grads(outputs):
        units.zero_grad(set_to_none=True)
        sum((out * weight).sum() for out, weight in zip(outputs, probe)).backward()
        return {name: p.grad.clone() for name, p in units.named_parameters() if p.grad is not None}

    keys = units.address_keys(bound.address_bank)  # fresh graph per path
    fused = grads(units(state.pointers, state.pointer_hidden, bound.address_bank, keys, mask, 4))
    plain = grads(reference_pointer_units(units, state.pointers, state.pointer_hidden, bound.address_bank, mask, 4))
    assert fused.keys() == plain.keys() and len(fused) >= 6
    for name in fused:
        assert torch.allclose(fused[name], plain[name], atol=1e-5, rtol=1e-4), name


def test_bf16_all_padding_row_stays_finite():
    memory = tiny()
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = memory(torch.randn(2, 3, 8), torch.randn(2, 2, 6), attention_mask=mask, output_attentions=True)
    assert torch.isfinite(out.hidden_states.float()).all()
    assert torch.equal(out.address_attentions[0].float(), torch.zeros(2, 2, 3))


@pytest.mark.slow
def test_compiled_pointer_step_matches_eager():
    memory = tiny()
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    eager = memory(states, decoder, output_attentions=True)
    memory.pointer_units.compile_step()
    compiled = memory(states, decoder, output_attentions=True)
    assert torch.allclose(compiled.address_attentions, eager.address_attentions, atol=1e-5)
    assert torch.allclose(compiled.hidden_states, eager.hidden_states, atol=1e-5)


def test_drop_path_drops_whole_samples_in_training_only():
    memory = tiny(panm_drop_path=0.5).train()
    states, decoder = torch.randn(16, 5, 8), torch.randn(16, 4, 6)
    base = torch.arange(16) * 3
    torch.manual_seed(0)
    dropped = memory(states, decoder, base_address=base).hidden_states  # (16, 4, out)
    memory.drop_path = 0.0
    reference = memory(states, decoder, base_address=base).hidden_states
    zeroed = dropped.flatten(1).abs().amax(dim=1) == 0  # (16,) whole samples, never single steps
    assert 0 < int(zeroed.sum()) < 16
    assert torch.allclose(dropped[~zeroed], reference[~zeroed] / 0.5, atol=1e-6)
    assert reference[zeroed].abs().amax() > 0  # those samples had an output to drop
    memory.drop_path = 0.5
    memory.eval()
    assert torch.equal(memory(states, decoder).hidden_states, memory(states, decoder).hidden_states)
    assert memory(states, decoder).hidden_states.flatten(1).abs().amax(dim=1).min() > 0


def reference_attentive_controller(memory, states, decoder, mask, steps):
    """`content_read="controller"` written out with `nn.GRUCell` on the full input `[reads, z_t, c_t]`."""
    out = memory(states, decoder, attention_mask=mask, num_steps=steps, output_attentions=True)
    controller, reader = memory.controller, memory.controller.content_reader
    cell = torch.nn.GRUCell(controller.gru.input_size, controller.gru.hidden_size)
    cell.load_state_dict({"weight_ih": controller.gru.weight_ih_l0, "weight_hh": controller.gru.weight_hh_l0,
                          "bias_ih": controller.gru.bias_ih_l0, "bias_hh": controller.gru.bias_hh_l0})  # fmt: skip
    bound = memory.bind(states, mask)
    hidden = memory.initial_state(bound).controller_hidden
    mode1 = torch.einsum("btus,bsd->btud", out.address_attentions, states).flatten(2)  # (batch, steps, units*dim)
    mode2 = torch.einsum("bths,bsd->bthd", out.mode2_attentions, states).flatten(2)  # (batch, steps, heads*dim)
    reads = torch.cat([mode1, mode2], dim=-1)
    outputs, weights = [], []
    for t in range(steps):
        scores = reader.score(torch.tanh(reader.key(states) + reader.query(hidden)[:, None])).squeeze(-1)
        weight = torch.softmax(scores.masked_fill(~mask.bool(), -1e9), dim=-1)  # (batch, slots)
        content = torch.einsum("bs,bsd->bd", weight, states)
        parts = [reads[:, t]] + ([decoder[:, t]] if decoder is not None else [])
        hidden = cell(torch.cat([*parts, content], dim=-1), hidden)
        outputs.append(controller.output_mlp(torch.cat([reads[:, t], content, hidden], dim=-1)))
        weights.append(weight)
    return out, torch.stack(outputs, dim=1), torch.stack(weights, dim=1)


@pytest.mark.parametrize("decoder_input_size", [6, 0])
def test_controller_content_read_matches_the_written_out_equations(decoder_input_size):
    memory = tiny(content_read="controller", decoder_input_size=decoder_input_size)
    states = torch.randn(2, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    decoder = torch.randn(2, 5, 6) if decoder_input_size else None
    out, outputs, weights = reference_attentive_controller(memory, states, decoder, mask, 5)
    torch.testing.assert_close(out.hidden_states, outputs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.content_attentions, weights, atol=1e-6, rtol=1e-5)
    assert torch.equal(out.content_attentions[1, :, 4:], torch.zeros(5, 2))  # padding gets exactly zero weight


def test_controller_content_read_follows_the_controller_state_and_keeps_principle_two():
    memory = tiny(content_read="controller")
    states, decoder = torch.randn(2, 6, 8, requires_grad=True), torch.randn(2, 5, 6)
    out = memory(states, decoder, output_attentions=True)
    # the read at step t depends on what the Controller saw before t: other earlier decoder inputs move it
    changed = decoder.clone()
    changed[:, 0] += 3.0
    other = memory(states, changed, output_attentions=True)
    assert torch.equal(out.content_attentions[:, 0], other.content_attentions[:, 0])  # step 0 reads with h^c_0
    assert not torch.allclose(out.content_attentions[:, 1:], other.content_attentions[:, 1:], atol=1e-4)
    # the Pointer Units still see no content: same pointers, no gradient path from M to them
    assert torch.equal(out.address_attentions, other.address_attentions)
    (grad,) = torch.autograd.grad(out.address_attentions.sum(), states, allow_unused=True)
    assert grad is None


@pytest.mark.parametrize("decoder_input_size,output_decoder_input", [(6, False), (0, False), (6, True)])
def test_controller_content_read_step_by_step_equals_all_steps_at_once(decoder_input_size, output_decoder_input):
    # (6, True): g^o reads z_t too, as in the one design with the Controller's read (scan_count.md, point 26)
    memory = tiny(content_read="controller", decoder_input_size=decoder_input_size,
                  output_decoder_input=output_decoder_input)  # fmt: skip
    assert memory.controller.output_reads_decoder == output_decoder_input
    states = torch.randn(2, 6, 8)
    decoder = torch.randn(2, 5, 6) if decoder_input_size else None
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    full = memory(states, decoder, attention_mask=mask, num_steps=5)
    bound, state, outputs = memory.bind(states, mask), None, []
    for t in range(5):
        step = memory(bound, None if decoder is None else decoder[:, t : t + 1], state=state, num_steps=1)
        state, outputs = step.state, outputs + [step.hidden_states]
    torch.testing.assert_close(torch.cat(outputs, dim=1), full.hidden_states, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(state.controller_hidden, full.state.controller_hidden, atol=1e-6, rtol=1e-5)


def test_controller_content_read_rejects_the_fused_kernel():
    from panm_hf import PanmMemoryConfig

    with pytest.raises(ValueError, match='recurrence_kernel="fused" cannot run content_read="controller"'):
        PanmMemoryConfig(content_read="controller", recurrence_kernel="fused")


def test_linear_address_keys_are_affine_in_the_bits():
    """`address_key="linear"` (the authors' code): g^a(a) = W a + c, so for codes with disjoint bits
    g^a(x) + g^a(y) - g^a(0) = g^a(x | y); the paper's MLP keys are not affine."""
    codes = binary_codes(torch.tensor([0, 5, 16, 21]), 5).float()  # 5 | 16 = 21
    for address_key, affine in (("linear", True), ("mlp", False)):
        units = tiny(address_key=address_key).pointer_units
        keys = units.address_mlp(codes.unsqueeze(0).expand(units.num_pointer_units, -1, -1))  # (units, 4, hidden)
        combined = keys[:, 1] + keys[:, 2] - keys[:, 0]
        assert torch.allclose(combined, keys[:, 3], atol=1e-5) == affine, address_key
    linear, mlp = tiny(address_key="linear"), tiny(address_key="mlp")
    assert len(linear.pointer_units.address_mlp) == 1 and len(mlp.pointer_units.address_mlp) == 3


@pytest.mark.parametrize("content_read", ["none", "decoder", "controller"])
def test_output_decoder_input_feeds_z_t_to_g_o_beside_the_gru(content_read):
    """`output_decoder_input=True`: g^o reads [reads, (content), h^c_t, z_t]; its output equals g^o applied to
    those rows, and z_t reaches it even when the GRU ignores z_t (its z_t columns zeroed)."""
    memory = tiny(output_decoder_input=True, content_read=content_read)
    controller = memory.controller
    width = controller.gru.input_size
    with torch.no_grad():  # the GRU's z_t columns (the last 6 of its non-content input) set to zero
        controller.gru.weight_ih_l0[:, width - 6 - (8 if content_read == "controller" else 0) :][:, :6] = 0
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    out = memory(states, decoder, output_attentions=True)
    changed = memory(states, decoder + 1.0, output_attentions=True)
    assert not torch.allclose(out.hidden_states, changed.hidden_states, atol=1e-4)  # g^o: moved by z_t
    # content_read="decoder" queries M with z_t, which reaches the GRU through that read; otherwise the GRU is
    # unmoved by z_t, and without the option the same zeroed GRU makes the output independent of z_t
    if content_read != "decoder":
        torch.testing.assert_close(out.state.controller_hidden, changed.state.controller_hidden)
        plain = tiny(content_read=content_read)
        with torch.no_grad():
            plain.controller.gru.weight_ih_l0.copy_(controller.gru.weight_ih_l0)
        a, b = plain(states, decoder), plain(states, decoder + 1.0)
        torch.testing.assert_close(a.hidden_states, b.hidden_states)
    # step by step (the cached path) equals all steps at once
    bound, state, outputs = memory.bind(states), None, []
    for t in range(4):
        step = memory(bound, decoder[:, t : t + 1], state=state)
        state, outputs = step.state, outputs + [step.hidden_states]
    torch.testing.assert_close(torch.cat(outputs, dim=1), out.hidden_states, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["auto", "eager"])  # "auto": the C kernels where a compiler is
def test_output_decoder_input_gives_the_same_outputs_and_gradients_on_every_kernel(kernel):
    reference = tiny(output_decoder_input=True, content_read="decoder", recurrence_kernel="eager").train()
    memory = tiny(output_decoder_input=True, content_read="decoder", recurrence_kernel=kernel).train()
    memory.load_state_dict(reference.state_dict())
    states, decoder = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    reference, memory = reference.double(), memory.double()
    base = torch.tensor([3, 7])
    outputs = []
    for model in (reference, memory):
        z = decoder.clone().requires_grad_()
        out = model(states, z, base_address=base).hidden_states
        (grad,) = torch.autograd.grad(out.square().sum(), z)
        outputs.append((out, grad))
    torch.testing.assert_close(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("content_read", ["none", "decoder", "controller"])
def test_undecoded_output_is_g_o_without_its_z_t_columns(content_read):
    """`undecoded_output=True` (what `eos_decision="panm"` reads): g^o's output with its z_t columns left out equals
    the same memory's output with those columns of g^o's first layer zeroed; the rest of the output is unchanged."""
    memory = tiny(output_decoder_input=True, content_read=content_read, undecoded_output=True)
    zeroed = tiny(output_decoder_input=True, content_read=content_read)
    zeroed.load_state_dict(memory.state_dict())
    with torch.no_grad():
        zeroed.controller.output_mlp[0].weight[:, -6:] = 0  # g^o's z_t columns (decoder input 6) come last
    states, decoder = torch.randn(2, 5, 8), torch.randn(2, 4, 6)
    out, reference = memory(states, decoder), zeroed(states, decoder)
    torch.testing.assert_close(out.undecoded_hidden_states, reference.hidden_states)
    assert not torch.allclose(out.undecoded_hidden_states, out.hidden_states, atol=1e-4)
    plain = tiny(output_decoder_input=True, content_read=content_read)
    plain.load_state_dict(memory.state_dict())
    torch.testing.assert_close(out.hidden_states, plain(states, decoder).hidden_states)
    assert plain(states, decoder).undecoded_hidden_states is None
    # step by step (the cached path) equals all steps at once
    bound, state, steps = memory.bind(states), None, []
    for t in range(4):
        step = memory(bound, decoder[:, t : t + 1], state=state)
        state, steps = step.state, steps + [step.undecoded_hidden_states]
    torch.testing.assert_close(torch.cat(steps, dim=1), out.undecoded_hidden_states, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("content_read", ["none", "controller"])
def test_output_decoder_drop_path_gives_each_sample_g_o_with_all_or_none_of_its_z_t(content_read):
    """In training, `output_decoder_drop_path` hands each sample's g^o either no z_t at any step (its output is then
    g^o without the z_t columns) or z_t scaled by 1 / (1 - p); in eval it changes nothing."""
    memory = tiny(output_decoder_input=True, output_decoder_drop_path=0.5, content_read=content_read,
                  undecoded_output=True)  # fmt: skip
    scaled = tiny(output_decoder_input=True, content_read=content_read)
    scaled.load_state_dict(memory.state_dict())
    with torch.no_grad():
        scaled.controller.output_mlp[0].weight[:, -6:] *= 2.0  # 1 / (1 - 0.5) on g^o's z_t columns
    states, decoder, base = torch.randn(8, 5, 8), torch.randn(8, 4, 6), torch.arange(8) * 3
    torch.manual_seed(3)
    out = memory.train()(states, decoder, base_address=base)
    kept = scaled(states, decoder, base_address=base).hidden_states
    dropped = (out.hidden_states - out.undecoded_hidden_states).abs().amax(dim=(1, 2)) < 1e-6  # (batch,)
    # each sample is exactly one of the two, at every step
    expected = torch.where(dropped[:, None, None], out.undecoded_hidden_states, kept)  # (batch, steps, out)
    torch.testing.assert_close(out.hidden_states, expected)
    assert 0 < int(dropped.sum()) < 8
    plain = tiny(output_decoder_input=True, content_read=content_read)
    plain.load_state_dict(memory.state_dict())
    torch.testing.assert_close(memory.eval()(states, decoder).hidden_states, plain(states, decoder).hidden_states)


@pytest.mark.parametrize("output_decoder_input", [False, True])
def test_mlp_dropout_drops_g_o_hidden_units_in_training_only_and_keeps_checkpoint_keys(output_decoder_input):
    """`mlp_dropout` zeroes g^o's hidden units (after the ReLU) in training, the rest scaled by 1 / (1 - p), and the
    output is g^o's last linear of exactly that; eval equals a model without it loaded from the same state dict."""
    memory = tiny(mlp_dropout=0.5, output_decoder_input=output_decoder_input)
    plain = tiny(output_decoder_input=output_decoder_input)
    plain.load_state_dict(memory.state_dict())  # strict: the option adds no parameter and moves no key
    first, activation, last = memory.controller.output_mlp
    seen = {}
    hooks = [first.register_forward_hook(lambda m, i, o: seen.update(pre=o)),
             activation.register_forward_hook(lambda m, i, o: seen.update(post=o)),
             last.register_forward_hook(lambda m, i, o: seen.update(out=o))]  # fmt: skip
    states, decoder = torch.randn(4, 5, 8), torch.randn(4, 3, 6)
    memory.train()(states, decoder, base_address=torch.arange(4) * 2)
    for hook in hooks:
        hook.remove()
    relu = seen["pre"].clamp(min=0)
    zeroed = (seen["post"] == 0) & (relu > 0)
    torch.testing.assert_close(torch.where(zeroed, 0.0, relu * 2.0), seen["post"])  # 1 / (1 - 0.5)
    assert 0.3 < float(zeroed.sum() / (relu > 0).sum()) < 0.7
    torch.testing.assert_close(seen["out"], last(seen["post"]))
    torch.testing.assert_close(memory.eval()(states, decoder).hidden_states, plain(states, decoder).hidden_states)
    with pytest.raises(ValueError, match="mlp_dropout must be a probability"):
        tiny(mlp_dropout=1.0)


def test_reads_dropout_zero_drops_panm_output_only_and_none_follows_panm_dropout():
    """`reads_dropout=0` with `panm_dropout > 0` leaves the reads whole and drops PANM's output (the Controller's
    input equals eval's); `reads_dropout=None` drops the reads as `panm_dropout` always has."""
    states, decoder, base = torch.randn(4, 5, 8), torch.randn(4, 3, 6), torch.arange(4) * 2
    reference = tiny(content_read="decoder").eval()
    seen = {}
    reference.controller.register_forward_hook(lambda m, i, o: seen.update(eval=i[0]))
    reference(states, decoder, base_address=base)
    for reads_dropout, whole in ((0.0, True), (None, False)):
        memory = tiny(content_read="decoder", panm_dropout=0.5, reads_dropout=reads_dropout)
        memory.load_state_dict(reference.state_dict())
        memory.controller.register_forward_hook(lambda m, i, o: seen.update(train=i[0]))
        out = memory.train()(states, decoder, base_address=base)
        assert torch.equal(seen["train"], seen["eval"]) is whole
        assert 0.3 < float((out.hidden_states == 0).float().mean()) < 0.7  # the output is dropped either way
    with pytest.raises(ValueError, match="reads_dropout must be a probability"):
        tiny(reads_dropout=1.5)


def test_content_read_dropout_drops_the_content_read_alone_and_none_follows_the_reads():
    """`content_read_dropout` with `reads_dropout=0` drops the decoder content read's columns of the Controller's
    input and leaves the pointer reads (Mode 1, Mode 2) equal to eval's; `None` takes the reads' rate, with the same
    single dropout as before; with `content_read="none"` it raises."""
    states, decoder, base = torch.randn(4, 5, 8), torch.randn(4, 3, 6), torch.arange(4) * 2
    reference = tiny(content_read="decoder").eval()
    seen = {}
    reference.controller.register_forward_hook(lambda m, i, o: seen.update(eval=i[0]))
    reference(states, decoder, base_address=base)
    dim = reference.memory_dim
    memory = tiny(content_read="decoder", panm_dropout=0.5, reads_dropout=0.0, content_read_dropout=0.5)
    memory.load_state_dict(reference.state_dict())
    memory.controller.register_forward_hook(lambda m, i, o: seen.update(train=i[0]))
    memory.train()(states, decoder, base_address=base)
    torch.testing.assert_close(seen["train"][:, :-dim], seen["eval"][:, :-dim])  # Mode 1 and Mode 2 whole
    content, kept = seen["train"][:, -dim:], seen["eval"][:, -dim:] * 2.0  # 1 / (1 - 0.5)
    zeroed = content == 0
    torch.testing.assert_close(torch.where(zeroed, 0.0, kept), content)
    assert 0.3 < float(zeroed.float().mean()) < 0.7
    for rates in ({"reads_dropout": 0.0}, {"reads_dropout": 0.2, "content_read_dropout": 0.2}):
        assert tiny(content_read="decoder", panm_dropout=0.5, **rates).content_read_dropout is None  # one dropout
    controller_read = tiny(content_read="controller", reads_dropout=0.0, content_read_dropout=0.4)
    assert controller_read.controller.content_dropout.p == 0.4 and controller_read.reads_dropout.p == 0.0
    with pytest.raises(ValueError, match='content_read_dropout=0.3 .* set content_read="decoder"'):
        tiny(content_read_dropout=0.3)
    with pytest.raises(ValueError, match="content_read_dropout must be a probability"):
        tiny(content_read="decoder", content_read_dropout=1.0)


def test_output_decoder_drop_path_needs_output_decoder_input():
    from panm_hf.memory_config import PanmMemoryConfig

    with pytest.raises(ValueError, match="output_decoder_drop_path=0.3 .* set output_decoder_input=True"):
        PanmMemoryConfig(output_decoder_drop_path=0.3)
    with pytest.raises(ValueError, match="output_decoder_drop_path must be a probability"):
        PanmMemoryConfig(output_decoder_input=True, output_decoder_drop_path=1.0)
    with pytest.raises(ValueError, match="output_decoder_drop_scope='step' .* output_decoder_drop_path is 0; set"):
        PanmMemoryConfig(output_decoder_input=True, output_decoder_drop_scope="step")
    with pytest.raises(ValueError, match=r"output_decoder_drop_scope='steps' is not supported; choose one of"):
        PanmMemoryConfig(output_decoder_input=True, output_decoder_drop_path=0.5, output_decoder_drop_scope="steps")


def test_undecoded_output_is_none_when_g_o_does_not_read_z_t():
    memory = tiny(undecoded_output=True)
    assert memory(torch.randn(2, 5, 8), torch.randn(2, 4, 6)).undecoded_hidden_states is None


def test_output_decoder_input_errors_name_the_field():
    with pytest.raises(ValueError, match="output_decoder_input"):
        tiny(output_decoder_input=True, decoder_input_size=0)
    with pytest.raises(ValueError, match="output_decoder_input"):
        tiny(output_decoder_input=1)
