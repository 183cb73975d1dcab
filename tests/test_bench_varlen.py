"""dashgen bench --varlen without a GPU: the pack's lengths, the kept work, and how one
configuration's rows are set up and timed (fake rows and a fake clock)."""
from __future__ import annotations

import pytest

from dashgen.tools import bench_varlen


def test_document_lengths_fill_the_pack_exactly_and_repeat_by_seed():
    a = bench_varlen.document_lengths(16384, seed=0)
    assert sum(a) == 16384 and min(a) >= 1
    assert a == bench_varlen.document_lengths(16384, seed=0)
    assert a != bench_varlen.document_lengths(16384, seed=1)


def test_kept_pairs_count_the_masks_keys():
    assert bench_varlen.kept_pairs([3, 0, 2], causal=False) == 9 + 4
    assert bench_varlen.kept_pairs([3, 0, 2], causal=True) == 6 + 3


def test_a_configurations_rows_are_set_up_first_then_timed_in_rounds():
    events = []

    def row(label, ms, fails_setup=False, fails_run=False):
        def setup():
            events.append(("setup", label))
            if fails_setup:
                raise RuntimeError("no kernel here")

            def fn():
                if fails_run:
                    raise ValueError("bad call")
                return ms
            return fn
        return label, setup

    plan = [row("dashgen varlen det (auto: hybrid)", 2.0), row("flex document mask", 4.0),
            row("dashgen fixed-length det (1024 x 16)", 1.0),
            row("torch.nn.attention.varlen", 3.0, fails_setup=True),
            row("sdpa padded batch (mask)", 5.0, fails_run=True)]
    def time_once(fn):
        events.append(("time", None))
        return fn()

    rows = bench_varlen.measure_rows(
        plan, dict(head_dim=64, heads=32, mask="full"), pairs=1000, fixed_pairs=500, warmup=1,
        repeats=6, rounds=3, warmup_ms=0.0, time_once=time_once,
        breakdown=lambda fn: {"main": fn() * 1000})
    # Every setup runs before the first timed call.
    assert events[:len(plan)] == [("setup", label) for label, _ in plan]
    assert {kind for kind, _ in events[len(plan):]} == {"time"}
    by = {r["label"]: r for r in rows}
    auto = by["dashgen varlen det (auto: hybrid)"]
    assert auto["ms"] == 2.0 and auto["times"] == [[2.0, 2.0]] * 3
    assert auto["tflops"] == pytest.approx(10 * 64 * 32 * 1000 / 2.0 / 1e9)
    assert auto["kernels_us"] == {"main": 2000.0}
    # The fixed-length control is credited its own work; a peer gets no kernel breakdown.
    assert by["dashgen fixed-length det (1024 x 16)"]["tflops"] == pytest.approx(
        10 * 64 * 32 * 500 / 1.0 / 1e9)
    assert "kernels_us" not in by["flex document mask"]
    assert by["torch.nn.attention.varlen"]["error"] == "RuntimeError: no kernel here"
    assert by["sdpa padded batch (mask)"]["error"] == "ValueError: bad call"
    assert by["sdpa padded batch (mask)"]["ms"] is None
    assert all(r["head_dim"] == 64 and r["mask"] == "full" for r in rows)
