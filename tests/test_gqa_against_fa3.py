"""scripts/gqa_against_fa3.py's table on hand-made rows (the measuring needs FA3 and a GPU)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gqa_against_fa3  # noqa: E402


def test_table_gives_the_ratio_bits_and_agreement_and_dashes_for_a_cell_that_did_not_run():
    rows = [
        dict(hdim=128, causal=True, seqlen=8192, deterministic=True, errors={},
             dashgen_tflops=364.5, fa3_tflops=350.7, dashgen_bitwise=True, fa3_bitwise=True,
             grad_norm_rel_diff=1.04e-5),
        dict(hdim=64, causal=False, seqlen=2048, deterministic=False,
             errors={"fa3": "RuntimeError('no')"}, dashgen_tflops=276.8, dashgen_bitwise=False),
    ]
    lines = gqa_against_fa3.table(rows).splitlines()
    assert lines[0].startswith("| config | mode | dashgen TFLOP/s | FA3 TFLOP/s | dashgen / FA3")
    assert lines[2] == "| d128 causal 8192 | det | 364.5 | 350.7 | 1.039 | True, True | 1.0e-05 |"
    assert lines[3] == "| d64 full 2048 | nondet | 276.8 | - | - | False, - | - |"
    assert len(lines) == 4


def test_the_committed_figures_render_as_committed():
    folder = Path(__file__).resolve().parents[1] / "docs/bench/2026-12-04-gqa-fa3"
    rows = json.loads((folder / "gqa_against_fa3.json").read_text())["rows"]
    assert gqa_against_fa3.table(rows) + "\n" == (folder / "gqa_against_fa3.md").read_text()
