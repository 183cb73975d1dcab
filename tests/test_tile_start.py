"""scripts/tile_start.py on bench rows made from a known start and step: the fit gives them back,
under either mask, and refuses a single length."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import tile_start  # noqa: E402

LENGTHS = (1024, 2048, 4096, 8192, 16384)


def rows(label: str, head_dim: int, mask: str, start: float, step_tflops: float) -> list[dict]:
    """Forward rows whose query tiles take start + n steps, a step doing a full 128-key step's
    FLOPs at step_tflops; the TFLOP/s counted as the benchmark counts FLOPs (causal: half)."""
    out = []
    for seqlen in LENGTHS:
        n, c = tile_start.kv_tiles(seqlen, mask == "causal")
        out.append({"label": label, "direction": "forward", "head_dim": head_dim, "mask": mask,
                    "seqlen": seqlen, "tflops": step_tflops * c / (start + n)})
    return out


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_the_fit_returns_the_start_and_step_the_rows_were_made_from(mask):
    made = rows("dashgen forward", 64, mask, 3.0, 480.0)
    n, c = zip(*(tile_start.kv_tiles(r["seqlen"], mask == "causal") for r in made))
    start, step = tile_start.fit([(a, b, r["tflops"]) for a, b, r in zip(n, c, made)])
    assert start == pytest.approx(3.0)
    assert step == pytest.approx(480.0 * c[-1] / n[-1])


def test_kv_tiles_count_the_causal_diagonal_as_run_and_as_counted():
    assert tile_start.kv_tiles(1024, False) == (8.0, 8.0)
    assert tile_start.kv_tiles(1024, True) == (4.5, 4.0)
    assert tile_start.kv_tiles(1000, False) == (8.0, 1000 / 128)


def test_table_has_a_row_per_forward_and_configuration(tmp_path, capsys):
    data = {"meta": {"gpu": "NVIDIA H200", "commit": "abc1234", "date": "2026-12-04"},
            "rows": rows("dashgen forward", 64, "full", 3.0, 480.0)
            + rows("sdpa_cudnn forward", 64, "full", 1.5, 450.0)
            + [{"label": "dashgen_det auto", "direction": "backward", "head_dim": 64,
                "mask": "full", "seqlen": 1024, "tflops": 1.0}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    tile_start.main([str(path), "--out", str(tmp_path / "t.md")])
    text = (tmp_path / "t.md").read_text()
    assert "| d64 full 1024-16384 | dashgen forward | 3.00 / 3.00 | 480 / 480 |" in text
    assert "| d64 full 1024-16384 | sdpa_cudnn forward | 1.50 / 1.50 | 450 / 450 |" in text
    assert text.count("| d64 ") == 2 and "abc1234" in text
    assert text in capsys.readouterr().out + "\n"


def test_one_length_is_refused():
    with pytest.raises(ValueError, match="two lengths"):
        tile_start.fit([(8.0, 8.0, 300.0), (8.0, 8.0, 310.0)])
