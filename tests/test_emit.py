"""`dashgen emit` on the CPU: sources, task table and cubins written, ptxas figures printed, and
every refusal readable (exit 2) or, for a compile failure, the NVRTC log shown (exit 1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dashgen import Problem, build_schedule
from dashgen import emit as emit_module
from dashgen.cache import CACHE_ENV
from dashgen.cli import main
from dashgen.emit import default_mask, golden_files, masks_served, problem_tag, tasks_json
from dashgen.lower import lower
from dashgen.render import KernelSource

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, CACHE_ENV: str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dashgen.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_emit_symmetric_shift_end_to_end(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("emit", "--schedule", "symmetric_shift", "--hdim", "128", "--out", str(out),
                   cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    sources = [n for n in names if n.endswith(".cu")]
    cubins = [n for n in names if n.endswith(".cubin")]
    assert len(sources) == 2 and [n[:-3] for n in sources] == [n[:-6] for n in cubins]
    assert any(n.startswith("dashgen_attn_fwd_") and "causal1" in n for n in sources)
    assert any(n.startswith("dashgen_attn_bwd_") and "deterministic1" in n for n in sources)
    for name in cubins:
        assert (out / name).read_bytes()[:4] == b"\x7fELF"
    table = out / "symmetric_shift_b1_h1_s4096_d128_causal_w132.tasks.json"
    assert table.name in names
    data = json.loads(table.read_text())
    assert data["schedule"] == "symmetric_shift" and data["num_workers"] == 132
    assert data["problem"]["mask"] == "causal" and data["problem"]["block_m"] == 64
    assert data["worker_offsets"][-1] == len(data["tasks"]) == data["num_tasks"]

    kernel_lines = [line for line in proc.stdout.splitlines() if line.startswith("dashgen_attn_")]
    assert len(kernel_lines) == 4  # forward; backward, its preprocess and convert
    for line in kernel_lines:
        assert " 0 spill bytes" in line and " registers" in line and "smem " in line
        assert "compiled in " in line  # the cache folder started empty
        assert "ptxas:" not in line
    assert "Traceback" not in proc.stderr


def test_emit_reports_cached_second_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    args = ["emit", "--schedule", "fa3", "--hdim", "64", "--seqlen", "256", "--workers", "4",
            "--dtype", "fp16", "--nondeterministic", "--heads", "4", "--gqa",
            "--out", str(tmp_path / "out")]
    main(args)
    first = capsys.readouterr().out
    main(args)
    second = capsys.readouterr().out
    assert "full mask" in first and "non-deterministic, GQA" in first
    assert "heads 4/1kv" in first
    kernel_lines = [line for line in second.splitlines() if line.startswith("dashgen_attn_")]
    assert kernel_lines and all(line.endswith("cached") for line in kernel_lines)
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert "fa3_b1_h4kv1_s256_d64_full_w4.tasks.json" in written
    assert any("dtypefp16" in n and "deterministic0_gqa1" in n for n in written)


@pytest.mark.parametrize("args,message", [
    (["--schedule", "shift", "--mask", "causal"], "schedule 'shift' cannot serve this problem: "
                                                  "shift needs a full mask"),
    (["--schedule", "symmetric_shift", "--mask", "full"], "symmetric_shift needs a causal mask"),
    (["--schedule", "fa3", "--block-m", "128"],
     "--block-m must be 64: the kernels use 64x64 tiles"),
    (["--schedule", "fa3", "--block-n", "32"], "--block-n must be 64"),
    (["--schedule", "fa3", "--mask", "window:64,0"], "mask must be one of full, causal"),
    (["--schedule", "fa3", "--hdim", "96"], "head_dim must be one of (64, 128), got 96"),
    (["--schedule", "fa3", "--gqa"], "--gqa needs fewer KV heads than query heads"),
    (["--schedule", "fa3", "--heads", "6", "--heads-kv", "4"], "heads_q (6) must be a multiple"),
    (["--hdim", "64"], "--schedule is required"),
])
def test_emit_refusals_are_readable(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["emit", *args, "--seqlen", "256", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dashgen emit: error: ") and message in err
    assert not (tmp_path / "out").exists()  # nothing is written for a refused problem


def test_emit_unsupported_problem_subprocess(tmp_path):
    proc = run_cli("emit", "--schedule", "shift", "--mask", "causal", "--hdim", "128",
                   "--out", str(tmp_path / "out"), cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "shift needs a full mask" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_emit_compile_error_prints_log_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    def broken_bwd(cfg):
        return KernelSource(cfg.kernel_name, "attn_bwd.cu.j2",
                            'extern "C" __global__ void k() { undeclared_thing = 1; }\n')

    monkeypatch.setattr(emit_module, "render_bwd", broken_bwd)
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--schedule", "spt", "--mask", "causal", "--seqlen", "256",
              "--out", str(tmp_path / "out")])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "NVRTC failed to compile dashgen_attn_bwd_" in err and "undeclared_thing" in err
    assert "Traceback" not in err
    assert list((tmp_path / "out").glob("dashgen_attn_bwd_*.cu"))  # left on disk to read


def test_emit_help():
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "emit", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dashgen emit")
    for option in ("--schedule", "--dtype", "--out", "--nondeterministic", "--gqa", "--golden",
                   "--workers", "--heads-kv"):
        assert option in proc.stdout


def test_default_mask_is_the_one_the_schedule_serves():
    assert default_mask("symmetric_shift") == "causal"
    assert default_mask("shift") == "full"
    assert {name: masks_served(name) for name in ("fa3", "spt", "descending")} == {
        name: ("full", "causal") for name in ("fa3", "spt", "descending")}


def test_tasks_json_is_the_table():
    problem = Problem(heads_q=4, heads_kv=2, seqlen_q=320, seqlen_k=448, mask="causal",
                      block_m=64, block_n=64)
    plan = lower(build_schedule("spt", problem, 5))
    data = json.loads(tasks_json(plan))
    assert [w for row in data["tasks"] for w in row] == list(plan.tasks)
    assert data["worker_offsets"] == list(plan.worker_offsets)
    assert data["problem"] == problem.to_dict() and data["schedule"] == "spt"
    assert problem_tag(problem, 5) == "b1_h4kv2_s320x448_d128_causal_w5"


def test_python_m_dashgen_emit_golden(tmp_path):
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "stale_hdim64_full.tasks.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "dashgen.emit", "--golden", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {len(golden_files())} golden files to {tmp_path}")
    assert "removed stale stale_hdim64_full.tasks.json" in proc.stdout
    assert (tmp_path / "README.md").is_file()
    assert not (tmp_path / "stale_hdim64_full.tasks.json").exists()
