"""The translation example end to end on a tiny slice of Multi30K (the CI smoke budget)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from length_split import TranslationPairs, hold_out, length_split

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "translation" / "run_translation.py"
DATA_DIR = ROOT.parent / "shared" / "data" / "multi30k"


def test_length_split_trains_on_short_and_tests_on_long():
    sources = ["a b c", "a", "a b c d e", "a b", "a b c d"]
    pairs = TranslationPairs(sources, [s.upper() for s in sources])
    train, test = length_split(pairs, 0.6)
    assert train.sources == ["a", "a b", "a b c"]
    assert test.sources == ["a b c d", "a b c d e"]
    assert train.targets == ["A", "A B", "A B C"]  # pairs stay aligned
    with pytest.raises(ValueError, match="split_ratio"):
        length_split(pairs, 1.0)


def test_hold_out_splits_off_disjoint_pairs_in_order():
    sources = [f"s{i}" for i in range(10)]
    pairs = TranslationPairs(sources, [s.upper() for s in sources])
    rest, held = hold_out(pairs, 3, seed=0)
    assert len(rest) == 7 and len(held) == 3
    assert sorted(rest.sources + held.sources) == sorted(sources)  # a partition: nothing lost, nothing shared
    assert rest.sources == sorted(rest.sources, key=sources.index)  # original order kept
    assert held.targets == [s.upper() for s in held.sources]  # pairs stay aligned
    assert hold_out(pairs, 3, seed=0)[1].sources == held.sources  # seeded
    assert hold_out(pairs, 3, seed=1)[1].sources != held.sources
    for bad in (0, 10):
        with pytest.raises(ValueError, match="--heldout_samples"):
            hold_out(pairs, bad, seed=0)


@pytest.mark.smoke
@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/multi30k is not available")
def test_smoke_run_writes_finite_perplexity_and_bleu(tmp_path):
    command = [
        sys.executable, str(SCRIPT), "--data_dir", str(DATA_DIR), "--output_dir", str(tmp_path), "--model", "both",
        "--smoke", "--max_pool_samples", "400", "--max_test_samples", "24", "--num_train_epochs", "1",
        "--heldout_samples", "20", "--report_to", "none", "--disable_tqdm", "true", "--weight_average_decay", "0.9",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]

    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["num_train"] == 300 and summary["num_heldout"] == 20 and summary["num_test"] == 24
    assert summary["min_test_source_words"] >= summary["max_train_source_words"]
    for name in ("transformer", "panm"):
        result = summary["results"][name]
        assert math.isfinite(result["test_perplexity"]) and result["test_perplexity"] > 1.0
        assert isinstance(result["test_bleu"], float) and 0.0 <= result["test_bleu"] <= 100.0
        assert len(result["epoch_perplexity"]) == 1
        assert result["best_epoch_perplexity"] == result["epoch_perplexity"][0]  # the paper's best-over-the-curve
        # the moving average of the weights is scored beside them every epoch (--weight_average_decay)
        average = result["average_epoch_perplexity"]
        assert len(average) == 1 and result["best_average_epoch_perplexity"] == average[0]
        assert math.isfinite(average[0]["test_perplexity"])
        assert average[0]["test_perplexity"] != result["epoch_perplexity"][0]["test_perplexity"]
        # the held-out training-length pairs are scored every epoch and at the end, apart from the test split
        assert math.isfinite(result["heldout_perplexity"]) and result["heldout_perplexity"] > 1.0
        assert result["epoch_perplexity"][-1]["heldout_perplexity"] == result["heldout_perplexity"]
        assert result["epoch_perplexity"][-1]["test_perplexity"] == result["test_perplexity"]
        # the tokenizer trained here is saved with each model
        assert (tmp_path / name / "tokenizer.json").exists() and (tmp_path / name / "config.json").exists()
        # BLEU is decoded with the cache (a config shared between the two models once lost it)
        assert json.loads((tmp_path / name / "generation_config.json").read_text())["use_cache"] is True
    assert summary["results"]["panm"]["num_parameters"] != summary["results"]["transformer"]["num_parameters"]
    # the example's defaults, the one design: the paper's integration, the end-distance content read, both models'
    # decoders without positions (a window of 24)
    assert summary["placement"] == "replace" and summary["model_args"]["panm_design"] == "one"
    assert summary["model_args"]["content_read_keys"] == "end_distance"
    assert summary["model_args"]["decoder_positions"] == "none" and summary["model_args"]["decoder_window"] == 24

    # ablate_reads.py rebuilds the same test split from results.json and scores the saved models
    import ablate_reads

    written = tmp_path / "ablation.json"
    report = ablate_reads.main(["--run_dir", str(tmp_path), "--data_dir", str(DATA_DIR), "--output", str(written)])
    assert json.loads(written.read_text())["report"] == report  # the JSON holds the printed tables
    assert set(report) == {"transformer", "panm", "panm without Controller output", "panm without pointer reads"}
    num_target_tokens = None
    for tables in report.values():
        by_source, by_position = tables["source_words"], tables["target_positions"]
        assert by_source["all"]["n"] == 24 and math.isfinite(by_source["all"]["perplexity"])
        assert sum(row["n"] for bucket, row in by_source.items() if bucket != "all") == 24
        # the position buckets partition the same test tokens
        tokens = sum(row["tokens"] for row in by_position.values())
        assert tokens > 24 and tokens == (num_target_tokens or tokens)
        num_target_tokens = tokens
    assert report["panm without Controller output"]["source_words"]["all"] != report["panm"]["source_words"]["all"]
    assert report["panm without pointer reads"]["source_words"]["all"] != report["panm"]["source_words"]["all"]
    # PANM's memory cut to K slots: K beyond every test source is the uncut model, a short K is not
    cut_flags = ["--panm_memory_slots", "200", "2"]
    cut = ablate_reads.main(["--run_dir", str(tmp_path), "--data_dir", str(DATA_DIR), *cut_flags])
    assert cut["panm with PANM memory cut to 200 slots"] == report["panm"]
    assert cut["panm with PANM memory cut to 2 slots"]["source_words"]["all"] != report["panm"]["source_words"]["all"]
    assert "transformer with PANM memory cut to 2 slots" not in cut
    with pytest.raises(ValueError, match="--panm_memory_slots"):
        ablate_reads.main(["--run_dir", str(tmp_path), "--data_dir", str(DATA_DIR), "--panm_memory_slots", "0"])
    # the same run given twice: its models are told apart by directory, and score the same
    twice = ablate_reads.main(["--run_dir", str(tmp_path), str(tmp_path), "--data_dir", str(DATA_DIR)])
    name = f"transformer@{tmp_path.name}"
    assert twice[name] == report["transformer"]
    # a run trained under --control is scored with its control re-applied: marked as a no_pointer_reads run,
    # the saved PANM scores as it does without its pointer reads
    summary["model_args"]["control"] = "no_pointer_reads"
    (tmp_path / "results.json").write_text(json.dumps(summary))
    controlled = ablate_reads.main(["--run_dir", str(tmp_path), "--data_dir", str(DATA_DIR)])
    assert controlled["panm"] == report["panm without pointer reads"] != report["panm"]
    assert controlled["transformer"] == report["transformer"]


def test_ablate_reads_refuses_runs_tested_on_different_splits(tmp_path):
    import ablate_reads

    for name, ratio in (("a", 0.5), ("b", 0.8)):
        (tmp_path / name).mkdir()
        data_args = {"split_ratio": ratio, "max_test_samples": 500, "max_pool_samples": None,
                     "source_lang": "en", "target_lang": "de"}  # fmt: skip
        (tmp_path / name / "results.json").write_text(json.dumps({"data_args": data_args, "results": {}}))
    with pytest.raises(ValueError, match="--run_dir: the runs were tested on different splits"):
        ablate_reads.main(["--run_dir", str(tmp_path / "a"), str(tmp_path / "b"), "--data_dir", str(DATA_DIR)])


def test_plot_runs_merges_result_files_with_distinct_labels(tmp_path):
    import plot_runs

    def run(placement, names):
        curve = [{"epoch": 1.0, "test_perplexity": 9.0}, {"epoch": 2.0, "test_perplexity": 4.0}]
        return {"placement": placement, "results": {name: {"epoch_perplexity": curve} for name in names}}

    paths = []
    for index, (placement, names) in enumerate([("replace", ["transformer", "panm"]), ("stack", ["panm"]),
                                                ("replace", ["transformer"])]):
        paths.append(tmp_path / f"run{index}.json")
        paths[-1].write_text(json.dumps(run(placement, names)))
    merged = plot_runs.main([*map(str, paths), "--output", str(tmp_path / "curves.png")])
    assert list(merged) == ["transformer", "panm (replace)", "panm (stack)", "transformer@run2.json"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "other.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(ValueError, match="placement"):
        plot_runs.main([str(tmp_path / "other.json"), "--output", str(tmp_path / "x.png")])


def test_panm_weight_decay_applies_to_panm_weights_only(tmp_path):
    import torch
    from run_translation import ModelArguments, model_trainer, validate_model_args
    from transformers import BartConfig, Seq2SeqTrainingArguments

    from panm_hf import PanmConfig, PanmForSeq2SeqLM

    text_config = BartConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    model = PanmForSeq2SeqLM(PanmConfig(text_config=text_config.to_dict(), pointer_hidden_size=8,
                                        controller_hidden_size=8, mlp_hidden_size=8))  # fmt: skip
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), weight_decay=0.01, report_to="none")

    def rates(panm_weight_decay):
        trainer = model_trainer("panm", model, None, args, None, generate=False, panm_weight_decay=panm_weight_decay)
        optimizer = trainer.create_optimizer()
        rate_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
        # named_parameters() lists a tied weight once (the LM head is the embedding here)
        decay_names = set(trainer.get_decay_parameter_names(model)) & {n for n, _ in model.named_parameters()}
        return {name: rate_of[id(p)] for name, p in model.named_parameters()}, decay_names

    with_panm, decay_names = rates(0.5)
    panm_weights = [n for n in decay_names if n.startswith("panm.")]
    backbone_weights = [n for n in decay_names if not n.startswith("panm.")]
    assert panm_weights and backbone_weights  # both kinds exist in this model
    assert all(with_panm[n] == 0.5 for n in panm_weights)
    assert all(with_panm[n] == 0.01 for n in backbone_weights)
    assert all(rate == 0.0 for n, rate in with_panm.items() if n not in decay_names)  # biases and norms
    # Without the flag the optimizer is Trainer's: every weight at --weight_decay.
    default, _ = rates(None)
    assert all(default[n] == (0.01 if n in decay_names else 0.0) for n in default)

    with pytest.raises(ValueError, match="--panm_weight_decay"):
        validate_model_args(ModelArguments(panm_weight_decay=-0.1))
    # An optimizer that brings its own parameter structure is refused, not silently regrouped.
    trainer = model_trainer("panm", model, None, args, None, generate=False, panm_weight_decay=0.5)
    trainer.optimizer_cls_and_kwargs = (torch.optim.AdamW, {"model": model})
    with pytest.raises(ValueError, match="--panm_weight_decay needs an optimizer"):
        trainer.create_optimizer()


def test_best_epoch_picks_the_lowest_test_perplexity_not_the_last():
    from run_translation import best_epoch

    curve = [{"epoch": 1.0, "test_perplexity": 30.0}, {"epoch": 2.0, "test_perplexity": 21.5},
             {"epoch": 3.0, "test_perplexity": 22.0}]  # fmt: skip
    assert best_epoch(curve) == {"epoch": 2.0, "test_perplexity": 21.5}
    assert best_epoch([]) is None


@pytest.mark.parametrize("from_json", [False, True])
def test_example_defaults_apply_to_flags_and_json_and_yield_to_what_is_given(tmp_path, from_json):
    from run_translation import parse_arguments

    given = {"output_dir": str(tmp_path), "pointer_update": "attention", "seed": 7}
    if from_json:
        path = tmp_path / "args.json"
        path.write_text(json.dumps(given))
        argv = [str(path)]
    else:
        argv = [f"--{key}={value}" for key, value in given.items()]
    model_args, panm_args, _, training_args = parse_arguments(argv)
    # the example's defaults, the one design (a JSON file once fell back to PanmMemoryConfig's, the paper's)
    assert model_args.placement == "replace" and panm_args.panm_drop_path == 0.0
    assert (panm_args.content_read, panm_args.content_read_keys, panm_args.mlp_hidden_size) == (
        "decoder", "end_distance", 1024,
    )  # fmt: skip
    assert (model_args.decoder_positions, model_args.decoder_window) == ("none", 24)
    # what is given wins over them
    assert panm_args.pointer_update == "attention" and training_args.seed == 7


def parse_given(given: dict, tmp_path, from_json: bool) -> tuple:
    """run_translation's parsed arguments for the keys `given`, as flags or as a JSON argument file."""
    from run_translation import parse_arguments

    if from_json:
        path = tmp_path / "args.json"
        path.write_text(json.dumps({"output_dir": str(tmp_path), **given}))
        return parse_arguments([str(path)])
    return parse_arguments([f"--output_dir={tmp_path}", *(f"--{k}={v}" for k, v in given.items())])


@pytest.mark.parametrize("from_json", [False, True])
def test_turning_a_design_part_off_resets_the_defaults_that_need_it(tmp_path, from_json):
    """`--content_read none` or `--output_decoder_input false` under the one design's defaults gives the library's
    values for the flags that only mean something with them (no ValueError); naming such a flag still raises."""
    def parse(given):
        return parse_given(given, tmp_path, from_json)

    _, panm_args, _, _ = parse({"content_read": "none", "output_decoder_input": False})
    assert (panm_args.content_read_keys, panm_args.content_read_dropout, panm_args.output_decoder_drop_path) == (
        "memory", None, 0.0,
    )  # fmt: skip
    assert panm_args.panm_dropout == 0.3 and panm_args.mlp_hidden_size == 1024  # the rest of the design stays
    _, panm_args, _, _ = parse({"content_read": "controller"})
    assert panm_args.content_read_keys == "memory" and panm_args.content_read_dropout == 0.3
    with pytest.raises(ValueError, match="content_read_dropout"):
        parse({"content_read": "none", "content_read_dropout": 0.3})


@pytest.mark.parametrize("from_json", [False, True])
def test_a_named_design_replaces_the_whole_default_and_yields_to_flags(tmp_path, from_json):
    """`--panm_design multi30k` reproduces the example's defaults before stop 60, every flag of the one design reset;
    a flag given beside it wins; an unknown name raises a ValueError naming the choices."""
    def parse(given):
        return parse_given(given, tmp_path, from_json)

    model_args, panm_args, _, _ = parse({"panm_design": "multi30k", "pointer_hidden_size": 128})
    assert (model_args.panm_design, model_args.placement, model_args.decoder_positions, model_args.decoder_window) == (
        "multi30k", "stack", "absolute", 0,
    )  # fmt: skip
    assert (panm_args.panm_drop_path, panm_args.pointer_update, panm_args.content_read_keys) == (0.5, "shift", "memory")
    assert (panm_args.output_decoder_input, panm_args.mlp_hidden_size, panm_args.panm_dropout) == (False, 128, 0.0)
    assert panm_args.reads_dropout is None and panm_args.pointer_hidden_size == 128
    model_args, panm_args, _, _ = parse({})
    assert model_args.panm_design == "one" and panm_args.content_read_keys == "end_distance"
    with pytest.raises(ValueError, match="--panm_design must be one of"):
        parse({"panm_design": "best"})


def test_a_checkpoint_or_t5_keeps_its_decoder_unless_the_decoder_flags_are_named(tmp_path):
    """Under the one design's defaults a pretrained backbone is not given the design's decoder (its positions zeroed),
    a trained checkpoint keeps the settings it records and T5 its relative positions, unless the run names the
    decoder flags."""
    from run_translation import parse_arguments

    base = [f"--output_dir={tmp_path}", "--model_name_or_path=path/to/bart"]
    model_args, panm_args, _, _ = parse_arguments(base)
    assert (model_args.decoder_positions, model_args.decoder_window) == ("absolute", 0)
    assert panm_args.content_read_keys == "end_distance"  # PANM's own flags still wrap a plain backbone
    model_args, _, _, _ = parse_arguments([*base, "--decoder_window=24"])
    assert (model_args.decoder_positions, model_args.decoder_window) == ("absolute", 24)
    # T5's positions are relative: the design's decoder flags (which need absolute ones) do not apply to it
    model_args, panm_args, _, _ = parse_arguments([f"--output_dir={tmp_path}", "--backbone=t5"])
    assert (model_args.decoder_positions, model_args.decoder_window, panm_args.mlp_hidden_size) == ("absolute", 0, 1024)


def test_controls_train_panm_without_its_pointers_or_reads():
    import torch
    from run_translation import ModelArguments, build_model, validate_model_args
    from transformers import BartConfig

    from panm_hf import PanmMemoryConfig
    from panm_hf.pipelines.controls import apply_control

    text_config = BartConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    panm_args = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                 content_read="decoder", panm_drop_path=0.5)  # fmt: skip
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
        "labels": torch.tensor([[12, 13, 14, 2], [15, 16, 2, -100]]),
    }

    def logits_before_and_after_moving(control, part):
        torch.manual_seed(0)
        model = build_model("panm", ModelArguments(placement="stack", control=control), panm_args, text_config)
        # `stack` zero-initialises g^o's last layer, which would hide PANM's branch from the logits
        torch.nn.init.normal_(model.panm.controller.output_mlp[-1].weight)
        model.eval()
        before = model(**batch).logits
        modules = {  # the pointers: Pointer Units and the Mode-2 query; the content read: its attention
            "pointers": [model.panm.pointer_units, model.panm.mode2_reader],
            "content read": [model.panm.content_reader],
        }[part]
        with torch.no_grad():
            for parameter in (p for module in modules for p in module.parameters()):
                parameter.add_(torch.randn_like(parameter))
        return model, before, model(**batch).logits

    model, before, after = logits_before_and_after_moving("no_pointer_reads", "pointers")
    torch.testing.assert_close(after, before)  # the control's output does not see the pointers
    model.train()
    model(**batch).loss.backward()
    pointer_grads = [p.grad for p in model.panm.pointer_units.parameters()]
    assert all(g is None or not g.any() for g in pointer_grads)
    assert model.panm.controller.gru.weight_ih_l0.grad.any()  # the rest of PANM's branch still learns
    assert model.panm.content_reader.query.weight.grad.any()
    _, before, after = logits_before_and_after_moving("no_pointer_reads", "content read")
    assert not torch.allclose(after, before)  # ... and the content read still counts
    _, before, after = logits_before_and_after_moving("no_reads", "content read")
    torch.testing.assert_close(after, before)  # no_reads: neither does the content read
    for part in ("pointers", "content read"):  # without a control, moving either changes the output
        _, before, after = logits_before_and_after_moving(None, part)
        assert not torch.allclose(after, before)

    # no_decoder_input: the GRU's z_t columns learn nothing, its reads' do; z_t still queries the content read
    model, _, _ = logits_before_and_after_moving("no_decoder_input", "content read")
    model.train()
    model(**batch).loss.backward()
    gru_grad = model.panm.controller.gru.weight_ih_l0.grad  # (3 * hidden, reads + d_model): z_t's columns last
    assert not gru_grad[:, -text_config.d_model :].any() and gru_grad[:, : -text_config.d_model].any()
    assert model.panm.content_reader.query.weight.grad.any()
    # no_controller_decoder_input: the same columns start at zero and stay there through AdamW steps, and the
    # GRU's output does not move with z_t, while g^o (output_decoder_input) still reads it
    torch.manual_seed(0)
    one = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                           content_read="decoder", output_decoder_input=True)  # fmt: skip
    model = build_model("panm", ModelArguments(control="no_controller_decoder_input"), one, text_config)
    weight = model.panm.controller.gru.weight_ih_l0  # (3 * hidden, reads + d_model): z_t's columns last
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    assert not weight[:, -text_config.d_model :].any() and weight[:, : -text_config.d_model].any()
    inputs = torch.randn(2, 3, weight.shape[1])  # (batch, steps, reads + d_model)
    moved = torch.cat([inputs[..., : -text_config.d_model], torch.randn(2, 3, text_config.d_model)], dim=-1)
    gru = model.panm.controller.gru
    torch.testing.assert_close(gru(moved)[0], gru(inputs)[0])  # the GRU's states do not see z_t
    output_weight = model.panm.controller.output_mlp[0].weight  # (mlp, reads + hidden + d_model): z_t's last
    assert output_weight.grad[:, -text_config.d_model :].any()
    with pytest.raises(ValueError, match="no_controller_decoder_input needs a GRU Controller"):
        lstm = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                content_read="decoder", controller_cell="lstm")  # fmt: skip
        build_model("panm", ModelArguments(control="no_controller_decoder_input"), lstm, text_config)

    with pytest.raises(ValueError, match="--control must be one of"):
        validate_model_args(ModelArguments(control="no_pointers"))
    with pytest.raises(ValueError, match="--control applies to the PANM model"):
        validate_model_args(ModelArguments(model="transformer", control="no_pointer_reads"))
    controller_read = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                       content_read="controller")  # fmt: skip
    with pytest.raises(ValueError, match="--content_read controller"):
        build_model("panm", ModelArguments(control="no_pointer_reads"), controller_read, text_config)
    with pytest.raises(ValueError, match="needs a PANM model"):
        apply_control(build_model("transformer", ModelArguments(), panm_args, text_config), "no_pointer_reads")


def test_decoder_positions_flag_reaches_both_models_and_the_config():
    """`--decoder_positions` is a flag of every seq2seq example (the translation script here): `build_model`
    applies it to the Transformer and to PANM, `offset` widens the position table, t5 is refused by name."""
    import torch
    from run_translation import ModelArguments, backbone_config, build_model, validate_model_args
    from transformers import BartConfig

    from panm_hf import PanmMemoryConfig

    text_config = BartConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    panm_args = PanmMemoryConfig(pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8)
    for name in ("transformer", "panm"):
        args = ModelArguments(placement="replace", decoder_positions="none")
        validate_model_args(args)
        model = build_model(name, args, panm_args, text_config)
        positions = model.get_decoder().embed_positions.weight
        assert not positions.requires_grad and torch.count_nonzero(positions) == 0, name
        encoder_positions = model.get_encoder().embed_positions.weight
        assert encoder_positions.requires_grad and torch.count_nonzero(encoder_positions) > 0, name
        plain = build_model(name, ModelArguments(placement="replace"), panm_args, text_config)
        assert torch.count_nonzero(plain.get_decoder().embed_positions.weight) > 0, name
    tokenizer = type("Tokenizer", (), {"pad_token_id": 1, "eos_token_id": 2, "bos_token_id": 0,
                                       "__len__": lambda self: 40})()  # fmt: skip
    offset = ModelArguments(backbone="bart", decoder_positions="offset", max_position_offset=16)
    assert backbone_config(offset, tokenizer, 32).max_position_embeddings == 48
    with pytest.raises(ValueError, match="--decoder_positions none needs a decoder with absolute positions"):
        validate_model_args(ModelArguments(backbone="t5", decoder_positions="none"))
    with pytest.raises(ValueError, match="--decoder_positions must be one of"):
        validate_model_args(ModelArguments(decoder_positions="rope"))
    with pytest.raises(ValueError, match="--decoder_window must be >= 0"):
        validate_model_args(ModelArguments(decoder_window=-1))
    with pytest.raises(ValueError, match="--decoder_window needs --backbone bart or marian"):
        validate_model_args(ModelArguments(backbone="t5", decoder_window=8))
    windowed = build_model("transformer", ModelArguments(decoder_window=4), panm_args, text_config)
    causal = [m for m in windowed.modules() if getattr(m, "is_causal", False) is True]
    assert causal and all(m.window == 4 and m.alibi is False for m in causal)


def test_the_default_design_is_the_one_measured_on_multi30k(tmp_path):
    """The documented commands (docs/results/scan.md, translation.md's base command) parse to the model flags that
    the recorded Multi30K runs ran with: `--panm_design one` to the one design's, `multi30k` to the earlier
    default's."""
    import shlex
    from dataclasses import asdict

    from run_translation import parse_arguments

    base = ("--panm_design multi30k --num_layers 2 --d_model 128 --ffn_dim 256 --attention_heads 4 --vocab_size 4000 "
            "--pointer_hidden_size 128 --controller_hidden_size 128 --mlp_hidden_size 128 --split_ratio 0.5 "
            f"--backbone bart --model panm --output_dir {tmp_path}")  # fmt: skip
    one = " --panm_design one --pointer_hidden_size 256 --controller_hidden_size 256 --mlp_hidden_size 1024"
    runs = json.loads((ROOT / "docs/results/translation/split0.5_design_probes_seed42.json").read_text())["runs"]
    for command, key in ((base + one, "bart_0.5_window_design_zg_m1024_pd0.3_rd0_crd0.3_odp0.5_ek_s42"),
                         (base, "bart_0.5_m30k_design_s42_intel")):  # fmt: skip
        model_args, panm_args, _, _ = parse_arguments(shlex.split(command))
        parsed = {**asdict(model_args), **asdict(panm_args)}
        recorded = runs[key]["model_args"]
        assert {name: parsed[name] for name in recorded} == recorded
