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
from dashgen.codegen import emit as emit_module
from dashgen.codegen.cubins import CACHE_ENV
from dashgen.cli import main
from dashgen.codegen.compile import WGMMA_ARRIVE_INJECTED
from dashgen.codegen.emit import (check_kernel_problem, default_mask, golden_files, kernel_configs,
                          masks_served, problem_tag, tasks_json)
from dashgen.codegen.variants import BwdConfig, FwdConfig, Sm90BwdConfig, Sm90FwdConfig, backward_blocks
from dashgen.schedule.lower import lower
from dashgen.codegen.render import KernelSource

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, CACHE_ENV: str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dashgen.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_emit_symmetric_shift_end_to_end(tmp_path):
    """bf16 head_dim 128 without GQA: the Hopper backward runs, so emit writes and compiles it
    and builds the schedule with its 64x128 tiles."""
    out = tmp_path / "out"
    proc = run_cli("emit", "--schedule", "symmetric_shift", "--hdim", "128", "--out", str(out),
                   cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "blocks 64x128" in proc.stdout.splitlines()[0]
    names = sorted(p.name for p in out.iterdir())
    sources = [n for n in names if n.endswith(".cu")]
    cubins = [n for n in names if n.endswith(".cubin")]
    assert len(sources) == 2 and [n[:-3] for n in sources] == [n[:-6] for n in cubins]
    fwd = [n[:-3] for n in sources if n.startswith("dashgen_attn_fwd_")]
    bwd = [n[:-3] for n in sources if n.startswith("dashgen_attn_bwd_sm90_")]
    assert len(fwd) == 1 and "causal1" in fwd[0]
    assert len(bwd) == 1 and "deterministic1" in bwd[0] and "blockm64_blockn128" in bwd[0]
    assert bwd[0] == Sm90BwdConfig("bf16", 128, True).kernel_name
    for name in cubins:
        assert (out / name).read_bytes()[:4] == b"\x7fELF"
    table = out / "symmetric_shift_b1_h1_s4096_d128_causal_w132.tasks.json"
    assert table.name in names
    data = json.loads(table.read_text())
    assert data["schedule"] == "symmetric_shift" and data["num_workers"] == 132
    assert data["problem"]["mask"] == "causal"
    assert (data["problem"]["block_m"], data["problem"]["block_n"]) == (64, 128)
    assert data["worker_offsets"][-1] == len(data["tasks"]) == data["num_tasks"]

    kernel_lines = [line for line in proc.stdout.splitlines() if line.startswith("dashgen_attn_")]
    assert len(kernel_lines) == 4  # forward; backward, its preprocess and convert
    by_name = {line.split()[0]: line for line in kernel_lines}
    assert set(by_name) == {fwd[0], bwd[0], bwd[0] + "_preprocess", bwd[0] + "_convert"}
    for name, line in by_name.items():
        assert " registers" in line and "smem " in line
        assert "compiled in " in line  # the cache folder started empty
        spill = int(line.split(" spill bytes")[0].split()[-1])
        assert spill == 0, line
        if name == bwd[0]:
            # Known: ptxas reports the warpgroup.arrive it injects before the register-operand
            # wgmmas (C7519): printed, not a failure.
            if "ptxas:" in line:
                notes = line.split("ptxas: ", 1)[1].split("; ")
                assert all(WGMMA_ARRIVE_INJECTED in note for note in notes), line
        else:  # the forward and the backward's helper kernels
            assert "ptxas:" not in line
    assert "Traceback" not in proc.stderr


def test_emit_kernel_mma_writes_the_mma_kernels(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    out = tmp_path / "out"
    main(["emit", "--schedule", "symmetric_shift", "--hdim", "64", "--seqlen", "512",
          "--workers", "6", "--dtype", "fp16", "--kernel", "mma", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert "blocks 64x64" in stdout.splitlines()[0] and "mma kernels" in stdout.splitlines()[0]
    bwd = BwdConfig("fp16", 64, True).kernel_name
    assert (out / f"{FwdConfig('fp16', 64, True).kernel_name}.cu").is_file()
    assert (out / f"{bwd}.cu").is_file() and (out / f"{bwd}.cubin").is_file()
    assert not list(out.glob("dashgen_attn_*_sm90_*"))
    data = json.loads((out / "symmetric_shift_b1_h1_s512_d64_causal_w6.tasks.json").read_text())
    assert (data["problem"]["block_m"], data["problem"]["block_n"]) == (64, 64)
    kernel_lines = [line for line in stdout.splitlines() if line.startswith("dashgen_attn_")]
    assert len(kernel_lines) == 4 and sum(line.startswith(bwd) for line in kernel_lines) == 3
    for line in kernel_lines:  # the mma.sync backward and the forward do not spill
        assert " 0 spill bytes" in line and "ptxas:" not in line


@pytest.mark.parametrize("dtype,head_dim,gqa,hopper,kind,blocks", [
    ("bf16", 128, False, True, Sm90BwdConfig, (64, 128)),
    ("bf16", 128, True, True, Sm90BwdConfig, (64, 128)),
    ("fp16", 128, False, True, Sm90BwdConfig, (64, 128)),
    ("bf16", 64, False, True, Sm90BwdConfig, (128, 128)),
    ("fp16", 64, True, True, Sm90BwdConfig, (128, 128)),
    ("fp16", 128, False, False, BwdConfig, (64, 64)),
    ("bf16", 64, True, False, BwdConfig, (64, 64)),
])
def test_kernel_configs_follow_the_serving_backward(dtype, head_dim, gqa, hopper, kind, blocks):
    assert backward_blocks(dtype, head_dim, gqa, hopper) == blocks
    problem = Problem(heads_q=4, heads_kv=1 if gqa else 4, seqlen_q=512, head_dim=head_dim,
                      mask="causal", block_m=blocks[0], block_n=blocks[1])
    fwd, bwd = kernel_configs(problem, dtype, deterministic=False, hopper=hopper)
    assert type(bwd) is kind and (bwd.block_m, bwd.block_n) == blocks
    assert bwd.dtype == dtype and bwd.causal and not bwd.deterministic
    # The Hopper forward serves where the Hopper backward does, with 128 query rows a CTA.
    assert type(fwd) is (Sm90FwdConfig if kind is Sm90BwdConfig else FwdConfig)
    assert (fwd.block_m, fwd.block_n) == ((128, 128) if kind is Sm90BwdConfig else (64, 64))
    assert bwd.gqa == gqa
    other = (blocks[0], 128) if blocks[1] == 64 else (blocks[0], 64)  # block_m right, block_n wrong
    with pytest.raises(ValueError, match=rf"^block_n must be {blocks[1]}, the serving kernel's "
                                         rf"tile, got {other[1]}: "):
        check_kernel_problem(Problem(heads_q=4, heads_kv=1 if gqa else 4, seqlen_q=512,
                                     head_dim=head_dim, block_m=other[0], block_n=other[1]),
                             dtype, hopper)


@pytest.mark.parametrize("hopper", [True, False])
def test_emit_and_runtime_pick_the_same_tiles(hopper, monkeypatch):
    runtime = pytest.importorskip("dashgen.runtime.backward")
    monkeypatch.setattr(runtime, "SM90_DEFAULT", hopper)
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for gqa in (False, True):
                cfg = runtime.KernelConfig.for_problem(head_dim, dtype, gqa)
                want = backward_blocks(dtype, head_dim, gqa, hopper=hopper)
                assert (cfg.block_m, cfg.block_n) == want
    assert runtime.KernelConfig.for_problem(128, "bf16", False).block_n == (128 if hopper else 64)


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
    assert kernel_lines and all("  cached" in line for line in kernel_lines)
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert "fa3_b1_h4kv1_s256_d64_full_w4.tasks.json" in written
    assert any("dtypefp16" in n and "deterministic0" in n and "gqa1" in n for n in written)


@pytest.mark.parametrize("args,message", [
    (["--schedule", "shift", "--mask", "causal"], "schedule 'shift' cannot serve this problem: "
                                                  "shift needs a full mask"),
    (["--schedule", "symmetric_shift", "--mask", "full"], "symmetric_shift needs a causal mask"),
    (["--schedule", "fa3", "--block-m", "128"],
     "--block-m must be 64, the serving kernel's tile, got 128: the Hopper backward "
     "(dashgen_attn_bwd_sm90) serves bf16, head_dim 128 with 64x128 tiles"),
    (["--schedule", "fa3", "--block-n", "32"], "--block-n must be 128, the serving kernel's tile, "
                                               "got 32"),
    (["--schedule", "fa3", "--block-n", "64"], "--block-n must be 128, the serving kernel's tile, "
                                               "got 64"),
    (["--schedule", "fa3", "--hdim", "64", "--block-n", "64"],
     "--block-n must be 128, the serving kernel's tile, got 64: the Hopper backward "
     "(dashgen_attn_bwd_sm90) serves bf16, head_dim 64 with 128x128 tiles"),
    (["--schedule", "fa3", "--dtype", "fp16", "--kernel", "mma", "--block-n", "128"],
     "--block-n must be 64, the serving kernel's tile, got 128: the mma.sync backward "
     "(dashgen_attn_bwd) serves fp16, head_dim 128 with 64x64 tiles"),
    (["--schedule", "fa3", "--heads", "4", "--gqa", "--block-n", "64"],
     "--block-n must be 128, the serving kernel's tile, got 64: the Hopper backward "
     "(dashgen_attn_bwd_sm90) serves bf16, head_dim 128, GQA with 64x128 tiles"),
    (["--schedule", "fa3", "--heads", "4", "--gqa", "--dtype", "fp16", "--kernel", "mma",
      "--block-n", "128"],
     "--block-n must be 64, the serving kernel's tile, got 128: the mma.sync backward "
     "(dashgen_attn_bwd) serves fp16, head_dim 128, GQA with 64x64 tiles"),
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


@pytest.mark.parametrize("kernel,kind,prefix", [
    ("hopper", Sm90BwdConfig, "dashgen_attn_bwd_sm90_"),
    ("mma", BwdConfig, "dashgen_attn_bwd_dtype"),
])
def test_emit_compile_error_prints_log_and_exits_1(kernel, kind, prefix, tmp_path, monkeypatch,
                                                   capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    render_config = emit_module.render_config

    def broken_bwd(cfg):
        if type(cfg) is not kind:
            return render_config(cfg)
        return KernelSource(cfg.kernel_name, "attn_bwd.cu.j2",
                            'extern "C" __global__ void k() { undeclared_thing = 1; }\n')

    monkeypatch.setattr(emit_module, "render_config", broken_bwd)
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--schedule", "spt", "--mask", "causal", "--seqlen", "256", "--hdim", "64",
              "--kernel", kernel, "--out", str(tmp_path / "out")])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"NVRTC failed to compile {prefix}" in err and "undeclared_thing" in err
    assert "Traceback" not in err
    assert list((tmp_path / "out").glob(f"{prefix}*.cu"))  # left on disk to read


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
    proc = subprocess.run([sys.executable, "-m", "dashgen.codegen.emit", "--golden", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {len(golden_files())} golden files to {tmp_path}")
    assert "removed stale stale_hdim64_full.tasks.json" in proc.stdout
    assert (tmp_path / "README.md").is_file()
    assert not (tmp_path / "stale_hdim64_full.tasks.json").exists()
