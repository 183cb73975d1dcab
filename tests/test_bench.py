"""The benchmark (`dashgen bench`, or python -m dashgen.tools.bench) without a GPU: which rows a
configuration plans (every schedule in both modes, the "auto" row, the forwards, the peers), the
table it renders from results, and a clean refusal where no GPU is visible."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bench():
    from dashgen.tools import bench as module
    return module


@pytest.mark.parametrize("mask,dash", [("full", "shift"), ("causal", "symmetric_shift")])
def test_rows_cover_schedules_modes_auto_forwards_and_peers(bench, mask, dash):
    cfg = bench.Config(4096, 128, mask, 16384, 2048)
    rows = [row for row, _ in bench.rows_for(cfg, None, list(bench.PEERS), 132)]
    labels = [r.label for r in rows]
    assert f"dashgen_det {dash}" in labels and f"dashgen_nondet {dash}" in labels
    assert "dashgen_det fa3" in labels and "dashgen_nondet fa3" in labels
    auto = rows[labels.index("dashgen_det auto")]
    # What the op's rule resolves "auto" to, recorded with the row: 4 x 16 heads x 32 KV tiles
    # (pairs under the causal mask) are whole multiples of 128, so 128 of the 132 SMs.
    assert auto.impl == "dashgen_auto" and auto.deterministic
    assert (auto.picked, auto.num_workers) == (dash, 128)
    # Timed next to its pick's row (rounds alternate, so each follows the other half the time).
    assert labels.index("dashgen_det auto") == labels.index(f"dashgen_det {dash}") + 1
    assert [r.label for r in rows if r.direction == "forward"] == [
        "dashgen forward", "sdpa_flash forward", "sdpa_cudnn forward"]
    assert {"sdpa_cudnn (nondet)", "sdpa_flash_det (FA2)", "flex (det)"} <= set(labels)
    worker_counts = {r.schedule: r.num_workers for r in rows if r.impl == "dashgen"}
    # The DASH order's rows run on auto's worker count (the same plan as the auto row).
    assert worker_counts[dash] == 128 and worker_counts["fa3"] is None
    assert len(labels) == len(set(labels))
    assert all(r.batch == 4 and r.heads == 16 for r in rows)


def test_schedules_auto_times_the_auto_row_alone(bench):
    """`--schedules auto`: no named schedule's rows, the auto row (and the forward) only."""
    cfg = bench.Config(4096, 128, "causal", 16384, 2048)
    labels = [row.label for row, _ in bench.rows_for(cfg, ["auto"], [], 132)]
    assert labels == ["dashgen_det auto", "dashgen forward"]
    assert [row.label for row, _ in bench.rows_for(cfg, ["fa3", "auto"], [], 132)][:2] == [
        "dashgen_det fa3", "dashgen_det auto"]


def test_a_window_configuration_runs_window_kernels_beside_flex(bench):
    """--masks window:LEFT,RIGHT: dashgen's window rows (the schedules that serve a band,
    auto = spt_listed) with window_size, flex as the one peer that takes a window, and
    TFLOP/s counted over the pairs the window keeps."""
    cfg = bench.Config(4096, 128, "window:1023,0", 16384, 2048)
    assert cfg.window == (1023, 0) and not cfg.causal
    rows = [row for row, _ in bench.rows_for(cfg, None, list(bench.PEERS), 132)]
    labels = [r.label for r in rows]
    assert "dashgen_det spt_listed" in labels and "dashgen_det shift" not in labels
    auto = rows[labels.index("dashgen_det auto")]
    assert auto.picked == "spt_listed"
    assert "flex (det)" in labels and not any(label.startswith("sdpa") for label in labels)
    pairs = sum(min(i, 1023) + 1 for i in range(4096))
    assert cfg.flops(False) == 4 * cfg.batch * cfg.heads * pairs * 128
    assert bench.window_pairs(5, 1, 1) == 13 and bench.window_pairs(4, None, 0) == 10
    for n, left, right in ((1, 0, 0), (7, 0, None), (9, 3, 2), (9, 20, 1), (16, None, None)):
        lo, hi = (n if x is None else x for x in (left, right))
        assert bench.window_pairs(n, left, right) == sum(
            min(n - 1, i + hi) - max(0, i - lo) + 1 for i in range(n)), (n, left, right)


def test_markdown_table_and_memory_floor(bench):
    cfg = bench.Config(1024, 64, "causal", 16384, 2048)
    rows = [row for row, _ in bench.rows_for(cfg, ["symmetric_shift"], ["flex"], 132)]
    # Auto's pick not among the schedules asked for: the auto row after the deterministic rows.
    assert [r.label for r, _ in bench.rows_for(cfg, ["fa3"], [], 132)][:3] == [
        "dashgen_det fa3", "dashgen_det auto", "dashgen_nondet fa3"]
    for i, row in enumerate(rows):
        row.ms, row.tflops = 1.0 + i, 100.0 + i
        row.extra_bytes = cfg.floor_bytes() if row.direction == "backward" else None
    meta = dict(gpu="NVIDIA H200", date="2026-11-30", torch="2.11", torch_cuda="13.0",
                nvrtc="13.0", commit="abc1234", tokens=16384, hidden=2048, repeats=10, warmup=3)
    text = bench.render_markdown(meta, [asdict(r) for r in rows])
    assert "## head_dim 64, causal" in text and "commit abc1234" in text
    assert "| dashgen_det symmetric_shift | 100.0 |" in text
    assert "| dashgen_det auto |" in text and "| sdpa_flash forward |" not in text
    floor_mib = cfg.floor_bytes() / 2**20
    assert f"| floor b*h*s*(4d+8) | {floor_mib:.1f} |" in text
    assert "| FA3_det (anchor) | 245.4 |" in text


@pytest.mark.parametrize("command", [[sys.executable, "-m", "dashgen.cli", "bench"],
                                     [sys.executable, "-m", "dashgen.tools.bench"]])
def test_bench_refuses_cleanly_without_a_gpu(command, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the benchmark would run")
    proc = subprocess.run(command + ["--hdims", "64", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode in (1, 2) and "needs a CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("rounds", ["0", "11"])
def test_bench_refuses_rounds_outside_the_repeats(rounds, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "bench", "--rounds", rounds,
                           "--repeats", "10", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and f"--rounds: {rounds} must be between 1 and --repeats (10)" \
        in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_configuration_is_timed_in_the_rounds_asked_for(bench):
    """measure_configuration passes --rounds on: with 5 rounds of 10 repeats each row is timed
    twice per round, after its own warm-up each round."""
    cfg = bench.Config(1024, 64, "full", 16384, 2048)
    row = bench.Row("r", "dashgen", "fa3", True, "forward", seqlen=1024, head_dim=64,
                    mask="full", batch=16, heads=32, floor_bytes=0)
    calls, timed = [], []
    plan = [(row, lambda inputs: (lambda: calls.append(1)))]
    rows = bench.measure_configuration(plan, cfg, None, 1, 10, rounds=5, warmup_ms=0,
                                       time_once=lambda f: f() or timed.append(1) or 2.0)
    assert len(timed) == 10 and len(calls) == 5 * (1 + 2)
    assert rows[0].times == [[2.0, 2.0]] * 5  # each round's timed calls, kept for bench.json


def test_each_row_runs_warmup_ms_of_its_own_time_before_its_timed_calls(bench):
    """After its warm-up calls a row keeps running, untimed for the median, until its calls add
    up to warmup_ms, every round: the clocks settle after the previous row."""
    fake_ms = {"a": [3.0] * 3 + [50.0, 40.0] + [3.0] * 3 + [60.0, 70.0],
               "b": [1.0] * 9 + [5.0, 6.0] + [1.0] * 9 + [7.0, 8.0]}
    order = []

    def time_once(f):
        f()
        return fake_ms[order[-1]].pop(0)

    fns = {name: (lambda n=name: order.append(n)) for name in "ab"}
    blocks = {}
    medians, _ = bench.rounds_ms(fns, warmup=1, repeats=4, rounds=2, time_once=time_once,
                                 warmup_ms=9.0, blocks=blocks)
    # Round 1: a's one warm-up call, three 3 ms calls to reach 9 ms, then two for the median;
    # b's warm-up, nine 1 ms calls, then two. Round 2 (in reverse) likewise.
    assert order[:6] == ["a"] * 6 and order[6:18] == ["b"] * 12
    assert order[18:30] == ["b"] * 12 and order[30:] == ["a"] * 6
    assert medians == {"a": 55.0, "b": 6.5}
    assert blocks == {"a": [[50.0, 40.0], [60.0, 70.0]], "b": [[5.0, 6.0], [7.0, 8.0]]}


def test_bench_help_lists_the_protocol_options():
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "bench", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dashgen bench")
    for option in ("--seqlens", "--hdims", "--masks", "--schedules", "--peers", "--repeats",
                   "--warmup", "--rounds", "--out", "--commit"):
        assert option in proc.stdout


def test_rows_of_a_configuration_are_timed_in_rounds_of_back_to_back_calls(bench):
    """rounds_ms gives each row its warm-ups and then its timed calls back to back, row after
    row, in each round (the second round in reverse); a row that raises gets no more calls and
    is reported, the others keep the median of all their timed calls."""
    order = []

    def fn(name, fail_at=None):
        def call():
            order.append(name)
            if fail_at is not None and order.count(name) == fail_at:
                raise RuntimeError(f"{name} broke")
        return call

    fake_ms = {"a": iter([3.0, 1.0, 2.0, 8.0]), "b": iter([5.0, 4.0, 6.0, 7.0])}

    def time_once(f):
        f()
        name = order[-1]
        return next(fake_ms[name]) if name in fake_ms else 9.0

    fns = {"a": fn("a"), "b": fn("b"), "c": fn("c", fail_at=4)}
    medians, errors = bench.rounds_ms(fns, warmup=1, repeats=3, rounds=2, time_once=time_once)
    # Round 1: one warm-up and ceil(3 / 2) = 2 timed calls per row, rows in turn.
    assert order[:9] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    # Round 2, rows in reverse: c's warm-up is its fourth call and raises; b and a finish.
    assert order[9:] == ["c"] + ["b"] * 3 + ["a"] * 3
    assert medians == {"a": 2.5, "b": 5.5}
    assert list(errors) == ["c"] and "c broke" in str(errors["c"])


def test_a_configuration_reports_failed_setups_and_timings_per_row(bench):
    cfg = bench.Config(1024, 64, "full", 16384, 2048)
    rows = [bench.Row(f"r{i}", "dashgen", "fa3", True, direction, seqlen=1024, head_dim=64,
                      mask="full", batch=16, heads=32, floor_bytes=0)
            for i, direction in enumerate(("forward", "backward", "backward"))]

    def broken_setup(inputs):
        raise RuntimeError("No available kernel. Aborting execution.")

    plan = [(rows[0], lambda inputs: (lambda: None)), (rows[1], broken_setup),
            (rows[2], lambda inputs: (lambda: None))]
    done = bench.measure_configuration(plan, cfg, None, 1, 3, time_once=lambda f: f() or 2.0,
                                       extra_bytes=lambda fn: 123)
    assert [r.ms for r in done] == [2.0, None, 2.0]
    assert done[0].tflops == pytest.approx(cfg.flops(False) / 2e-3 / 1e12)
    assert done[2].tflops == pytest.approx(cfg.flops(True) / 2e-3 / 1e12)
    assert done[1].error.startswith("n/a: RuntimeError: No available kernel")
    # Extra memory is taken for the backward rows that ran, not for the forward or failed ones.
    assert [r.extra_bytes for r in done] == [None, None, 123]


def test_the_recorded_commit_is_the_option_then_the_variable_then_git(monkeypatch):
    from dashgen.tools.timing import commit_id
    monkeypatch.setenv("DASHGEN_COMMIT", "from-env")
    assert commit_id("abc1234") == "abc1234"
    # A copied tree's .git can be stale: the variable its copier set wins over it.
    assert commit_id(None) == "from-env"
    monkeypatch.delenv("DASHGEN_COMMIT")
    assert commit_id(None) != "from-env"


@pytest.mark.parametrize("mask, det_pick, nondet_pick", [("causal", "spt_listed", "spt"),
                                                         ("full", "fa3", "fa3")])
def test_long_rows_are_auto_in_both_modes_on_one_sequence(bench, mask, det_pick, nondet_pick):
    """Every run carries one sequence of 128k and of 1M tokens per head_dim and mask: the
    deterministic and the unordered backward as schedule="auto" picks them."""
    assert bench.LONG_SEQLENS == [131072, 1048576]
    cfg = bench.Config(1048576, 128, mask, 16384, 2048)
    rows = [row for row, _ in bench.long_rows_for(cfg, 132)]
    assert [(r.label, r.deterministic, r.picked) for r in rows] == [
        ("dashgen_det auto", True, det_pick), ("dashgen_nondet auto", False, nondet_pick)]
    assert all(r.batch == 1 and r.heads == 16 and r.seqlen == 1048576 and r.impl == "dashgen_auto"
               for r in rows)


def test_the_long_rows_are_on_by_default_and_can_be_left_out(bench):
    args = bench.build_parser().parse_args([])
    assert args.long_seqlens == [131072, 1048576] and args.long_repeats == 3
    assert bench.build_parser().parse_args(["--long-seqlens", "none"]).long_seqlens == []
    assert bench.build_parser().parse_args(["--long-seqlens", "262144"]).long_seqlens == [262144]



def test_a_run_sweeps_the_core_rows_then_the_long_ones(bench, monkeypatch, tmp_path):
    """run() with the GPU faked: the 1k-16k configurations under the protocol's options, then
    the long ones with one warm call, one round and --long-repeats timed calls."""
    import torch
    timed = []

    def measure(plan, cfg, inputs, warmup, repeats, rounds, warmup_ms):
        timed.append((cfg.seqlen, len(plan), warmup, repeats, rounds, warmup_ms))
        for row, _ in plan:
            row.ms, row.tflops = 1.0, 1.0
        return [row for row, _ in plan]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "environment", lambda args: dict(sm_count=132, gpu="fake"))
    monkeypatch.setattr(bench, "make_inputs", lambda cfg: None)
    monkeypatch.setattr(bench, "measure_configuration", measure)
    monkeypatch.setattr(bench, "render_markdown", lambda meta, data: "table")
    monkeypatch.setattr(bench, "plot", lambda data, path: None)
    args = bench.build_parser().parse_args(
        ["--seqlens", "4096", "--hdims", "128", "--masks", "causal", "--peers", "none",
         "--long-seqlens", "131072,1048576", "--out", str(tmp_path)])
    assert bench.run(args) == 0
    assert [t[0] for t in timed] == [4096, 131072, 1048576]
    assert timed[0][2:] == (3, bench.REPEATS, bench.ROUNDS, bench.WARMUP_MS)
    assert timed[1][1:] == (2, 1, 3, 1, 0.0) and timed[2][1:] == (2, 1, 3, 1, 0.0)
    import json
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["label"] for r in rows if r["seqlen"] == 1048576] == [
        "dashgen_det auto", "dashgen_nondet auto"]
