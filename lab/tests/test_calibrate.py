"""lab/calibrate.py: the kernel model's costs fitted to benchmark rows the model itself made,
the held-out predictions and rankings, and the command line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import calibrate  # lab/ is on the path (the root conftest.py)
from calibrate import Measurement, _fit_scale, fit, load_measurements, predict_ms, rankings
from dashgen.tools.kernel_model import KernelCost

CALIBRATE = str(Path(calibrate.__file__))


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
    proc = subprocess.run([sys.executable, CALIBRATE, str(bench),
                           "--fit-seqlens", "256", "--out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(held out)" in proc.stdout and "| model's pick |" in proc.stdout
    assert (tmp_path / "r.md").read_text().startswith("Fitted on 8 measurements")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run([sys.executable, CALIBRATE, str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a `dashgen bench` result" in proc.stderr
    proc = subprocess.run([sys.executable, CALIBRATE, str(bench),
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
    proc = subprocess.run([sys.executable, CALIBRATE, str(bench),
                           "--head-dims", "128"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no dashgen backward rows with head_dim in [128]" in proc.stderr
