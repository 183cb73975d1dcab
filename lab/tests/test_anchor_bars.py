"""lab/anchor_bars.py on hand-made kit rows: which anchors count, FA4's drift scaling, the
three bars."""
from __future__ import annotations

import json

import pytest

import anchor_bars  # lab/ is on the path (the root conftest.py)

SEQLENS = [1024, 2048, 4096, 8192, 16384]


def kit_row(impl, mode, tflops, seqlen=1024, wrong=False):
    return dict(impl=impl, mode=mode, hdim=64, causal=True, seqlen=seqlen, bwd_tflops=tflops,
                norm_rel_dev_vs_sdpa=20.0 if wrong else 0.0)


def reference(fa4_det, fa4_nondet, cudnn, fa4_fwd=400.0):
    rows = [dict(impl="FA4", mode="det", direction="backward", tflops=[fa4_det] * 5),
            dict(impl="FA4", mode="nondet", direction="backward", tflops=[fa4_nondet] * 5),
            dict(impl="sdpa_cudnn", mode="nondet", direction="backward", tflops=[cudnn] * 5),
            dict(impl="FA4", mode=None, direction="forward", tflops=[fa4_fwd] * 5)]
    return dict(seqlens=SEQLENS, rows=[dict(r, hdim=64, causal=True) for r in rows])


def test_wrong_dash_gradients_do_not_count_and_fa4_scales_with_cudnns_drift():
    kit = [kit_row("dashgen", "det", 300.0), kit_row("fa3", "det", 250.0),
           kit_row("dash", "det", 400.0, wrong=True), kit_row("dash", "nondet", 500.0, wrong=True),
           kit_row("fa3", "nondet", 330.0), kit_row("sdpa_cudnn", "nondet", 220.0)]
    # This run's cuDNN is 10% above the recorded 200: FA4's 290 / 310 count as 319 / 341.
    (row,) = anchor_bars.bars(kit, reference(290.0, 310.0, 200.0))
    assert row["fa4_scale"] == pytest.approx(1.1)
    assert row["best_det"] == "FA4_det" and row["det"] == pytest.approx(300 / 319)
    assert row["best_nondet"] == "FA4_nondet" and row["nondet"] == pytest.approx(300 / 341)
    # Within 3%: the recorded figures stand; the correct DASH row would be the best.
    kit[2]["norm_rel_dev_vs_sdpa"] = 0.0
    (row,) = anchor_bars.bars(kit, reference(290.0, 310.0, 215.0))
    assert row["fa4_scale"] == 1.0
    assert (row["best_det"], row["det"]) == ("DASH_det", pytest.approx(0.75))


def test_the_bars_and_the_forward_from_a_bench_run(tmp_path):
    kit = []
    for seqlen, ours in zip(SEQLENS[:2], (300.0, 200.0)):
        kit += [kit_row("dashgen", "det", ours, seqlen), kit_row("fa3", "det", 250.0, seqlen),
                kit_row("fa3", "nondet", 300.0, seqlen),
                kit_row("sdpa_cudnn", "nondet", 200.0, seqlen)]
    bench = dict(rows=[dict(impl=impl, direction="forward", head_dim=64, mask="causal",
                            seqlen=1024, tflops=tflops)
                       for impl, tflops in (("dashgen", 420.0), ("sdpa_cudnn", 400.0))])
    rows = anchor_bars.bars(kit, reference(100.0, 100.0, 200.0), bench)
    assert [r["seqlen"] for r in rows] == [1024, 2048]
    assert rows[0]["forward_vs_cudnn"] == pytest.approx(1.05)
    assert rows[0]["forward_vs_fa4"] == pytest.approx(420 / 400)
    assert rows[1]["forward"] is None
    lines = anchor_bars.verdicts(rows)
    assert lines[0] == "det / best deterministic anchor >= 1.0: 1 of 2 configurations"
    # det / best non-det: 300/300 and 200/300 -> geometric mean sqrt(2/3)
    assert lines[1].startswith("det / best non-deterministic: geometric mean 0.816 ")
    assert "worst 0.667" in lines[1]
    assert lines[2] == "forward / SDPA cuDNN forward >= 1.0: 1 of 1 configurations"
    paths = {}
    for name, data in (("anchors", kit), ("bench", bench),
                       ("reference", reference(100.0, 100.0, 200.0))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    out = tmp_path / "bars.md"
    anchor_bars.main(["--anchors", str(paths["anchors"]), "--bench", str(paths["bench"]),
                      "--reference", str(paths["reference"]), "--out", str(out)])
    text = out.read_text()
    assert "| d64 causal 1024 | 300.0 | 1.200 (FA3_det) | 1.000 (FA3_nondet) | 420.0 | 1.050 |" \
        in text


def test_the_recorded_fa4_figures_cover_the_twenty_configurations():
    data = json.loads(anchor_bars.REFERENCE.read_text())
    ref = anchor_bars._reference(data)
    for hdim in (64, 128):
        for causal in (False, True):
            for seqlen in SEQLENS:
                for key in (("FA4", "det", "backward"), ("FA4", "nondet", "backward"),
                            ("sdpa_cudnn", "nondet", "backward"), ("FA4", None, "forward")):
                    assert ref[(*key, hdim, causal, seqlen)] > 0


def test_price_of_determinism_from_the_kit_and_memory_from_the_bench():
    kit = []
    # dashgen det / nondet: 1k (not counted, below 2048), 2k 4% slower, 4k faster.
    for seqlen, det, nondet in ((1024, 200.0, 300.0), (2048, 288.0, 300.0), (4096, 310.0, 300.0)):
        kit += [kit_row("dashgen", "det", det, seqlen), kit_row("dashgen", "nondet", nondet, seqlen),
                kit_row("fa3", "det", 250.0, seqlen)]
    bench = dict(rows=[dict(impl="dashgen_auto", direction="backward", head_dim=64, mask="causal",
                            seqlen=seqlen, extra_bytes=extra, floor_bytes=100)
                       for seqlen, extra in ((1024, 105), (2048, 112), (4096, 100))])
    rows = anchor_bars.bars(kit, reference(100.0, 100.0, 200.0), bench)
    assert [r["price"] for r in rows] == [pytest.approx(1 / 3), pytest.approx(0.04),
                                          pytest.approx(-10 / 300)]
    assert [r["memory"] for r in rows] == [1.05, 1.12, 1.0]
    lines = anchor_bars.verdicts(rows)
    assert lines[3] == ("price of determinism <= 3% at seqlen >= 2048: 1 of 2 configurations "
                        "(highest 4.0%, d64 causal 2048)")
    assert lines[4] == "memory / floor <= 1.1: 2 of 3 configurations (highest 1.120)"
    assert "| 4.0% | 1.120 |" in anchor_bars.render(rows)
