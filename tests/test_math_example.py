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
    # the example's defaults, the measured best on place_value: the whole backbone kept, PANM drop-pathed
    assert summary["model_args"]["placement"] == "stack" and summary["model_args"]["panm_drop_path"] == 0.5
    assert summary["model_args"]["content_read"] == "decoder"
    for name in ("transformer", "panm"):
        result = summary["results"][name]
        for split in ("interpolate", "extrapolate"):
            assert 0.0 <= result[f"{split}_accuracy"] <= 100.0
        assert result["train_loss"] > 0
        assert (tmp_path / name / "config.json").is_file()
    assert summary["results"]["panm"]["num_parameters"] != summary["results"]["transformer"]["num_parameters"]
