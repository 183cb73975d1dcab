"""compute-sanitizer memcheck and racecheck over small runs of the kernel variants
(tests/gpu/sanitize_case.py), as select picks them and with each policy switched: no
out-of-bounds or misaligned access, no shared-memory race."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from sanitize_case import CASES, MODIFIER_CASES, VARLEN_CASES  # noqa: E402
CASE = Path(__file__).with_name("sanitize_case.py")


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        candidate = Path(home or "/nonexistent", "bin", "compute-sanitizer")
        if candidate.is_file():
            return str(candidate)
    return None


@pytest.mark.parametrize("flipped", ["0", "1"], ids=["selected", "flipped"])
@pytest.mark.parametrize("tool,summary", [
    ("memcheck", "ERROR SUMMARY: 0 errors"),
    ("racecheck", "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"),
])
def test_compute_sanitizer_finds_nothing(tool, summary, flipped, tmp_path):
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DASHGEN_CACHE_DIR=str(tmp_path / "cache"),
               DASHGEN_SANITIZE_FLIPPED=flipped)
    # Host API errors (the driver probing optional entry points) are not kernel errors.
    proc = subprocess.run([sanitizer, "--tool", tool, "--report-api-errors", "no",
                           "--print-limit", "50", sys.executable, str(CASE)],
                          capture_output=True, text=True, timeout=900, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("ran fwd=") == len(CASES), out[-4000:]
    assert out.count("ran varlen ") == (len(VARLEN_CASES) if flipped == "0" else 0), out[-4000:]
    assert out.count("ran modifier ") == (len(MODIFIER_CASES) if flipped == "0" else 0), \
        out[-4000:]
    assert summary in out, out[-4000:]
