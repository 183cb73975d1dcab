"""The kernel model (writer decoupled from the MMA pipeline) and its calibration."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dashgen import Problem, build_schedule
from dashgen.tools.calibrate import Measurement, _fit_scale, fit, load_measurements, predict_ms, rankings
from dashgen.schedule.ir import Task
from dashgen.tools.kernel_model import KernelCost, kernel_makespan


def full_problem(n: int) -> Problem:
    return Problem(seqlen_q=64 * n, seqlen_k=64 * n, block_m=64, block_n=64)


def test_one_worker_runs_its_compute_back_to_back_when_the_writer_keeps_up():
    s = build_schedule("fa3", full_problem(4), 1)  # 16 tasks on one worker
    assert kernel_makespan(s, KernelCost(c=1.0, r=0.5)) == pytest.approx(16 + 0.5)


def test_a_slow_writer_bounds_the_worker_through_its_buffers():
    s = build_schedule("fa3", full_problem(4), 1)
    # The writer needs 2 per task: 16 adds after the first compute.
    assert kernel_makespan(s, KernelCost(c=1.0, r=2.0, buffers=2)) == pytest.approx(1 + 16 * 2)


def test_fa3_full_mask_waits_shift_does_not():
    p = full_problem(8)  # 8 KV tiles x 8 Q tiles, 8 workers: all want dQ 0 at once under fa3
    cost = KernelCost(c=1.0, r=0.9, buffers=1)
    fa3 = kernel_makespan(build_schedule("fa3", p, 8), cost)
    shift = kernel_makespan(build_schedule("shift", p, 8), cost)
    assert shift == pytest.approx(8 * 1.0 + 0.9)  # never waits: compute + the last add
    assert fa3 > shift + 5 * 0.9  # the serialized first dQ tile staggers the workers


def test_unordered_mode_never_waits():
    p = full_problem(8)
    s = build_schedule("fa3", p, 8)
    cost = KernelCost(c=1.0, r=0.9, signal_latency=0.3, buffers=1)
    assert kernel_makespan(s, cost, ordered=False) == pytest.approx(8 * 1.0 + 0.9)
    assert kernel_makespan(s, cost, ordered=True) > kernel_makespan(s, cost, ordered=False)


def test_signal_latency_costs_only_across_workers():
    s = build_schedule("fa3", full_problem(4), 1)
    assert kernel_makespan(s, KernelCost(1.0, 0.5, signal_latency=10.0)) == pytest.approx(16.5)


def test_overhead_adds_once():
    s = build_schedule("fa3", full_problem(2), 2)
    base = kernel_makespan(s, KernelCost(1.0, 0.2))
    assert kernel_makespan(s, KernelCost(1.0, 0.2, overhead=7.0)) == pytest.approx(base + 7.0)


def test_a_rank_cycle_deadlocks():
    p = Problem(seqlen_q=128, block_m=64, block_n=64)  # 2 KV tiles x 2 Q tiles
    s = build_schedule("fa3", p, 2)
    # Worker 0 adds m0 second and m1 first; worker 1 the opposite, in program order m0, m1.
    s.workers[0] = [Task(0, 0, 0, 0, 1), Task(0, 0, 0, 1, 0)]
    s.workers[1] = [Task(0, 0, 1, 1, 1), Task(0, 0, 1, 0, 0)]
    with pytest.raises(RuntimeError, match="deadlock"):
        kernel_makespan(s, KernelCost(buffers=1))


@pytest.mark.parametrize("field,value", [("c", -1.0), ("r", "x"), ("buffers", 0)])
def test_bad_costs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        KernelCost(**{field: value})


def test_fit_scale_recovers_an_exact_line():
    units = [10.0, 20.0, 40.0]
    c, o, err = _fit_scale(units, [3.0 * u + 5.0 for u in units])
    assert (c, o) == (pytest.approx(3.0), pytest.approx(5.0)) and err < 1e-12


SYNTHETIC = KernelCost(c=0.004, r=0.0012, signal_latency=0.0002, overhead=0.05)


def synthetic_bench(path, seqlens=(256, 512, 1024)):
    """A bench.json whose times come from the model itself with known costs."""
    rows = []
    for seqlen in seqlens:
        for mask, names in (("full", ("fa3", "shift")), ("causal", ("spt", "symmetric_shift"))):
            for name in names:
                for det in (True, False):
                    m = Measurement(2, 4, seqlen, 64, mask, name, det, 16, 0.0)
                    rows.append(dict(impl="dashgen", direction="backward", batch=2, heads=4,
                                     seqlen=seqlen, head_dim=64, mask=mask, schedule=name,
                                     deterministic=det, num_workers=16, error=None,
                                     ms=predict_ms(m, SYNTHETIC)))
    rows.append(dict(impl="flex", direction="backward", ms=1.0))  # peers are ignored
    path.write_text(json.dumps({"meta": {"sm_count": 132}, "rows": rows}))
    return path


def test_calibration_recovers_known_costs_and_rankings(tmp_path):
    ms = load_measurements([synthetic_bench(tmp_path / "bench.json")])
    assert len(ms) == 24 and all(m.num_workers == 16 for m in ms)
    result = fit([m for m in ms if m.seqlen in (256, 512)])
    assert result.rms_error < 0.02
    held_out = [m for m in ms if m.seqlen == 1024]
    for m in held_out:
        assert predict_ms(m, result.cost) == pytest.approx(m.ms, rel=0.05)
    assert all(r.regret == pytest.approx(0.0, abs=0.02) for r in rankings(ms, result.cost))


def test_calibrate_cli_reports_and_refuses_bad_files(tmp_path):
    bench = synthetic_bench(tmp_path / "bench.json", seqlens=(256, 512))
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "calibrate", str(bench),
                           "--fit-seqlens", "256", "--out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(held out)" in proc.stdout and "| model's pick |" in proc.stdout
    assert (tmp_path / "r.md").read_text().startswith("Fitted on 8 measurements")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "calibrate", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a `dashgen bench` result" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "calibrate", str(bench),
                           "--fit-seqlens", "256", "--head-dims", "64"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("Fitted on 8 measurements")
    # The report says how to predict with the fitted costs, and that command runs.
    line = next(row for row in proc.stdout.splitlines() if row.startswith("Predict with: `"))
    command = line.split("`")[1].replace(" ...", "").split()
    assert command[:3] == ["dashgen", "plan", "--kernel-model"] and "--hdim" in command
    plan = subprocess.run([sys.executable, "-m", "dashgen.cli"] + command[1:] +
                          ["--seqlen", "512", "--heads", "2", "--mask", "causal",
                           "--workers", "16", "--schedule", "symmetric_shift"],
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert "kernel model" in plan.stdout and "symmetric_shift" in plan.stdout
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "calibrate", str(bench),
                           "--head-dims", "128"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no dashgen backward rows with head_dim in [128]" in proc.stderr
