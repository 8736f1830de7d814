"""examples/causal_lm with `--task scan`: SCAN as prompts `command SEP actions EOS` on the length cut-off protocol."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_causal_lm import build, main, parse_arguments
from scan_prompts import SEP, encode, greedy_responses, scan_tokenizer

from panm_hf.pipelines.scan_data import ScanSplit, load_cutoff_split, word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data" / "scan"
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/scan is not available")
SPLIT = ScanSplit(
    ["jump twice", "walk left and run", "look"],
    ["I_JUMP I_JUMP", "I_TURN_LEFT I_WALK I_RUN", "I_LOOK"],
)


def test_streams_are_command_sep_actions_eos_with_the_loss_on_the_response_only():
    tokenizer = scan_tokenizer(SPLIT)
    prompts = encode(SPLIT, tokenizer)
    sep, eos, pad = tokenizer.sep_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    assert prompts.prompt_lengths.tolist() == [3, 5, 2]  # the command's words + SEP
    assert prompts.input_ids.shape == (3, 4 + 1 + 4)  # the longest command, SEP, the longest response + EOS
    for row, (command, actions) in enumerate(zip(SPLIT.commands, SPLIT.actions)):
        words = tokenizer.convert_tokens_to_ids(command.split())
        response = tokenizer.convert_tokens_to_ids(actions.split())
        stream = [*words, sep, *response, eos]
        assert prompts.input_ids[row, : len(stream)].tolist() == stream
        assert (prompts.input_ids[row, len(stream) :] == pad).all()
        assert prompts.attention_mask[row].tolist() == [1] * len(stream) + [0] * (9 - len(stream))
        # the loss sees exactly `actions EOS`; the first supervised label comes right after SEP
        supervised = (prompts.labels[row] != -100).nonzero().squeeze(1).tolist()
        assert supervised == list(range(len(words) + 1, len(stream)))
        assert prompts.labels[row, supervised].tolist() == [*response, eos]
    input_ids, attention_mask, labels = prompts.batch(torch.tensor([2, 0]))  # cut to the longest of these rows
    assert input_ids.shape == attention_mask.shape == labels.shape == (2, 6)


def test_vocabulary_is_the_scan_words_with_sep_as_the_prompts_last_token():
    tokenizer = scan_tokenizer(SPLIT)
    words = {word for text in SPLIT.commands + SPLIT.actions for word in text.split()}
    assert len(tokenizer) == 4 + len(words) + 1  # pad, unk, bos, eos, the words, SEP
    assert tokenizer.sep_token == SEP and tokenizer.convert_ids_to_tokens(tokenizer.sep_token_id) == SEP
    assert tokenizer.decode(encode(SPLIT, tokenizer).input_ids[1], skip_special_tokens=True) == (
        "walk left and run I_TURN_LEFT I_WALK I_RUN"
    )
    with pytest.raises(ValueError, match="sep_token"):
        encode(SPLIT, word_tokenizer(SPLIT.commands))  # the SCAN example's, without SEP


def test_prompt_memory_finds_the_prompt_from_the_labels():
    """`causal_memory="prompt"` reads the prompt as what precedes the first supervised label: the same
    outputs as when the prompt lengths are given."""
    tokenizer = scan_tokenizer(SPLIT)
    prompts = encode(SPLIT, tokenizer)
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    model = build("panm_shift", "smoke", 0, 6, "gpt2", "prompt", ids).eval()
    torch.nn.init.normal_(model.panm.controller.output_mlp[-1].weight)  # PANM starts as the backbone: wake it
    with torch.no_grad():
        from_labels = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                            labels=prompts.labels).logits  # fmt: skip
        given = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                      prompt_lengths=prompts.prompt_lengths).logits  # fmt: skip
        wrong = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                      prompt_lengths=prompts.prompt_lengths - 1).logits  # fmt: skip
    torch.testing.assert_close(from_labels, given)
    assert not torch.allclose(from_labels, wrong)


class EchoModel(torch.nn.Module):
    """A stand-in for generate(): answers each prompt `command SEP` with the command's words."""

    def generate(self, input_ids, **kwargs):
        return torch.cat([input_ids, input_ids[:, :-1]], dim=1)  # (batch, 2 * length - 1)


def test_greedy_responses_come_back_in_the_sets_order_across_length_groups_and_batches():
    tokenizer = scan_tokenizer(SPLIT)
    split = ScanSplit(["walk", "jump twice", "look", "walk left and run", "run twice"], [""] * 5)
    prompts = encode(split, tokenizer)
    model = EchoModel().train()
    assert greedy_responses(model, prompts, tokenizer, batch_size=1, max_new_tokens=4) == split.commands
    assert model.training  # put back as it was


def test_bad_flags_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--max-new-tokens"):
        parse_arguments(["--task", "scan", "--max_new_tokens", "0"])
    with pytest.raises(ValueError, match="--eval-samples"):
        parse_arguments(["--task", "scan", "--eval-samples", "0"])
    with pytest.raises(ValueError, match="--max-train-samples"):
        parse_arguments(["--task", "scan", "--max_train_samples", "-1"])
    with pytest.raises(ValueError, match="--sliding-window must be at least 1"):
        parse_arguments(["--task", "scan", "--backbone", "mistral", "--sliding_window", "0"])


@needs_data
@pytest.mark.parametrize("cutoff, num_short, num_long", [(26, 18286, 2624), (30, 19758, 1152)])
def test_training_streams_hold_at_most_cutoff_actions_and_the_test_set_every_longer_one(cutoff, num_short, num_long):
    train, heldout, test = load_cutoff_split(DATA_DIR, cutoff)
    assert len(train.commands) + len(heldout.commands) == num_short and len(test.commands) == num_long
    tokenizer = scan_tokenizer(train)
    for split, shortest, longest in ((train, 1, cutoff), (heldout, 1, cutoff), (test, cutoff + 1, 48)):
        prompts = encode(split.subset(512, 0), tokenizer)
        actions = (prompts.labels != -100).sum(dim=1) - 1  # (examples,): the response less its EOS
        assert shortest <= int(actions.min()) and int(actions.max()) <= longest
        assert not (prompts.input_ids == tokenizer.unk_token_id).any()  # the training range has every word


@needs_data
def test_scan_run_follows_the_cutoff_protocol_and_writes_its_json(tmp_path):
    threads = torch.get_num_threads()
    try:
        results = main(["--task", "scan", "--smoke", "--causal_memory", "prompt", "--data_dir", str(DATA_DIR),
                        "--cutoff", "30", "--max_new_tokens", "4", "--seed", "1", "--output_dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # main sets --threads for the process
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["task"] == "scan" and written["cutoff"] == 30 and written["causal_memory"] == "prompt"
    assert written["command"].startswith("python examples/causal_lm/run_causal_lm.py --task scan")
    assert written["args"]["seed"] == 1 and written["args"]["max_steps"] == 3 and written["machine"]
    assert written["num_train"] == 256 and written["num_eval"] == {"test": 4, "heldout": 4}  # the smoke slice
    assert set(written["models"]) == {"backbone", "panm", "panm_shift"}
    for run in written["models"].values():
        assert run["steps"] == 3 and run["parameters"] > 0
        assert min(int(length) for length in run["test"]["per_length"]) > 30  # the longer outputs
        assert max(int(length) for length in run["heldout"]["per_length"]) <= 30  # the i.i.d. set
        for key in ("test", "heldout"):
            assert 0.0 <= run[key]["exact_match"] <= 100.0 and run[key]["num_examples"] == 4
            assert sum(run[key]["eos_diagnosis"].values()) == pytest.approx(100.0)
        assert run["test"]["eos_diagnosis"]["early"] == 100.0  # 4 new tokens cannot reach 31 actions
    assert results["models"]["panm"]["parameters"] > results["models"]["backbone"]["parameters"]
    assert "| panm_shift | 3 |" in (tmp_path / "results.md").read_text()


@pytest.mark.smoke
@needs_data
def test_smoke_scan_run_of_the_script(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "causal_lm" / "run_causal_lm.py"), "--smoke", "--task", "scan",
         "--backbone", "llama", "--causal_memory", "prompt", "--data_dir", str(DATA_DIR), "--output_dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["backbone"] == "llama" and results["cutoff"] == 26
    assert {run["steps"] for run in results["models"].values()} == {3}
    assert all(set(run["test"]["eos_diagnosis"]) == {"correct", "early", "late", "content"}
               for run in results["models"].values())  # fmt: skip
