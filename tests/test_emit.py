"""`dashgen emit` on the CPU: the kernels dashgen.runtime.select picks for the problem (sources and
cubins) and the task table written, ptxas's figures printed, every refusal readable (exit 2)
and, for a compile failure, the NVRTC log shown (exit 1)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashgen import Problem, build_schedule
from dashgen.caches import CACHE_ENV
from dashgen.cli import main
from dashgen.tools import emit as emit_module
from dashgen.codegen.compile import SETMAXNREG_IGNORED, compile_kernel
from dashgen.tools.emit import (default_mask, emit, masks_served, problem_tag, report_lines,
                                tasks_json)
from dashgen.tools.probes import render_probe
from dashgen.codegen.render import KernelSource
from dashgen.codegen.variants import BackwardVariant
from dashgen.runtime.select import Overrides, problem_for, select
from dashgen.schedule.builders import BUILDERS, workers_used
from dashgen.schedule.lower import lower

REPO = Path(__file__).resolve().parent.parent
# name, registers, spill bytes, static + dynamic shared memory bytes, compile time or "cached"
REPORT = re.compile(r"^(dashgen_\w+) +(\d+) regs spill (\d+)B smem +(\d+)\+(\d+)B "
                    r"(cached|\d+\.\d s)$")


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, CACHE_ENV: str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dashgen.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def report_rows(stdout: str) -> dict[str, tuple]:
    return {m.group(1): m.groups()[1:] for m in map(REPORT.match, stdout.splitlines()) if m}


def test_emit_symmetric_shift_end_to_end(tmp_path, monkeypatch, capsys):
    """bf16 head_dim 128, causal by the schedule's default: the kernels select picks, built in
    the backward's 64x128 tiles on the worker count the kernels would run."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # an empty cache: real compiles
    out = tmp_path / "out"
    main(["emit", "--schedule", "symmetric_shift", "--hdim", "128", "--out", str(out)])
    stdout = capsys.readouterr().out
    problem = problem_for(1, 1, 1, 4096, 4096, 128, True)
    workers = workers_used("symmetric_shift", problem, 132)
    sel = select(problem, "bf16", schedule="symmetric_shift", num_workers=workers)
    assert stdout.startswith(f"emit symmetric_shift: {problem.describe()}")
    assert "blocks 64x128" in problem.describe()
    assert f"{workers} workers; bf16, deterministic\n" in stdout
    fwd, bwd = sel.forward.kernel_name, sel.backward.kernel_name
    # A named schedule's policy is in its backward: no task table is written.
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{fwd}.cu", f"{fwd}.cubin", f"{bwd}.cu", f"{bwd}.cubin"])
    for name in (fwd, bwd):
        assert (out / f"{name}.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "struct SymmetricShift : RunsTogether {" in (out / f"{bwd}.cu").read_text()

    rows = report_rows(stdout)
    assert set(rows) == {fwd, bwd, f"{bwd}_preprocess", f"{bwd}_convert"}
    for name, (regs, spills, static, dynamic, when) in rows.items():
        # the scheduler lane's walk may keep a few bytes (tests/test_kernels_compile.py bounds it)
        assert (spills == "0" or name == bwd) and when != "cached"  # the cache started empty
        assert (int(dynamic) > 0) == (name in (fwd, bwd))  # the main kernels' own constant
    assert int(rows[bwd][0]) == int(rows[fwd][0]) == 168
    assert "ptxas:" not in stdout  # ds_stmatrix at head_dim 128: no injected arrive


def test_ptxas_diagnostics_are_printed_below_their_function(tmp_path):
    """Each ptxas diagnostic on a line of its own under its function. No dashgen kernel draws
    one today, so the emitted backward's main function is given the diagnostics ptxas really
    prints for the setmaxnreg probe compiled without its register cap."""
    source = render_probe("setmaxnreg")
    uncapped = dataclasses.replace(
        source, text=source.text.replace("__launch_bounds__(kThreads, 1)", ""))
    diagnostics = compile_kernel(uncapped).resources[source.name].warnings
    assert diagnostics and all(SETMAXNREG_IGNORED in d for d in diagnostics)
    problem = problem_for(1, 2, 2, 512, 512, 64, False)
    kernels = emit(build_schedule("shift", problem, 4), tmp_path).kernels
    backward = next(k for k in kernels if isinstance(k.variant, BackwardVariant))
    name = backward.source.name
    assert backward.cubin.resources[name].warnings == ()
    resources = dict(backward.cubin.resources)
    resources[name] = dataclasses.replace(resources[name], warnings=diagnostics)
    lines = report_lines(tuple(
        dataclasses.replace(k, cubin=dataclasses.replace(k.cubin, resources=resources))
        if k is backward else k for k in kernels))
    main_line = next(i for i, line in enumerate(lines) if line.startswith(name + " "))
    assert lines[main_line + 1:main_line + 1 + len(diagnostics)] == [
        f"  ptxas: {d}" for d in diagnostics]
    assert sum(line.startswith("  ptxas: ") for line in lines) == len(diagnostics)


@pytest.mark.parametrize("dtype, head_dim, heads_kv, deterministic", [
    ("bf16", 128, 4, True), ("bf16", 128, 1, True), ("fp16", 128, 4, False),
    ("bf16", 64, 4, True), ("fp16", 64, 2, False)])
def test_emit_writes_the_kernels_select_picks(tmp_path, dtype, head_dim, heads_kv,
                                              deterministic):
    problem = problem_for(1, 4, heads_kv, 512, 512, head_dim, True)
    schedule = build_schedule("spt", problem, 5)
    emission = emit(schedule, tmp_path, dtype=dtype, deterministic=deterministic, compile=False)
    sel = select(problem, dtype, deterministic=deterministic, schedule="spt", num_workers=5)
    assert emission.selection == sel
    assert [k.variant for k in emission.kernels] == [sel.forward, sel.backward]
    assert sel.backward.gqa == (heads_kv < 4) and sel.backward.dtype == dtype
    assert sel.backward.deterministic == deterministic
    for kernel in emission.kernels:
        assert kernel.cubin is None and kernel.dynamic_smem_bytes is None
        assert kernel.source_path.read_text() == kernel.source.text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{sel.forward.kernel_name}.cu", f"{sel.backward.kernel_name}.cu"])
    assert emission.plan is None and emission.tasks_path is None  # the policy is in the source


def test_emit_of_a_schedule_file_writes_its_table_and_the_table_backward(tmp_path):
    problem = problem_for(1, 4, 4, 512, 512, 128, True)
    edited = build_schedule("spt", problem, 5)
    edited.name = "edited"  # any schedule that is not its name's policy travels as a table
    emission = emit(edited, tmp_path, compile=False)
    assert emission.selection.backward.schedule == "table"
    assert emission.tasks_path.name == f"edited_{problem_tag(problem, 5)}.tasks.json"
    data = json.loads(emission.tasks_path.read_text())
    assert [w for row in data["tasks"] for w in row] == list(emission.plan.tasks)


def test_emit_refuses_a_schedule_in_other_tiles(tmp_path):
    problem = Problem(heads_q=2, seqlen_q=512, head_dim=128, block_m=128, block_n=128)
    with pytest.raises(ValueError, match=r"^block_m must be 64, the backward's tile"):
        emit(build_schedule("fa3", problem, 4), tmp_path / "out", compile=False)
    assert not (tmp_path / "out").exists()


def test_emit_and_the_runtime_select_the_same(tmp_path):
    """For the same shapes and schedule, `dashgen emit` writes the kernels the runtime loads
    (the runtime reads its plans from the disk cache, emit lowers its schedule: one table)."""
    runtime = pytest.importorskip("dashgen.runtime.select")  # the selection BackwardCall takes
    for head_dim, causal, heads_kv in ((64, False, 2), (128, True, 4)):
        q_shape, k_shape = (2, 700, 4, head_dim), (2, 700, heads_kv, head_dim)
        problem = problem_for(2, 4, heads_kv, 700, 700, head_dim, causal)
        name = "symmetric_shift" if causal else "shift"
        for deterministic in (True, False):
            at_runtime = runtime.selection(q_shape, k_shape, "bf16", causal, deterministic,
                                           False, name, 9, 132, Overrides())
            emitted = emit(build_schedule(name, problem, 9), tmp_path,
                           deterministic=deterministic, compile=False).selection
            assert at_runtime == emitted
            # a whole number of one sequence's units: 6 KV tiles (6 of 9), or 3 pairs (9)
            assert at_runtime.problem == problem
            assert at_runtime.num_workers == BUILDERS[name].workers_used(problem, 9) == (
                9 if causal else 6)


def test_emit_reports_cached_second_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    args = ["emit", "--schedule", "fa3", "--hdim", "64", "--seqlen", "256", "--workers", "4",
            "--dtype", "fp16", "--nondeterministic", "--heads", "4", "--gqa",
            "--out", str(tmp_path / "out")]
    main(args)
    first = capsys.readouterr().out
    main(args)
    second = capsys.readouterr().out
    assert "full mask" in first and "fp16, non-deterministic, GQA" in first
    assert "heads 4/1kv" in first
    assert all(when != "cached" for *_, when in report_rows(first).values())
    rows = report_rows(second)
    assert len(rows) == 4 and all(when == "cached" for *_, when in rows.values())
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert not any(n.endswith(".tasks.json") for n in written)  # fa3's policy is in its kernel
    assert any(n.startswith("dashgen_bwd_fp16_d64_full_fa3_nondet_gqa") and n.endswith(".cubin")
               for n in written)


@pytest.mark.parametrize("args,message", [
    (["--schedule", "shift", "--mask", "causal"], "schedule 'shift' cannot serve this problem: "
                                                  "shift needs a full mask"),
    (["--schedule", "symmetric_shift", "--mask", "full"], "symmetric_shift needs a causal mask"),
    (["--schedule", "fa3", "--block-m", "128"],
     "--block-m must be 64, the backward's tile at head_dim 128 (64x128), got 128"),
    (["--schedule", "fa3", "--block-n", "32"],
     "--block-n must be 128, the backward's tile at head_dim 128 (64x128), got 32"),
    (["--schedule", "fa3", "--hdim", "64", "--block-m", "64"],
     "--block-m must be 128, the backward's tile at head_dim 64 (128x128), got 64"),
    (["--schedule", "fa3", "--hdim", "64", "--block-n", "64"],
     "--block-n must be 128, the backward's tile at head_dim 64 (128x128), got 64"),
    (["--schedule", "fa3", "--heads", "4", "--gqa", "--block-n", "64"],
     "--block-n must be 128, the backward's tile at head_dim 128 (64x128), got 64"),
    (["--schedule", "shift", "--mask", "window:64,0"], "shift needs a full mask"),
    (["--schedule", "fa3", "--hdim", "72"], "--hdim must be one of 32, 48, 64, 80, 96, 112, 128, "
                                            "192, 256 for the kernels, got 72"),
    (["--schedule", "fa3", "--gqa"], "--gqa needs fewer KV heads than query heads"),
    (["--schedule", "fa3", "--heads", "6", "--heads-kv", "4"], "heads_q (6) must be a multiple"),
    (["--hdim", "64"], "--schedule or --schedule-file is required"),
])
def test_emit_refusals_are_readable(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["emit", *args, "--seqlen", "256", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dashgen emit: error: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing is written for a refused problem


def test_emit_unsupported_problem_subprocess(tmp_path):
    proc = run_cli("emit", "--schedule", "shift", "--mask", "causal", "--hdim", "128",
                   "--out", str(tmp_path / "out"), cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "shift needs a full mask" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_emit_compile_error_prints_log_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    render_variant = emit_module.render_variant

    def broken_backward(variant):
        if not isinstance(variant, BackwardVariant):
            return render_variant(variant)
        return KernelSource(variant.kernel_name, variant.template,
                            'extern "C" __global__ void k() { undeclared_thing = 1; }\n')

    monkeypatch.setattr(emit_module, "render_variant", broken_backward)
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--schedule", "spt", "--mask", "causal", "--seqlen", "256", "--hdim", "64",
              "--out", str(tmp_path / "out")])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "NVRTC failed to compile dashgen_bwd_bf16_d64_causal_spt_det" in err
    assert "undeclared_thing" in err and "Traceback" not in err
    assert list((tmp_path / "out").glob("dashgen_bwd_*.cu"))  # left on disk to read
    assert not list((tmp_path / "out").glob("dashgen_bwd_*.cubin"))


def test_emit_help():
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "emit", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dashgen emit")
    for option in ("--schedule", "--dtype", "--out", "--nondeterministic", "--gqa", "--golden",
                   "--workers", "--heads-kv"):
        assert option in proc.stdout
    assert "--kernel" not in proc.stdout


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


def test_emit_says_when_a_non_deterministic_call_runs_the_ordered_kernel(tmp_path, capsys):
    """16 x 1k at head_dim 128 converts dQ in the main kernel, which needs the order: the
    non-deterministic request emits the ordered backward and says why; 1 x 4k does not."""
    for seqlen, batch, ordered in ((1024, 16, True), (4096, 1, False)):
        out = tmp_path / str(seqlen)
        main(["emit", "--schedule", "shift", "--hdim", "128", "--mask", "full", "--seqlen",
              str(seqlen), "--batch", str(batch), "--heads", "16", "--nondeterministic",
              "--out", str(out)])
        printed = capsys.readouterr().out
        assert ("only the ordered backward can do" in printed) == ordered
        written = {p.name for p in out.iterdir()}
        kind = "det_fconv" if ordered else "nondet"
        assert any(n.startswith(f"dashgen_bwd_bf16_d128_full_shift_{kind}") for n in written)
