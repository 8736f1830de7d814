"""The Mathematics example: data loading, the character tokenizer, and an end-to-end run on a tiny slice."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_math import char_tokenizer, exact_match, read_pairs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "math" / "run_math.py"
DATA_DIR = ROOT.parent / "shared" / "data" / "math"


def test_char_tokenizer_round_trips_and_ends_with_eos():
    tokenizer = char_tokenizer(["What is -5 + 2?", "-3"])
    ids = tokenizer("What is 2 + -5?")["input_ids"]
    assert len(ids) == len("What is 2 + -5?") + 1 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "What is 2 + -5?"
    assert tokenizer("Z")["input_ids"][0] == tokenizer.unk_token_id  # unseen characters map to <unk>


def test_exact_match_compares_whole_answers():
    import numpy as np

    tokenizer = char_tokenizer(["0123456789-."])
    predictions = [tokenizer(text)["input_ids"] for text in ("12", "-3", "4")]
    width = max(map(len, predictions))
    padded = np.array([p + [-100] * (width - len(p)) for p in predictions])  # Trainer pads with -100
    assert exact_match(padded, ["12", "-3", "45"], tokenizer) == pytest.approx(200 / 3)


def test_read_pairs_names_the_file_on_bad_input(tmp_path):
    good = tmp_path / "m.train.tsv.gz"
    with gzip.open(good, "wt", encoding="utf-8") as handle:
        handle.write("What is 1 + 1?\t2\nWhat is 2 + 2?\t4\n")
    assert read_pairs(good, limit=1) == (["What is 1 + 1?"], ["2"])
    bad_line = tmp_path / "bad.tsv.gz"
    with gzip.open(bad_line, "wt", encoding="utf-8") as handle:
        handle.write("What is 1 + 1?\t2\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv\.gz, line 2"):
        read_pairs(bad_line)
    not_gzip = tmp_path / "plain.tsv.gz"
    not_gzip.write_text("What is 1 + 1?\t2\n")
    with pytest.raises(ValueError, match=r"plain\.tsv\.gz is not a readable gzipped"):
        read_pairs(not_gzip)
    with pytest.raises(ValueError, match="does not exist"):
        read_pairs(tmp_path / "missing.tsv.gz")


@pytest.mark.smoke
@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="shared/data/math is not available")
def test_smoke_run_scores_both_models_on_both_sets(tmp_path):
    command = [
        sys.executable, str(SCRIPT), "--data_dir", str(DATA_DIR), "--module", "add_or_sub", "--output_dir",
        str(tmp_path), "--model", "both", "--smoke",
        "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["module"] == "add_or_sub" and summary["num_eval"] == {"interpolate": 16, "extrapolate": 16}
    # the example's defaults, the one design: the paper's integration, the end-distance content read, no decoder
    # positions (both models)
    assert summary["model_args"]["placement"] == "replace" and summary["model_args"]["panm_drop_path"] == 0.0
    assert summary["model_args"]["content_read"] == "decoder"
    assert summary["model_args"]["content_read_keys"] == "end_distance"
    assert summary["model_args"]["decoder_positions"] == "none"
    for name in ("transformer", "panm"):
        result = summary["results"][name]
        for split in ("interpolate", "extrapolate"):
            assert 0.0 <= result[f"{split}_accuracy"] <= 100.0
        assert result["train_loss"] > 0
        assert (tmp_path / name / "config.json").is_file()
    assert summary["results"]["panm"]["num_parameters"] != summary["results"]["transformer"]["num_parameters"]


def _tiny_run(tmp_path: Path, **panm_fields) -> tuple[Path, Path]:
    """A saved tiny PANM model with a run_math.py `results.json`, and a data folder of 4 place_value pairs."""
    import torch
    from conftest import BACKBONES

    from panm_hf import PanmConfig, PanmForSeq2SeqLM

    pairs = [("What is the units digit of 4712?", "2"), ("What is the tens digit of 38?", "3"),
             ("What is the hundreds digit of 905?", "9"), ("What is the units digit of 61?", "1")]  # fmt: skip
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for split in ("interpolate", "extrapolate"):
        with gzip.open(data_dir / f"place_value.{split}.tsv.gz", "wt") as handle:
            handle.writelines(f"{question}\t{answer}\n" for question, answer in pairs)
    tokenizer = char_tokenizer([text for pair in pairs for text in pair])
    torch.manual_seed(0)
    text_config = BACKBONES["bart"]().to_dict() | {"pad_token_id": tokenizer.pad_token_id,
                                                    "eos_token_id": tokenizer.eos_token_id}  # fmt: skip
    model = PanmForSeq2SeqLM(PanmConfig(text_config=text_config, placement="replace", content_read="decoder",
                                        pointer_hidden_size=8, controller_hidden_size=8, mlp_hidden_size=8,
                                        **panm_fields))  # fmt: skip
    run_dir = tmp_path / "run"
    model.save_pretrained(run_dir / "panm")
    tokenizer.save_pretrained(run_dir / "panm")
    summary = {"module": "place_value", "data_args": {"max_eval_samples": 4, "max_target_length": 4},
               "model_args": {"decoder_positions": "none", "decoder_window": 2}}  # fmt: skip
    (run_dir / "results.json").write_text(json.dumps(summary))
    return run_dir, data_dir


def test_ablate_paths_cuts_each_path_where_the_controller_takes_it(tmp_path):
    import torch
    from ablate_paths import CUTS, ablate, load_run

    run_dir, data_dir = _tiny_run(tmp_path, output_decoder_input=True)
    scores = ablate(run_dir, data_dir, list(CUTS))
    places = {f"{split}_by_place" for split in ("interpolate", "extrapolate")}
    assert set(scores) == {f"{split}_{cut}" for split in ("interpolate", "extrapolate") for cut in CUTS} | places
    assert all(0.0 <= scores[key] <= 100.0 for key in set(scores) - places)
    by_place = scores["extrapolate_by_place"]
    assert {place: entry["count"] for place, entry in by_place.items()} == {"units": 2, "tens": 1, "hundreds": 1}
    weighted = sum(entry["count"] * entry["exact_match"] for entry in by_place.values()) / 4
    assert abs(weighted - scores["extrapolate_none"]) < 0.1  # the places' scores make up the whole
    _, model, tokenizer = load_run(run_dir)
    assert model.get_decoder().embed_positions.weight.abs().sum() == 0  # the run's decoder settings applied
    controller = model.panm.controller
    batch = tokenizer(["What is the units digit of 4712?"], return_tensors="pt")
    decoder_inputs = torch.tensor([[tokenizer.pad_token_id, 5]])
    z_width, slot_width = controller.decoder_input_size, model.panm.memory_dim
    for cut, module, width in (("no_output_decoder_input", controller.output_mlp[0], z_width),
                               ("no_content_read", controller, slot_width)):  # fmt: skip
        for with_cut in (True, False):  # the cut's columns are zero, and back once its hook is removed
            seen = []
            handles = [CUTS[cut](model)] if with_cut else []
            handles.append(module.register_forward_pre_hook(lambda m, inputs, seen=seen: seen.append(inputs[0])))
            model(**batch, decoder_input_ids=decoder_inputs)
            for handle in handles:
                handle.remove()
            assert torch.all(seen[0][..., -width:] == 0) == with_cut, cut


def test_ablate_paths_refuses_a_cut_the_model_has_no_path_for(tmp_path):
    from ablate_paths import ablate

    run_dir, data_dir = _tiny_run(tmp_path)  # g^o without z_t
    with pytest.raises(ValueError, match="needs a model trained with --output_decoder_input true"):
        ablate(run_dir, data_dir, ["no_output_decoder_input"])
