"""The benchmark's summary against the speed targets, from hand-made rows."""
from __future__ import annotations

import pytest

from dashgen.tools.bench_summary import render, summarize, verdicts

ANCHORS = {(64, "full"): {"FA3_det": {1024: 200.0, 2048: 400.0}}}


def row(label, impl, schedule, deterministic, tflops, seqlen, direction="backward"):
    return dict(label=label, impl=impl, schedule=schedule, deterministic=deterministic,
                direction=direction, seqlen=seqlen, head_dim=64, mask="full", tflops=tflops,
                extra_bytes=105, floor_bytes=100, error=None)


def rows_at(seqlen, auto, shift, fa3, shift_nondet, flex, fwd, sdpa_fwd):
    return [row("dashgen_det shift", "dashgen", "shift", True, shift, seqlen),
            row("dashgen_det fa3", "dashgen", "fa3", True, fa3, seqlen),
            row("dashgen_nondet shift", "dashgen", "shift", False, shift_nondet, seqlen),
            row("dashgen_nondet fa3", "dashgen", "fa3", False, 999.0, seqlen),
            row("dashgen_det auto", "dashgen", "auto", True, auto, seqlen),
            row("flex (det)", "flex", None, True, flex, seqlen),
            row("sdpa_flash_det (FA2)", "sdpa_flash", None, True, 100.0, seqlen),
            row("dashgen forward", "dashgen", None, None, fwd, seqlen, "forward"),
            row("sdpa_flash forward", "sdpa_flash", None, None, sdpa_fwd, seqlen, "forward"),
            row("sdpa_cudnn forward", "sdpa_cudnn", None, None, sdpa_fwd * 1.2, seqlen,
                "forward")]


def test_summary_compares_auto_with_the_best_schedule_and_the_anchor():
    rows = rows_at(1024, auto=180.0, shift=200.0, fa3=150.0, shift_nondet=250.0, flex=190.0,
                   fwd=90.0, sdpa_fwd=100.0)
    rows += rows_at(2048, auto=396.0, shift=390.0, fa3=380.0, shift_nondet=400.0, flex=300.0,
                    fwd=110.0, sdpa_fwd=100.0)
    s = summarize(rows, ANCHORS)
    assert [c["seqlen"] for c in s] == [1024, 2048]
    assert s[0]["best_schedule"] == "shift" and s[0]["best"] == 200.0
    assert s[0]["price"] == pytest.approx(1 - 200 / 250)  # best det schedule vs its nondet
    assert s[1]["price"] == pytest.approx(1 - 390 / 400)
    assert s[0]["memory"] == pytest.approx(1.05)
    got = dict(verdicts(s))
    assert got["auto faster than FlexAttention"] == "1 of 2 configurations"  # 180 < 190
    assert got["auto faster than SDPA flash deterministic"] == "2 of 2 configurations"
    # auto / FA3: 0.9 and 0.99 -> geometric mean sqrt(0.891)
    assert got["auto / FA3_det anchor"].startswith("geometric mean 0.94 ")
    assert "worst 0.90" in got["auto / FA3_det anchor"]
    assert got["price of determinism <= 10% at seqlen >= 2048"] == "1 of 1 configurations"
    assert got["forward >= SDPA flash forward"] == "1 of 2 configurations"
    assert got["forward >= SDPA cuDNN forward"] == "0 of 2 configurations"  # 110 < 120
    assert got["extra memory within 10% of the floor"] == "2 of 2 configurations"
    assert got["auto within 3% of the best schedule"] == "1 of 2 configurations"  # 0.9, 1.015
    text = render(s)
    assert "| d64 full 1024 | 180.0 | 200.0 (shift) | 0.900 | 0.90 |" in text
    assert "| 110.0 / 100.0 / 120.0 |" in text


def test_the_pick_of_auto_is_judged_by_its_schedules_own_row():
    rows = rows_at(1024, auto=180.0, shift=200.0, fa3=150.0, shift_nondet=250.0, flex=190.0,
                   fwd=90.0, sdpa_fwd=100.0)
    rows += rows_at(2048, auto=396.0, shift=370.0, fa3=390.0, shift_nondet=400.0, flex=300.0,
                    fwd=110.0, sdpa_fwd=100.0)
    got = dict(verdicts(summarize(rows, ANCHORS)))
    assert "auto's pick (its schedule's own row) within 3% of the best schedule" not in got
    for r in rows:
        if r["schedule"] == "auto":
            r["picked"] = "shift"
    s = summarize(rows, ANCHORS)
    assert [c["pick"] for c in s] == [200.0, 370.0]
    got = dict(verdicts(s))
    # 1024: shift is the best; 2048: shift 370 vs fa3 390 (0.949)
    assert got["auto's pick (its schedule's own row) within 3% of the best schedule"] == \
        "1 of 2 configurations"
    assert got["auto within 3% of the best schedule"] == "1 of 2 configurations"  # 0.9, 1.015
    # The same kernel twice: 180 vs 200 (10.0%) and 396 vs 370 (7.0%).
    assert got["timing noise (the auto row against its pick's own row, the same kernel)"] == \
        "median 8.5%, worst 10.0% (d64 full 1024)"


def test_configurations_without_an_auto_row_are_left_out():
    rows = [r for r in rows_at(1024, 1, 2, 3, 4, 5, 6, 7) if r["schedule"] != "auto"]
    assert summarize(rows, ANCHORS) == [] and render([]) == ""


def test_the_timing_noise_line_survives_equal_gaps():
    rows = rows_at(1024, auto=200.0, shift=200.0, fa3=150.0, shift_nondet=250.0, flex=190.0,
                   fwd=90.0, sdpa_fwd=100.0)
    rows += rows_at(2048, auto=390.0, shift=390.0, fa3=380.0, shift_nondet=400.0, flex=300.0,
                    fwd=110.0, sdpa_fwd=100.0)
    for r in rows:
        if r["schedule"] == "auto":
            r["picked"] = "shift"
    s = summarize(rows, ANCHORS)
    got = dict(verdicts(s))
    assert got["timing noise (the auto row against its pick's own row, the same kernel)"] == \
        "median 0.0%, worst 0.0% (d64 full 2048)"
    assert "timing noise" in render(s)


def test_block_spread_reports_how_far_a_rows_rounds_move():
    """The spread of each backward row's round medians (max / min - 1): the worst row named, the
    forward rows and rows without their timed calls (older runs) left out."""
    rows = rows_at(1024, auto=180.0, shift=200.0, fa3=150.0, shift_nondet=250.0, flex=190.0,
                   fwd=90.0, sdpa_fwd=100.0)
    rows[0]["times"] = [[1.0, 1.0, 9.0], [1.1, 1.2, 1.1]]   # medians 1.0, 1.1: 10%
    rows[1]["times"] = [[2.0, 2.0], [2.0, 2.04], [2.06]]    # 2.0, 2.02, 2.06: 3%
    rows[2]["times"] = [[3.0]]                              # one round: no spread
    rows[-2]["times"] = [[1.0], [5.0]]                      # a forward row
    text = render(summarize(rows, ANCHORS), rows)
    assert ("- block spread (a backward row's round medians, max / min - 1): median 6.5%, "
            "worst 10.0% (dashgen_det shift, d64 full 1024)") in text
    assert "block spread" not in render(summarize(rows_at(
        1024, 180.0, 200.0, 150.0, 250.0, 190.0, 90.0, 100.0), ANCHORS), rows_at(
        1024, 180.0, 200.0, 150.0, 250.0, 190.0, 90.0, 100.0))
