"""Example scripts run end to end (seconds; marked smoke: `make test-smoke`)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.smoke
def test_quickstart_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--output_dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "reloaded as PanmForSeq2SeqLM" in result.stdout
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "modeling_panm.py").exists()
