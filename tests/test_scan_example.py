"""The SCAN example: the cut-off protocol, the word tokenizer, the EOS diagnosis, decoder positions, and
end-to-end runs of the script and the table driver on a tiny slice."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import run_scan
import run_table
import torch
from transformers import AutoModelForSeq2SeqLM, SchedulerType

from panm_hf import decoder_positions
from panm_hf.decoder_positions import ALIBI_ATTENTION, randomise_decoder_positions, remove_decoder_positions
from panm_hf.decoder_positions import apply as apply_decoder_positions
from panm_hf.pipelines.scan_data import ScanSplit, cutoff_split, read_tasks, score, word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "scan" / "run_scan.py"
TABLE = ROOT / "examples" / "scan" / "run_table.py"
DATA_DIR = ROOT.parent / "shared" / "data" / "scan"


needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/scan is not available")


def write_tasks(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def test_read_tasks_parses_commands_and_names_a_bad_line(tmp_path):
    good = write_tasks(tmp_path / "tasks.txt.gz", ["IN: jump twice OUT: I_JUMP I_JUMP", "IN: walk OUT: I_WALK"])
    tasks = read_tasks(good)
    assert tasks.commands == ["jump twice", "walk"] and tasks.actions == ["I_JUMP I_JUMP", "I_WALK"]
    bad = write_tasks(tmp_path / "bad.txt.gz", ["IN: walk OUT: I_WALK", "walk I_WALK"])
    with pytest.raises(ValueError, match=r"bad\.txt\.gz, line 2"):
        read_tasks(bad)
    with pytest.raises(ValueError, match="does not exist"):
        read_tasks(tmp_path / "missing.txt.gz")


def test_cutoff_split_trains_on_short_outputs_and_holds_out_a_fixed_tenth():
    actions = [" ".join(["I_WALK"] * n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)]
    tasks = ScanSplit([f"c{n}" for n in range(12)], actions)
    train, heldout, test = cutoff_split(tasks, cutoff=10, heldout_fraction=0.1)
    assert sorted(train.commands + heldout.commands) == sorted(f"c{n}" for n in range(10))
    assert len(heldout.commands) == 1 and test.commands == ["c10", "c11"]
    assert cutoff_split(tasks, cutoff=10, heldout_fraction=0.1)[1].commands == heldout.commands  # fixed seed
    with pytest.raises(ValueError, match="--cutoff 12"):
        cutoff_split(tasks, cutoff=12, heldout_fraction=0.1)


@needs_data
@pytest.mark.parametrize("cutoff, num_short, num_long", [(22, 16990, 3920), (26, 18286, 2624), (40, 20782, 128)])
def test_cutoff_split_matches_the_data_readme_counts(cutoff, num_short, num_long):
    train, heldout, test = cutoff_split(read_tasks(DATA_DIR / "tasks.txt.gz"), cutoff, 0.1)
    assert len(train.commands) + len(heldout.commands) == num_short and len(test.commands) == num_long
    assert len(heldout.commands) == round(0.1 * num_short)
    assert max(len(a.split()) for a in train.actions) <= cutoff < min(len(a.split()) for a in test.actions)


def test_word_tokenizer_round_trips_words_and_ends_with_eos():
    tokenizer = word_tokenizer(["jump twice", "I_JUMP I_JUMP"])
    ids = tokenizer("jump twice")["input_ids"]
    assert len(ids) == 3 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(tokenizer("I_JUMP I_JUMP")["input_ids"], skip_special_tokens=True) == "I_JUMP I_JUMP"
    assert tokenizer("run")["input_ids"][0] == tokenizer.unk_token_id


def test_score_gives_exact_match_per_length_and_the_eos_diagnosis():
    split = ScanSplit(["a", "b", "c", "d"], ["X Y", "X Y Z", "X X X", "Y"])
    predictions = ["X Y", "X Y", "X X Y", "Y Y"]  # right; stops early; right length wrong content; runs late
    scored = score(predictions, split)
    assert scored["exact_match"] == 25.0
    assert scored["eos_diagnosis"] == {"correct": 25.0, "early": 25.0, "late": 25.0, "content": 25.0}
    assert scored["per_length"]["3"] == {"count": 2, "exact_match": 0.0, "mean_predicted_length": 2.5}
    assert scored["per_length"]["2"]["exact_match"] == 100.0


@pytest.mark.parametrize("backbone", ["bart", "marian"])
def test_remove_decoder_positions_makes_the_decoder_blind_to_position(backbone):
    from conftest import BACKBONES
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(BACKBONES[backbone]()).eval()
    decoder_inputs = torch.tensor([[2, 7, 7, 7]])
    first_layer = model(input_ids=torch.tensor([[5, 6, 2]]), decoder_input_ids=decoder_inputs,
                        output_hidden_states=True).decoder_hidden_states[0]  # fmt: skip
    assert not torch.allclose(first_layer[0, 1], first_layer[0, 3])  # positions tell equal tokens apart
    remove_decoder_positions(model)
    first_layer = model(input_ids=torch.tensor([[5, 6, 2]]), decoder_input_ids=decoder_inputs,
                        output_hidden_states=True).decoder_hidden_states[0]  # fmt: skip
    torch.testing.assert_close(first_layer[0, 1], first_layer[0, 3])
    assert not model.get_decoder().embed_positions.weight.requires_grad


@pytest.mark.parametrize("backbone", ["bart", "marian"])
def test_randomise_decoder_positions_shifts_each_sample_in_training_only(backbone):
    from conftest import BACKBONES
    from transformers import AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(BACKBONES[backbone]())
    positions = model.get_decoder().embed_positions
    table = positions.weight.detach()[getattr(positions, "offset", 0) :]  # (positions, d): position 0 first
    randomise_decoder_positions(model, max_offset=5)
    ids = torch.zeros(64, 4, dtype=torch.long)
    input_ids = ids.shape if backbone == "marian" else ids  # Marian's position module takes the ids' shape
    positions.eval()
    torch.testing.assert_close(positions(input_ids).expand(64, -1, -1), table[:4].expand(64, -1, -1))
    positions.train()
    shifted = positions(input_ids)  # (64, 4, d)
    starts = set()
    for row in shifted:  # each row is 4 consecutive positions from a start in [0, 5]
        matches = [k for k in range(6) if torch.equal(row, table[k : k + 4])]
        assert len(matches) == 1
        starts |= set(matches)
    assert len(starts) > 1  # the offset is drawn per sample
    with pytest.raises(ValueError, match="max_position_offset=10000 runs past"):
        randomise_decoder_positions(model, max_offset=10_000)
        positions(input_ids)


def test_remove_decoder_positions_refuses_a_relative_position_backbone():
    from conftest import BACKBONES
    from transformers import AutoModelForSeq2SeqLM

    with pytest.raises(ValueError, match="--decoder_positions none"):
        remove_decoder_positions(AutoModelForSeq2SeqLM.from_config(BACKBONES["t5"]()))
    with pytest.raises(ValueError, match=r"--decoder_positions alibi\) needs a decoder with absolute positions"):
        apply_decoder_positions(AutoModelForSeq2SeqLM.from_config(BACKBONES["t5"]()), "alibi")


def test_alibi_attention_is_a_causal_softmax_biased_by_distance():

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal = True
    query, key, value = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))  # (batch, heads, steps, d)
    output, _ = decoder_positions.alibi_attention(module, query, key, value, None, scaling=0.5)  # (2, 5, 4, 8)
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64)
    distance = torch.arange(5)[:, None] - torch.arange(5)  # (steps, steps)
    scores = query @ key.transpose(-1, -2) * 0.5 - slopes[:, None, None] * distance  # (2, 4, 5, 5)
    scores = scores.masked_fill(distance < 0, float("-inf"))
    expected = (scores.softmax(-1) @ value).transpose(1, 2)  # (2, 5, 4, 8)
    torch.testing.assert_close(output, expected)
    cached, _ = decoder_positions.alibi_attention(module, query[:, :, 4:], key, value, None, scaling=0.5)
    torch.testing.assert_close(cached, expected[:, 4:])  # a cached step is the newest position
    module.is_causal = False  # cross-attention and the encoder: plain SDPA, no bias
    plain, _ = decoder_positions.alibi_attention(module, query, key, value, None, scaling=0.5)
    expected = ((query @ key.transpose(-1, -2) * 0.5).softmax(-1) @ value).transpose(1, 2)  # (2, 5, 4, 8)
    torch.testing.assert_close(plain, expected)


def test_use_alibi_gives_the_decoder_distance_not_position_and_keeps_masks_and_cache():
    from conftest import BACKBONES
    from transformers import AutoModelForSeq2SeqLM

    from panm_hf import PanmForSeq2SeqLM

    torch.manual_seed(0)
    blind = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    decoder_positions.remove_decoder_positions(blind)
    model = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    model.load_state_dict(blind.state_dict())
    decoder_positions.apply(model, "alibi")
    assert not model.get_decoder().embed_positions.weight.requires_grad
    source, decoder_inputs = torch.tensor([[5, 6, 2]]), torch.tensor([[2, 7, 7, 7]])
    ours = model(input_ids=source, decoder_input_ids=decoder_inputs, output_hidden_states=True)
    theirs = blind(input_ids=source, decoder_input_ids=decoder_inputs, output_hidden_states=True)
    torch.testing.assert_close(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state)
    torch.testing.assert_close(ours.decoder_hidden_states[0], theirs.decoder_hidden_states[0])
    assert not torch.allclose(ours.decoder_hidden_states[-1], theirs.decoder_hidden_states[-1], atol=1e-4)

    panm = PanmForSeq2SeqLM.from_backbone(model, placement="replace").eval()
    decoder_positions.apply(panm, "alibi")
    source = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 1]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    decoder_inputs = torch.tensor([[2, 7, 8, 9, 10], [2, 7, 8, 9, 10]])
    batch = panm(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_inputs).logits
    alone = panm(input_ids=source[1:, :3], decoder_input_ids=decoder_inputs[1:]).logits
    torch.testing.assert_close(batch[1], alone[0])  # the encoder's padding mask still applies
    generated = panm.generate(input_ids=source, attention_mask=mask, max_new_tokens=6, do_sample=False,
                              num_beams=1, forced_eos_token_id=None)  # fmt: skip
    forced = panm(input_ids=source, attention_mask=mask, decoder_input_ids=generated[:, :-1]).logits
    assert torch.equal(forced.argmax(-1), generated[:, 1:])  # cached steps see the same distances
    with pytest.raises(ValueError, match="decoder_positions must be one of"):
        decoder_positions.apply(panm, "rotary")


def test_window_attention_masks_keys_too_far_back_with_or_without_alibi():
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal, module.alibi, module.window = True, False, 2
    query, key, value = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))  # (batch, heads, steps, d)
    output, _ = decoder_positions.alibi_attention(module, query, key, value, None, scaling=0.5)  # (2, 5, 4, 8)
    distance = torch.arange(5)[:, None] - torch.arange(5)  # (steps, steps)
    scores = (query @ key.transpose(-1, -2) * 0.5).masked_fill((distance < 0) | (distance >= 2), float("-inf"))
    expected = (scores.softmax(-1) @ value).transpose(1, 2)  # (2, 5, 4, 8)
    torch.testing.assert_close(output, expected)
    cached, _ = decoder_positions.alibi_attention(module, query[:, :, 4:], key, value, None, scaling=0.5)
    torch.testing.assert_close(cached, expected[:, 4:])  # a cached step is the newest position
    module.alibi = True  # both: ALiBi's distance term inside the window
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64)
    both, _ = decoder_positions.alibi_attention(module, query, key, value, None, scaling=0.5)
    scores = query @ key.transpose(-1, -2) * 0.5 - slopes[:, None, None] * distance  # (2, 4, 5, 5)
    scores = scores.masked_fill((distance < 0) | (distance >= 2), float("-inf"))
    torch.testing.assert_close(both, (scores.softmax(-1) @ value).transpose(1, 2))


def test_decoder_window_limits_what_each_decoder_step_sees_and_keeps_the_cache_exact():
    from conftest import BACKBONES
    from transformers import AutoModelForSeq2SeqLM

    from panm_hf import PanmForSeq2SeqLM

    torch.manual_seed(0)
    plain = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    decoder_positions.remove_decoder_positions(plain)
    wide, narrow = (AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval() for _ in range(2))
    for model, window in ((wide, 50), (narrow, 1)):
        model.load_state_dict(plain.state_dict())
        decoder_positions.apply(model, "none", window=window)
    source = torch.tensor([[5, 6, 7, 2]])
    decoder_inputs, changed = torch.tensor([[2, 7, 8, 9]]), torch.tensor([[2, 11, 12, 9]])
    torch.testing.assert_close(wide(input_ids=source, decoder_input_ids=decoder_inputs).logits,
                               plain(input_ids=source, decoder_input_ids=decoder_inputs).logits)  # fmt: skip
    # a window of one: the last step sees only its own token (no positions), not the ones before it
    last = [narrow(input_ids=source, decoder_input_ids=ids).logits[0, -1] for ids in (decoder_inputs, changed)]
    torch.testing.assert_close(last[0], last[1])
    seen = [plain(input_ids=source, decoder_input_ids=ids).logits[0, -1] for ids in (decoder_inputs, changed)]
    assert not torch.allclose(seen[0], seen[1])

    panm = PanmForSeq2SeqLM.from_backbone(plain, placement="replace").eval()
    decoder_positions.apply(panm, "none", window=3)
    source, mask = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 1]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    generated = panm.generate(input_ids=source, attention_mask=mask, max_new_tokens=8, do_sample=False,
                              num_beams=1, forced_eos_token_id=None)  # fmt: skip
    forced = panm(input_ids=source, attention_mask=mask, decoder_input_ids=generated[:, :-1]).logits
    assert torch.equal(forced.argmax(-1), generated[:, 1:])  # cached steps see the same window
    with pytest.raises(ValueError, match="decoder_window must be >= 1"):
        decoder_positions.use_window(panm, 0)


def test_relative_bias_is_a_learned_score_per_head_and_distance_inside_the_window():
    torch.manual_seed(0)
    module = torch.nn.Module()
    module.is_causal, module.alibi, module.window = True, False, 3
    module.relative_attention_bias = torch.nn.Embedding(3, 4, dtype=torch.float64)  # (window, heads)
    query, key, value = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))  # (batch, heads, steps, d)
    output, _ = decoder_positions.alibi_attention(module, query, key, value, None, scaling=0.5)  # (2, 5, 4, 8)
    distance = torch.arange(5)[:, None] - torch.arange(5)  # (steps, steps)
    table = module.relative_attention_bias.weight.detach()  # (window, heads)
    bias = table[distance.clamp(0, 2)].permute(2, 0, 1)  # (heads, steps, steps)
    scores = (query @ key.transpose(-1, -2) * 0.5 + bias).masked_fill((distance < 0) | (distance >= 3), float("-inf"))
    expected = (scores.softmax(-1) @ value).transpose(1, 2)  # (2, 5, 4, 8)
    torch.testing.assert_close(output, expected)
    cached, _ = decoder_positions.alibi_attention(module, query[:, :, 4:], key, value, None, scaling=0.5)
    torch.testing.assert_close(cached, expected[:, 4:])  # a cached step is the newest position
    output.sum().backward()
    assert module.relative_attention_bias.weight.grad.abs().sum() > 0  # the table trains


def test_relative_positions_start_as_none_train_and_survive_save_and_load(tmp_path):
    from conftest import BACKBONES

    from panm_hf import PanmForSeq2SeqLM, PanmMemoryConfig
    from panm_hf.pipelines.seq2seq import ModelArguments, build_model

    torch.manual_seed(0)
    blind = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    model = AutoModelForSeq2SeqLM.from_config(BACKBONES["bart"]()).eval()
    model.load_state_dict(blind.state_dict())
    apply_decoder_positions(blind, "none", window=3)
    apply_decoder_positions(model, "relative", window=3)
    tables = [m.relative_attention_bias for m in model.get_decoder().modules() if hasattr(m, "relative_attention_bias")]
    assert len(tables) == len(model.get_decoder().layers) and tables[0].weight.shape == (3, 2)  # (window, heads)
    source, decoder_inputs = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[2, 7, 8, 9, 10]])
    torch.testing.assert_close(model(input_ids=source, decoder_input_ids=decoder_inputs).logits,
                               blind(input_ids=source, decoder_input_ids=decoder_inputs).logits)  # fmt: skip
    model(input_ids=source, decoder_input_ids=decoder_inputs, labels=decoder_inputs).loss.backward()
    assert all(table.weight.grad.abs().sum() > 0 for table in tables)
    with torch.no_grad():
        for table in tables:
            table.weight.normal_()
    trained = model(input_ids=source, decoder_input_ids=decoder_inputs).logits
    assert not torch.allclose(trained, blind(input_ids=source, decoder_input_ids=decoder_inputs).logits, atol=1e-4)

    # a plain backbone's class drops the tables at load: the examples' loader puts the trained ones back
    decoder_positions.record(model.config, "relative", 3, 64)
    model.save_pretrained(tmp_path / "plain")
    args = ModelArguments(decoder_positions="absolute", decoder_window=0)  # the flags left at their defaults
    loaded = build_model("transformer", args, PanmMemoryConfig(), str(tmp_path / "plain")).eval()
    torch.testing.assert_close(loaded(input_ids=source, decoder_input_ids=decoder_inputs).logits, trained)
    wrapped = build_model("panm", ModelArguments(placement="stack"), PanmMemoryConfig(), str(tmp_path / "plain"))
    kept = [m.relative_attention_bias.weight for m in wrapped.get_decoder().modules()
            if hasattr(m, "relative_attention_bias")]  # fmt: skip
    assert all(torch.equal(mine, table.weight) for mine, table in zip(kept, tables, strict=True))  # PANM around it

    panm = PanmForSeq2SeqLM.from_backbone(model, placement="replace", decoder_positions="relative",
                                          decoder_window=3).eval()  # fmt: skip
    with torch.no_grad():
        for name, table in panm.named_parameters():
            if "relative_attention_bias" in name:
                table.normal_()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    source, decoder_inputs = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 1]]), decoder_inputs.expand(2, -1)
    expected = panm(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_inputs).logits
    panm.save_pretrained(tmp_path / "panm")
    back = PanmForSeq2SeqLM.from_pretrained(tmp_path / "panm").eval()
    assert (back.config.decoder_positions, back.config.decoder_window) == ("relative", 3)
    torch.testing.assert_close(back(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_inputs).logits,
                               expected)  # fmt: skip
    again = build_model("panm", ModelArguments(placement="replace"), PanmMemoryConfig(), str(tmp_path / "panm")).eval()
    torch.testing.assert_close(again(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_inputs).logits,
                               expected)  # fmt: skip  # a saved PANM model through the examples' loader
    generated = back.generate(input_ids=source, attention_mask=mask, max_new_tokens=8, do_sample=False,
                              num_beams=1, forced_eos_token_id=None)  # fmt: skip
    forced = back(input_ids=source, attention_mask=mask, decoder_input_ids=generated[:, :-1]).logits
    assert torch.equal(forced.argmax(-1), generated[:, 1:])  # cached steps see the same distances
    with pytest.raises(ValueError, match="decoder_window >= 1"):
        apply_decoder_positions(back, "relative", window=0)


def test_table_driver_names_runs_and_summarises_seeds(tmp_path):
    args = run_table.parse_arguments(["--output_dir", str(tmp_path), "--designs", "panm_nope", "--seeds", "0",
                                      "--max_steps", "7"])  # fmt: skip
    command = run_table.command("panm_nope", 26, 0, args)
    assert command[-1] == str(tmp_path / "panm_nope_L26_s0")
    last_budget = len(command) - 1 - command[::-1].index("--max_steps")
    assert "--decoder_positions" in command and command[last_budget + 1] == "7"  # given after the budget: it wins
    for seed, value in ((0, 80.0), (1, 100.0), (2, 90.0)):
        folder = tmp_path / f"panm_nope_L26_s{seed}"
        folder.mkdir()
        eos = {"correct": value, "early": 100.0 - value, "late": 0.0, "content": 0.0}
        run = {"test": {"exact_match": value, "eos_diagnosis": eos}, "heldout": {"exact_match": 99.0}}
        (folder / "results.json").write_text(json.dumps({"cutoff": 26, "seed": seed, "results": {"panm": run}}))
    (row,) = run_table.summary(str(tmp_path))
    assert row["design"] == "panm_nope" and row["seeds"] == [0, 1, 2] and row["test"] == [80.0, 100.0, 90.0]
    assert row["median"] == 90.0 and row["early"] == 10.0
    with pytest.raises(SystemExit):
        run_table.parse_arguments(["--output_dir", str(tmp_path), "--cutoffs", "48"])


@pytest.mark.parametrize(
    "design,expected",
    [
        ("panm", ("replace", "none", "absolute", 0, "shared")),
        ("transformer", ("replace", "none", "absolute", 0, "shared")),
        ("panm_nope_cr_window", ("replace", "decoder", "none", 24, "shared")),
        ("panm_example_nope_window_eos", ("stack", "decoder", "none", 24, "panm")),
    ],
)
def test_table_designs_do_not_depend_on_the_examples_defaults(tmp_path, design, expected):
    """Each row of the table is the paper's integration plus its own flags, whatever run_scan.py defaults to."""
    args = run_table.parse_arguments(["--output_dir", str(tmp_path)])
    argv = run_table.command(design, 26, 0, args)[2:]  # past the interpreter and the script
    model_args, panm_args, _, _ = run_scan.parse_arguments(argv)
    actual = (model_args.placement, panm_args.content_read, model_args.decoder_positions,
              model_args.decoder_window, model_args.eos_decision)  # fmt: skip
    assert actual == expected


@pytest.mark.parametrize(
    "design,expected",
    [
        ("panm_example_nope_window_eos", (128, 128, "shift", 0.5)),
        ("panm_example_nope_window_eos_w256", (256, 256, "shift", 0.5)),
        ("panm_example_nope_window_eos_p256", (256, 128, "shift", 0.5)),
        ("panm_example_nope_window_eos_c256", (128, 256, "shift", 0.5)),
        ("panm_example_nope_window_eos_dp0_w256", (256, 256, "shift", 0.0)),
        ("panm_nope_cr_window", (256, 256, "attention", 0.0)),
    ],
)
def test_table_designs_set_the_gru_widths_they_name(tmp_path, design, expected):
    """The Multi30K design's rows keep its 128-wide GRUs unless the row names a width; the later flag wins."""
    args = run_table.parse_arguments(["--output_dir", str(tmp_path)])
    _, panm_args, _, _ = run_scan.parse_arguments(run_table.command(design, 26, 0, args)[2:])
    actual = (panm_args.pointer_hidden_size, panm_args.controller_hidden_size, panm_args.pointer_update,
              panm_args.panm_drop_path)  # fmt: skip
    assert actual == expected


def test_csordas_row_is_their_trafo_scan_profile(tmp_path):
    """`transformer_csordas` trains as Csordas et al.'s trafo_scan profile does, whatever the budget's flags before
    it: Marian's sinusoidal positions, dropout 0.5, 8 heads, batch 256, Adam at 1e-3 held constant, clip 5; a flag
    given on the driver's command line still wins (`--dropout 0.1` isolates the dropout)."""
    args = run_table.parse_arguments(["--output_dir", str(tmp_path)])
    argv = run_table.command("transformer_csordas", 32, 0, args)[2:]  # past the interpreter and the script
    model_args, _, _, training_args = run_scan.parse_arguments(argv)
    actual = (model_args.model, model_args.backbone, model_args.decoder_positions, model_args.dropout,
              model_args.attention_heads, training_args.per_device_train_batch_size, training_args.learning_rate,
              SchedulerType(training_args.lr_scheduler_type).value, training_args.warmup_steps,
              training_args.max_grad_norm)  # fmt: skip
    assert actual == ("transformer", "marian", "absolute", 0.5, 8, 256, 1e-3, "constant", 0, 5.0)
    args = run_table.parse_arguments(["--output_dir", str(tmp_path), "--dropout", "0.1"])
    model_args, _, _, _ = run_scan.parse_arguments(run_table.command("transformer_csordas", 32, 0, args)[2:])
    assert model_args.dropout == 0.1


def test_the_one_design_row_is_the_measured_candidate(tmp_path):
    """`panm_one_design` runs the flags docs/results/scan.md measured: the SCAN design, g^o reading z_t, 1,024 wide,
    its z_t dropped for half the samples, dropout 0.3 on PANM's output and the content read, none on the pointer
    reads."""
    args = run_table.parse_arguments(["--output_dir", str(tmp_path)])
    model_args, panm_args, _, _ = run_scan.parse_arguments(run_table.command("panm_one_design", 26, 0, args)[2:])
    assert (model_args.placement, model_args.decoder_positions, model_args.decoder_window) == ("replace", "none", 24)
    actual = (panm_args.content_read, panm_args.output_decoder_input, panm_args.mlp_hidden_size,
              panm_args.output_decoder_drop_path, panm_args.panm_dropout, panm_args.reads_dropout,
              panm_args.content_read_dropout, panm_args.pointer_hidden_size, panm_args.pointer_update)  # fmt: skip
    assert actual == ("decoder", True, 1024, 0.5, 0.3, 0.0, 0.3, 256, "attention")
    assert panm_args.content_read_keys == "memory"
    # `panm_one_design_ek`: the same flags and the end-distance keys, as this design's runs passed them
    with_keys = run_scan.parse_arguments(run_table.command("panm_one_design_ek", 26, 0, args)[2:])
    given = run_scan.parse_arguments(
        run_table.command("panm_one_design", 26, 0, args)[2:] + ["--content_read_keys", "end_distance"]
    )
    assert with_keys[:2] == given[:2] and with_keys[1].content_read_keys == "end_distance"
    # ... and run_scan.py's defaults (ONE_DESIGN_FLAGS) are that row's PANM flags
    defaults = run_scan.parse_arguments(["--output_dir", str(tmp_path)])
    assert defaults[1] == with_keys[1]
    assert (defaults[0].placement, defaults[0].decoder_positions, defaults[0].decoder_window) == ("replace", "none", 24)


# The model flags a Transformer run reads (PANM's flags are parsed for it too but build nothing).
TRANSFORMER_FIELDS = ("num_layers", "d_model", "ffn_dim", "attention_heads", "dropout", "decoder_positions",
                      "decoder_window")  # fmt: skip


def test_every_scan_result_records_the_settings_its_command_runs():
    """Each run in docs/results/scan/runs.json ran its `command`: that command, parsed by today's run_scan.py
    (through run_table.py's rows where the run went through it), gives the cut-off, seed, steps, batch and learning
    rate (and input feeding, the rate's schedule and the drop's scope) the entry records, and every model flag of
    its `model_args` (the defaults the command did not name, as they were when it ran; a run from before the drop's
    scope existed dropped per sample). A run whose command no longer trains that model (the flags it names are
    gone, or the defaults it relied on changed) names the `commit` its command runs at."""
    from dataclasses import asdict

    runs = json.loads((ROOT / "docs" / "results" / "scan" / "runs.json").read_text())
    for key, entry in runs.items():
        if "commit" in entry:
            assert len(entry["commit"]) >= 7, key  # a git revision the command runs at
            continue
        words = shlex.split(entry["command"])
        if words[1].endswith("run_table.py"):
            args = run_table.parse_arguments(words[2:])
            (design,) = args.designs
            assert entry["cutoff"] in args.cutoffs and entry["seed"] in args.seeds, key
            argv = run_table.command(design, entry["cutoff"], entry["seed"], args)[2:]
        else:
            argv = words[2:]
        model_args, panm_args, data_args, training_args = run_scan.parse_arguments(argv)
        ran = {"cutoff": data_args.cutoff, "seed": training_args.seed, "max_steps": training_args.max_steps,
               "learning_rate": training_args.learning_rate,
               "per_device_train_batch_size": training_args.per_device_train_batch_size,
               "input_feeding": model_args.input_feeding,
               "lr_scheduler_type": SchedulerType(training_args.lr_scheduler_type).value}  # fmt: skip
        recorded = {name: entry[name] for name in ran if name in entry}
        assert {"cutoff", "seed", "max_steps"} <= set(recorded), key  # every run records what it trained on
        assert recorded == {name: ran[name] for name in recorded}, key
        parsed = {**asdict(model_args), **asdict(panm_args)}
        fields = TRANSFORMER_FIELDS if model_args.model == "transformer" else parsed
        model = {name: value for name, value in entry.get("model_args", {}).items() if name in fields}
        if model_args.model == "panm":
            model["output_decoder_drop_scope"] = entry.get("output_decoder_drop_scope", "sample")
        assert model == {name: parsed[name] for name in model}, key


@pytest.mark.parametrize(
    "extra,expected",
    [
        ([], (0.0, None, None)),
        (["--panm_dropout", "0.1"], (0.1, None, None)),
        (["--content_read", "decoder", "--reads_dropout", "0.2", "--content_read_dropout", "0.4"], (0.0, 0.2, 0.4)),
    ],
)
def test_table_rows_keep_the_papers_flags_under_the_examples_defaults(tmp_path, extra, expected):
    """A row is the paper's integration (`--panm_design paper`) plus its own flags, though run_scan.py defaults to the
    one design: a row run with `--panm_dropout` alone leaves the reads' rates at PanmMemoryConfig's None."""
    args = run_table.parse_arguments(["--output_dir", str(tmp_path), *extra])
    model_args, panm_args, _, _ = run_scan.parse_arguments(run_table.command("panm", 26, 0, args)[2:])
    assert (panm_args.panm_dropout, panm_args.reads_dropout, panm_args.content_read_dropout) == expected
    assert (panm_args.output_decoder_input, panm_args.mlp_hidden_size, panm_args.output_decoder_drop_path) == (
        False, 128, 0.0,
    )  # fmt: skip
    assert model_args.panm_design == "paper" and model_args.decoder_positions == "absolute"


@pytest.mark.smoke
@needs_data
def test_smoke_run_scores_both_models_with_the_eos_diagnosis(tmp_path):
    command = [
        sys.executable, str(SCRIPT), "--data_dir", str(DATA_DIR), "--cutoff", "26", "--output_dir", str(tmp_path),
        "--model", "both", "--smoke", "--decoder_positions", "none", "--eval_every", "3", "--curve_samples", "4",
        "--report_to", "none", "--disable_tqdm", "true", "--save_strategy", "no", "--weight_average_decay", "0.5",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["cutoff"] == 26 and summary["num_eval"] == {"test": 32, "heldout": 16}
    assert summary["model_args"]["placement"] == "replace" and summary["model_args"]["decoder_positions"] == "none"
    for name in ("transformer", "panm"):
        run = summary["results"][name]
        assert [point["step"] for point in run["curve"]] == [3, 6]
        assert sum(run["test"]["eos_diagnosis"].values()) == pytest.approx(100.0)
        assert min(int(length) for length in run["test"]["per_length"]) > 26
        assert (tmp_path / name / "config.json").is_file()
        # --weight_average_decay: the curve and the final scores of the moving average, beside the weights'
        assert all({"test_average_exact_match", "heldout_average_eos"} <= set(point) for point in run["curve"])
        average = run["average"]
        assert (
            set(average) == {"test", "heldout"}
            and average["test"]["per_length"].keys() == run["test"]["per_length"].keys()
        )
        assert sum(average["test"]["eos_diagnosis"].values()) == pytest.approx(100.0)
        assert "eval_average_test_exact_match" in json.loads(
            (tmp_path / name / "eval_average_results.json").read_text()
        )
        # the averaged model is saved beside the model and loads as it does; frozen weights are not averaged
        averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / name / "weight_average")
        trained = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / name)
        assert type(averaged) is type(trained)
        pairs = zip(averaged.named_parameters(), trained.named_parameters(), strict=True)
        differ = [n for (n, p), (_, q) in pairs if not torch.equal(p, q)]
        assert differ and not any("decoder.embed_positions" in n for n in differ)  # zeroed and frozen


@pytest.mark.smoke
@needs_data
def test_smoke_table_runs_each_design_as_its_own_json(tmp_path):
    command = [
        sys.executable, str(TABLE), "--data_dir", str(DATA_DIR), "--output_dir", str(tmp_path), "--designs",
        "transformer", "panm_nope", "--cutoffs", "30", "--jobs", "2", "--smoke", "--max_steps", "3",
        "--eval_every", "0", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for design in ("transformer", "panm_nope"):
        summary = json.loads((tmp_path / f"{design}_L30_s0" / "results.json").read_text())
        assert summary["cutoff"] == 30 and summary["max_steps"] == 3
    assert "| panm_nope | 30 | 0 |" in result.stdout


def test_eos_oracle_splits_free_errors_and_forces_the_target_length():
    import eos_oracle
    from transformers import BartConfig, BartForConditionalGeneration

    outcomes = eos_oracle.free_outcomes(["A B", "A", "A B C", "B B"], ["A B", "A B", "A B", "A B"])
    assert outcomes == {"correct": 25.0, "early_prefix": 25.0, "late_prefix": 25.0, "content": 25.0}
    late = eos_oracle.overruns(["A B A B", "A B C", "A B B", "A"], ["A B", "A B", "A B", "A"])
    assert late == {"extra_actions": {"1": 50.0, "2": 25.0}, "repeats_the_end": 50.0}  # "A B +A B", "A B +B"
    tokenizer = word_tokenizer(["jump walk twice", "I_JUMP I_WALK"])
    config = BartConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config).eval()
    for length in (1, 4, 9):
        (actions,) = eos_oracle.decode(model, tokenizer, ["jump twice"], length)
        assert len(actions.split()) == length  # EOS suppressed before the length, decoding stopped after it
    commands, targets = ["jump twice", "walk", "jump walk"], ["I_JUMP I_JUMP", "I_WALK", "I_JUMP"]
    probabilities = eos_oracle.end_probabilities(model, tokenizer, commands, targets, batch_size=2)
    for command, target, probability in zip(commands, targets, probabilities):  # each row alone, by hand
        labels = tokenizer([target], return_tensors="pt")["input_ids"]  # (1, actions + EOS)
        logits = model(**tokenizer([command], return_tensors="pt"), labels=labels).logits  # (1, actions + 1, vocab)
        expected = logits[0, len(target.split())].softmax(-1)[tokenizer.eos_token_id]
        torch.testing.assert_close(probability, expected)
    split = ScanSplit(commands, targets)
    margins = eos_oracle.stop_margins(model, tokenizer, split, ["I_JUMP I_JUMP I_JUMP", "I_WALK", "I_WALK"])
    assert margins["late_prefix"]["count"] == 1 and margins["correct"]["count"] == 1
    torch.testing.assert_close(margins["late_prefix"]["median"], probabilities[0].item(), rtol=1e-6, atol=1e-7)


def test_eos_oracle_names_a_folder_without_a_run(tmp_path):
    import eos_oracle

    with pytest.raises(ValueError, match="results.json does not exist"):
        eos_oracle.load_run(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"cutoff": 26, "results": {"panm": {}}}))
    with pytest.raises(ValueError, match="holds no saved model"):
        eos_oracle.load_run(tmp_path)


def test_stop_probe_scores_a_stop_rule_and_fits_a_separable_stop():
    import stop_probe

    sequence = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    is_end = torch.tensor([False, False, True, False, True, False, False, True])
    scores = torch.tensor([-1.0, -1.0, 2.0, 1.0, 1.0, -1.0, -1.0, -1.0])  # exact, early, never (late)
    assert stop_probe.stop_outcomes(scores, sequence, is_end) == {"exact": 33.3, "early": 33.3, "late": 33.3}
    torch.manual_seed(0)
    inputs = torch.randn(200, 3)
    ends = inputs[:, 1] > 1.0
    score = stop_probe.fit_probe(inputs, ends)
    assert ((score(inputs) > 0) == ends).float().mean() > 0.95


def tiny_panm(words: list[str]):
    """(word tokenizer, a tiny PANM-on-BART model with the Controller in place of the last decoder layer), seed 0."""
    from transformers import BartConfig

    from panm_hf import PanmConfig, PanmForSeq2SeqLM

    tokenizer = word_tokenizer(words)
    config = BartConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                        decoder_start_token_id=tokenizer.eos_token_id, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    panm = {"placement": "replace", "pointer_hidden_size": 8, "controller_hidden_size": 8, "mlp_hidden_size": 8}
    return tokenizer, PanmForSeq2SeqLM(PanmConfig(text_config=config.to_dict(), **panm))


def test_stop_probe_reads_every_target_step_of_a_panm_model():
    import stop_probe

    tokenizer, model = tiny_panm(["jump walk twice", "I_JUMP I_WALK"])
    split = ScanSplit(["jump twice", "walk", "jump walk twice"], ["I_JUMP I_JUMP", "I_WALK", "I_JUMP I_WALK I_WALK"])
    features = stop_probe.step_features(model, tokenizer, split, batch_size=2)
    steps = 3 + 2 + 4  # each target's actions and its EOS
    assert features["z"].shape == (steps, 16) and features["mode1"].shape == (steps, 2 * 16)
    assert features["pointers"].shape == (steps, 2 * 3 + 1)
    assert features["is_end"].sum() == 3 and features["sequence"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    # where the model reads: per decoder layer and head (BART keeps 1 layer with "replace"), and per Mode-2 head
    assert features["cross"].shape == (steps, 1 * 2 * 2) and features["mode2"].shape == (steps, 2 * 1)
    # a decoder window lives in the attention function: the probe keeps it (the saved run's model, as decoded)
    apply_decoder_positions(model, "absolute", window=1)
    windowed = stop_probe.step_features(model, tokenizer, split, batch_size=2)
    assert model.config._attn_implementation == ALIBI_ATTENTION and "cross" not in windowed
    source = tokenizer(split.commands[:2], padding=True, return_tensors="pt")
    target = tokenizer(split.actions[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**source, labels=target["input_ids"]).logits[target["attention_mask"].bool()]  # (5, vocab)
    margin = logits[:, tokenizer.eos_token_id] - logits.index_fill(1, torch.tensor([tokenizer.eos_token_id]),
                                                                   float("-inf")).amax(-1)  # fmt: skip
    assert torch.allclose(windowed["logit_margin"][:5], margin, atol=1e-5)
    weights = torch.tensor([[[[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]]]])  # (1, 1 head, 2 steps, 4 slots)
    position = stop_probe.read_position(weights, torch.tensor([[1, 1, 1, 0]]))  # the last real slot is 2
    assert position.tolist() == [[[0.5, 0.5], [0.0, -1.0]]]


def test_controller_reset_restarts_the_recurrence_from_its_first_state_at_the_step():
    import controller_reset

    from panm_hf import PanmMemoryConfig
    from panm_hf.controller import Controller

    torch.manual_seed(0)
    config = PanmMemoryConfig(controller_hidden_size=8, mlp_hidden_size=8, output_decoder_input=True)
    controller = Controller(config, read_size=6, decoder_input_size=4, memory_dim=5, output_size=3).eval()
    reads, decoder_states, hidden = torch.randn(2, 7, 6), torch.randn(2, 7, 4), torch.randn(2, 8)
    whole, _, _ = controller(reads, decoder_states, hidden)
    fresh, fresh_last, _ = controller(reads[:, 3:], decoder_states[:, 3:], hidden)  # a new call from step 3
    outputs, last, _ = controller_reset.reset_forward(controller, 3)(reads, decoder_states, hidden)
    torch.testing.assert_close(outputs[:, :3], whole[:, :3])  # before the reset: as trained
    torch.testing.assert_close(outputs[:, 3:], fresh)  # from it on: as if the output started there
    torch.testing.assert_close(last, fresh_last)
    assert not torch.allclose(outputs[:, 3:], whole[:, 3:])
    late, _, _ = controller_reset.reset_forward(controller, 9)(reads, decoder_states, hidden)  # past the end
    torch.testing.assert_close(late, whole)
    with pytest.raises(ValueError, match="needs a GRU Controller"):
        lstm = PanmMemoryConfig(controller_hidden_size=8, mlp_hidden_size=8, controller_cell="lstm")
        controller_reset.reset_forward(Controller(lstm, read_size=6, decoder_input_size=4, memory_dim=5,
                                                  output_size=3), 3)  # fmt: skip
    with pytest.raises(ValueError, match="--reset_steps must be output steps >= 1"):
        controller_reset.main(["somewhere", "--reset_steps", "0"])


def test_controller_reset_scores_content_and_stop_per_turn_group_as_the_argmax_gives_them():
    import controller_reset

    tokenizer, model = tiny_panm(["jump walk left", "I_JUMP I_WALK I_TURN_LEFT I_TURN_RIGHT"])
    model.eval()
    split = ScanSplit(["jump left", "walk", "jump left walk"],
                      ["I_TURN_LEFT I_JUMP", "I_WALK", "I_TURN_LEFT I_JUMP I_TURN_RIGHT I_WALK"])  # fmt: skip
    # each command alone, by hand: content is every action the argmax, stop is EOS the argmax after the target
    singles = {}
    with torch.no_grad():
        for command, target in zip(split.commands, split.actions):
            labels = tokenizer([target], return_tensors="pt")["input_ids"]  # (1, actions + EOS)
            predicted = model(**tokenizer([command], return_tensors="pt"), labels=labels).logits.argmax(-1)[0]
            length = len(target.split())
            expected = 100.0 * bool((predicted[:length] == labels[0, :length]).all())
            stop = 100.0 * bool(predicted[length] == tokenizer.eos_token_id)
            group = controller_reset.turn_kind(target)
            row = controller_reset.outcomes(model, tokenizer, ScanSplit([command], [target]))
            assert row == {group: {"count": 1, "content": expected, "stop": stop}}
            singles.update(row)
    assert set(singles) == {"one way", "both ways", "none"}
    assert controller_reset.outcomes(model, tokenizer, split, batch_size=2) == singles  # padded batches: the same


def test_composition_sorts_clauses_by_what_training_showed(tmp_path):
    import composition

    training = ["jump twice and walk", "look around left thrice", "walk after run"]
    commands = ["walk and jump twice", "look around left thrice and walk", "run twice after walk", "walk after run"]
    classes = composition.classify(commands, training)
    assert classes == ["composed", "alone only", "unseen", "composed"]
    predictions = ["I_WALK I_JUMP I_JUMP", "I_LOOK", "I_WALK I_RUN I_RUN I_RUN", "I_WALK I_JUMP"]
    targets = ["I_WALK I_JUMP I_JUMP", "I_LOOK I_WALK", "I_WALK I_RUN I_RUN", "I_RUN I_WALK"]
    rows = composition.breakdown(classes, predictions, targets)
    assert rows["composed"] == {"count": 2, "share": 50.0, "correct": 50.0, "early": 0.0, "late": 0.0, "content": 50.0}
    assert rows["alone only"]["early"] == 100.0 and rows["unseen"]["late"] == 100.0
    assert composition.breakdown(classes, None, targets)["unseen"] == {"count": 1, "share": 25.0}
    with pytest.raises(ValueError, match="results.json does not exist"):
        composition.analyse(tmp_path, DATA_DIR, use_model=False)


def test_composition_pairs_clauses_by_length_in_output_order():
    import composition

    actions = {"walk": 1, "jump twice": 2, "run around left": 8}
    assert composition.output_order("walk after run around left") == ["run around left", "walk"]
    keys = [composition.pair_key(c, actions) for c in ("walk after run around left", "walk and jump twice", "walk")]
    assert keys == ["8+1", "1+2", "1"]
    targets = ["I_A I_B", "I_C I_D I_E", "I_F", "I_G I_H"]
    rows = composition.pairs(["8+1", "1+2", "1", "8+1"], ["I_A", "I_C I_D I_E", "I_F", "I_G I_H"], targets)
    assert list(rows) == ["1", "1+2", "8+1"]  # by the counts, not as strings
    assert rows["8+1"] == {"count": 2, "correct": 50.0, "early": 50.0, "late": 0.0, "content": 0.0}
    assert composition.pairs(["8+1"], None, targets[:1]) == {"8+1": {"count": 1}}
    with pytest.raises(ValueError, match="clause 'look' of 'look and walk' is not a command"):
        composition.pair_key("look and walk", actions)


def test_composition_splits_outputs_by_the_ways_they_turn_and_their_longest_one_way_stretch():
    import composition

    right, left = " ".join(["I_TURN_RIGHT I_JUMP"] * 12), " ".join(["I_TURN_LEFT I_WALK"] * 12)
    targets = [f"{right} {right}", f"{left} {right}", "I_JUMP I_JUMP", f"I_WALK {right} I_WALK"]
    assert [composition.turn_kind(t) for t in targets] == ["one way", "both ways", "none", "one way"]
    # a stretch ends where a turn goes the other way; actions before the first turn belong to the first stretch
    assert [composition.one_way_stretch(t) for t in targets] == [48, 24, 2, 26]
    assert composition.one_way_stretch(f"I_WALK I_TURN_LEFT {right}") == 24
    predictions = [f"{right} {right} {right}", f"{left} {right}", "I_JUMP", targets[3]]
    rows = composition.turns(predictions, targets)
    assert rows["one way"] == {"count": 2, "correct": 50.0, "early": 0.0, "late": 50.0, "content": 0.0,
                               "one_way_stretch": 48}  # fmt: skip
    assert rows["both ways"]["correct"] == 100.0 and rows["both ways"]["one_way_stretch"] == 24
    assert rows["none"]["early"] == 100.0
    assert composition.turns(None, targets[2:3]) == {"one way": {"count": 0, "one_way_stretch": 0},
                                                     "both ways": {"count": 0, "one_way_stretch": 0},
                                                     "none": {"count": 1, "one_way_stretch": 2}}  # fmt: skip


def test_composition_splits_one_way_outputs_by_whether_their_clauses_write_the_same_action():
    import composition

    actions = {"walk around right thrice": " ".join(["I_TURN_RIGHT I_WALK"] * 12),
               "jump around right thrice": " ".join(["I_TURN_RIGHT I_JUMP"] * 12),
               "walk around left thrice": " ".join(["I_TURN_LEFT I_WALK"] * 12), "walk": "I_WALK"}  # fmt: skip
    commands = ["walk around right thrice and walk around right thrice", "jump around right thrice after walk "
                "around right thrice", "walk around left thrice and walk around right thrice",
                "walk around right thrice", "walk and walk"]  # fmt: skip
    groups = [composition.one_way_action(c, actions) for c in commands]
    assert groups == ["same action", "other action", None, None, None]  # both ways, one clause, no turn: None
    targets = [" ".join([actions["walk around right thrice"]] * 2), "I_A", "I_B", "I_C", "I_D"]
    rows = composition.one_way_by_action(groups, [targets[0], "I_A I_A", "I_B", "I_C", "I_D"], targets)
    assert rows["same action"]["correct"] == 100.0 and rows["other action"]["late"] == 100.0
    assert composition.one_way_by_action([None], None, ["I_A"]) == {"same action": {"count": 0},
                                                                     "other action": {"count": 0}}  # fmt: skip


def test_composition_splits_the_partner_after_the_longest_clause_by_whether_it_repeats_its_actions():
    import composition

    around = " ".join(["I_TURN_RIGHT I_WALK"] * 12)  # `walk around right thrice`, 24 actions
    actions = {"walk around right thrice": around, "walk around right": " ".join(["I_TURN_RIGHT I_WALK"] * 4),
               "walk right": "I_TURN_RIGHT I_WALK", "jump twice": "I_JUMP I_JUMP", "walk": "I_WALK"}  # fmt: skip
    commands = ["walk around right thrice and walk around right", "walk right after walk around right thrice",
                "walk around right thrice and jump twice", "jump twice and walk around right thrice",
                "walk around right thrice", "walk and walk right"]  # fmt: skip
    groups = [composition.partner(c, actions) for c in commands]
    assert groups == ["repeat", "repeat", "differ", None, None, None]  # `after` writes its second clause first
    targets = [f"{around} {actions[partner]}" for partner in ("walk around right", "walk right", "jump twice")]
    targets += ["I_WALK"] * 3
    predictions = [around, targets[1], targets[2], "I_WALK", "I_WALK", "I_WALK"]
    rows = composition.after_longest(groups, predictions, targets)
    assert rows["repeat"] == {"count": 2, "correct": 50.0, "early": 50.0, "late": 0.0, "content": 0.0}
    assert rows["differ"]["correct"] == 100.0 and rows["differ"]["count"] == 1
    assert composition.after_longest([None], None, ["I_WALK"]) == {"repeat": {"count": 0}, "differ": {"count": 0}}


@needs_data
def test_composition_finds_every_longer_output_composed_from_l25_on(tmp_path):
    import composition

    for cutoff, composed in ((24, 12.5), (25, 100.0)):
        (tmp_path / "results.json").write_text(json.dumps({"cutoff": cutoff, "results": {}}))
        (row,) = composition.main([str(tmp_path), "--data_dir", str(DATA_DIR), "--no_model"])
        assert round(row["classes"]["composed"]["share"], 1) == composed
        assert sum(cell["count"] for cell in row["pairs"].values()) == row["num_test"]
        assert all(sum(int(n) for n in key.split("+")) > cutoff for key in row["pairs"])  # longer than L
    assert row["pairs"]["24+2"] == {"count": 256}  # L = 25: `around ... thrice`, then a two-action clause
    (tmp_path / "results.json").write_text(json.dumps({"cutoff": 26, "results": {}}))
    (row,) = composition.main([str(tmp_path), "--data_dir", str(DATA_DIR), "--no_model"])
    longest = sum(cell["count"] for key, cell in row["pairs"].items() if key.startswith("24+"))
    assert row["after_longest"] == {"repeat": {"count": 240}, "differ": {"count": 1040}} and longest == 1280
    (tmp_path / "results.json").write_text(json.dumps({"cutoff": 40, "results": {}}))
    (row,) = composition.main([str(tmp_path), "--data_dir", str(DATA_DIR), "--no_model"])
    # L = 40: every longer output is two `around ... thrice` clauses; half turn one way, a quarter of those with
    # the same action in both
    assert row["turns"]["one way"]["count"] == 64 and row["num_test"] == 128
    assert row["one_way_by_action"] == {"same action": {"count": 16}, "other action": {"count": 48}}


def test_content_read_moves_finds_the_clause_spans_in_output_order():
    import content_read_moves

    assert content_read_moves.clause_spans("jump twice and walk left") == (range(0, 2), range(3, 5))
    assert content_read_moves.clause_spans("jump twice after walk left") == (range(3, 5), range(0, 2))  # y first
    with pytest.raises(ValueError, match="two-clause commands"):
        content_read_moves.clause_spans("jump twice")


def test_content_read_moves_measures_moves_at_the_boundary_and_where_reads_peak():
    import content_read_moves

    # 6 steps over 6 slots; clause spans (0, 1) then (3, 4); boundary 3: steps 0-2 write the first clause.
    # Steps alternate a slot of the written clause and slot 5 ("</s>"), except step 4, which peaks on slot 0.
    peaks = [0, 5, 1, 3, 0, 4]
    weights = torch.nn.functional.one_hot(torch.tensor(peaks), 6).float()  # (steps, slots)
    weights[2] = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0, 0.5])  # half on slot 1, half on "</s>"
    torch.testing.assert_close(content_read_moves.total_variation(weights, 1), torch.tensor([1.0, 0.5, 1.0, 1, 1]))
    row = content_read_moves.one_output(weights, 3, (range(0, 2), range(3, 5)))
    assert row["move"] == (1.0, [1.0, 0.5, 1.0, 1.0])  # step 3 against 2, then the other steps
    # over two steps: t = 2 (vs 0) 1.0; t = 3 (vs 1) 1.0; t = 4 (vs 2) 1.0; t = 5 (vs 3) 1.0; boundary: t = 3, 4
    assert row["move2"] == (1.0, [1.0, 1.0])
    assert row["largest_at_boundary"] is False  # the first maximum (t = 2) is before the boundary
    # peaks: 0 written, 5 elsewhere, 1 written (a tie at step 2 goes to the first slot), 3 written, 0 other, 4 written
    assert row["reads"] == [4, 1, 1]
    weights[2] = weights[0]  # no move over two steps before the boundary
    row = content_read_moves.one_output(weights, 3, (range(0, 2), range(3, 5)))
    assert row["move2"] == (1.0, [0.0, 1.0]) and row["largest_at_boundary"] is True
    cells = content_read_moves.summarise([row, {**row, "largest_at_boundary": False, "reads": [0, 0, 6]}])
    assert cells["count"] == 2 and cells["largest_at_boundary"] == 50.0
    assert cells["move2"] == {"boundary": 1.0, "elsewhere": 0.5}
    assert cells["reads"] == {"written clause": 100.0 * 4 / 12, "other clause": 100.0 / 12, "elsewhere": 700.0 / 12}


DIAGNOSIS_SCRIPTS = ["eos_oracle", "composition", "controller_reset", "stop_probe", "content_read_moves"]


@pytest.mark.parametrize("script", DIAGNOSIS_SCRIPTS)
def test_diagnosis_scripts_share_one_command_line_and_name_a_folder_without_a_run(tmp_path, script):
    import importlib

    from panm_hf.pipelines.scan_data import diagnosis_parser

    args = diagnosis_parser("doc").parse_args(["a", "b", "--output", "rows.json"])
    assert (args.runs, args.output) == ([Path("a"), Path("b")], Path("rows.json"))
    assert args.data_dir == Path("../shared/data/scan")
    with pytest.raises(ValueError, match="results.json does not exist"):
        importlib.import_module(script).main([str(tmp_path), "--data_dir", str(tmp_path), "--output", "x.json"])
    assert not Path("x.json").exists()
