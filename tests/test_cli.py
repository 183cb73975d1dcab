"""The dashgen command line: help and --version, the defaults that follow the kernels (tiles
and worker counts), summaries at 1M tokens and the full view's size limit, schedule files and
task tables read back and verified, every error one line on stderr with exit status 2, plan on
a real problem and a real emit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from dashgen import (Problem, ScheduleFormatError, VerificationError, __version__,
                     build_schedule, load_schedule)
from dashgen.caches import CACHE_ENV
from dashgen.cli import FULL_VIEW_DEFAULT_TASKS, FULL_VIEW_MAX_TASKS, build_parser, main
from dashgen.schedule.builders import schedule_loads, workers_used
from dashgen.schedule.files import TASKS_FORMAT
from dashgen.schedule.summary import problem_tasks

COMMANDS = ["schedules", "show", "plan", "verify", "emit", "bench"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dashgen.cli", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage: dashgen " + command in capsys.readouterr().out


def test_parser_knows_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(COMMANDS) <= set(sub.choices)


def test_schedules_lists_one_line_each(capsys):
    main(["schedules"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["fa3", "spt", "descending", "shift",
                                                   "symmetric_shift", "spt_listed", "hybrid"]


def test_show_refuses_an_unsupported_problem_cleanly():
    proc = run_cli("show", "--schedule", "shift", "--mask", "causal", "--seqlen", "512")
    assert proc.returncode == 2
    assert "needs a full mask" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_problem_option_names_the_field():
    proc = run_cli("show", "--schedule", "fa3", "--heads", "6", "--heads-kv", "4")
    assert proc.returncode == 2
    assert "heads_q (6) must be a multiple of heads_kv (4)" in proc.stderr


def test_show_json_then_verify_round_trip(tmp_path, capsys):
    path = tmp_path / "s.json"
    main(["show", "--schedule", "symmetric_shift", "--mask", "causal", "--seqlen", "1024",
          "--heads", "4", "--heads-kv", "2", "--workers", "6", "--json", str(path)])
    capsys.readouterr()
    main(["verify", str(path)])
    assert ": OK: schedule 'symmetric_shift'" in capsys.readouterr().out


def test_verify_reports_an_invalid_file(tmp_path):
    path = tmp_path / "s.json"
    main(["show", "--schedule", "fa3", "--seqlen", "256", "--workers", "2", "--json", str(path)])
    data = json.loads(path.read_text())
    data["workers"][0].pop()  # drop a task
    path.write_text(json.dumps(data))
    proc = run_cli("verify", str(path))
    assert proc.returncode == 1
    assert "INVALID" in proc.stdout and "coverage-missing" in proc.stdout


@pytest.mark.parametrize("content,message", [
    ("not json", "not valid JSON"),
    ('{"format": "dashgen.schedule/1"}', "missing field 'name'"),
])
def test_verify_malformed_file_is_readable(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = run_cli("verify", str(path))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_verify_missing_file():
    proc = run_cli("verify", "/nonexistent/schedule.json")
    assert proc.returncode == 2 and "cannot read" in proc.stderr


@pytest.mark.parametrize("mask,served,skipped", [
    ("causal", ["fa3", "spt", "descending", "symmetric_shift"], "shift"),
    ("full", ["fa3", "spt", "descending", "shift"], "symmetric_shift"),
])
def test_plan_real_problem_every_schedule_with_gantt(tmp_path, mask, served, skipped):
    png = tmp_path / "plan.png"
    # --full: the full mask's 32,768 tasks are past the default full-view limit
    proc = run_cli("plan", "--heads", "16", "--seqlen", "4096", "--hdim", "128",
                   "--workers", "132", "--mask", mask, "--png", str(png), "--full")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in served:
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        workers, makespan, lower = int(row.split()[1]), float(row.split()[2]), float(
            row.split()[3])
        # shift and symmetric_shift run whole heads (32 and 16 units) a wave: 128 of the 132
        assert workers == (128 if name in ("shift", "symmetric_shift") else 132)
        assert makespan >= lower > 0
    needs = "full" if skipped == "shift" else "causal"
    assert f"{skipped:<16} skipped: {skipped} needs a {needs} mask" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_kernel_model_column(capsys):
    main(["plan", "--heads", "2", "--seqlen", "1024", "--mask", "causal", "--workers", "16",
          "--c", "3.47", "--r", "1.56", "--signal-latency", "0.35", "--kernel-model"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-2:] == ["kernel", "model"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if "skipped" not in line}
    # Decoupled writer: never slower than the chain model with the same costs.
    for name in ("fa3", "spt", "descending", "symmetric_shift"):
        # 2 heads of 8 KV tiles: 16 units, or 8 pairs under symmetric_shift
        assert rows[name][1] == ("8" if name == "symmetric_shift" else "16")
        assert float(rows[name][-1]) <= float(rows[name][2])


def test_plan_kernel_model_says_where_it_leaves_the_dq_pieces_out(capsys):
    """At 192 and 256 the kernel hands dQ over in pieces, which the kernel model leaves out:
    plan says so under its table; at 128 it says nothing."""
    args = ["plan", "--heads", "2", "--seqlen", "512", "--mask", "causal", "--workers", "16",
            "--kernel-model"]
    for head_dim, noted in (("256", True), ("192", True), ("128", False)):
        main([*args, "--hdim", head_dim])
        out = capsys.readouterr().out
        assert (f"at head_dim {head_dim} the kernel hands it over in pieces" in out) is noted


# -- --version and the defaults that follow the kernels ------------------------------------------

def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"dashgen {__version__}\n"


@pytest.mark.parametrize("hdim, blocks", [(None, "64x128"), ("128", "64x128"), ("64", "128x128")])
def test_show_defaults_to_the_backwards_tiles(hdim, blocks, capsys):
    main(["show", "--schedule", "shift", "--seqlen", "512"] + (["--hdim", hdim] if hdim else []))
    first = capsys.readouterr().out.splitlines()[0]
    head_dim = int(hdim or 128)
    # shift over 4 KV tiles of 128 keys: one unit a KV tile, so 4 of the 132 workers run.
    workers = workers_used("shift", Problem(seqlen_q=512, head_dim=head_dim,
                                            block_m=int(blocks.split("x")[0]), block_n=128), 132)
    assert workers == 4
    assert first == (f"shift: batch 1, heads 1, seqlen 512, head_dim {head_dim}, full mask, "
                     f"blocks {blocks}; {workers} workers")


def test_show_block_options_still_override_the_defaults(capsys):
    main(["show", "--schedule", "fa3", "--seqlen", "512", "--block-m", "128", "--block-n", "64"])
    # 8 KV tiles of 64 keys: fa3 runs a unit each on 8 of the 132 workers.
    assert "blocks 128x64; 8 workers" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("name, mask, workers", [
    # shift and symmetric_shift run whole heads (32 and 16 units) a wave: 128 of 132 SMs.
    ("shift", "full", 128), ("symmetric_shift", "causal", 128),
    ("fa3", "causal", 132), ("spt", "causal", 132), ("descending", "full", 132)])
def test_the_default_worker_count_is_what_the_kernels_run(name, mask, workers, capsys):
    main(["show", "--schedule", name, "--mask", mask, "--heads", "16", "--seqlen", "4096"])
    assert capsys.readouterr().out.splitlines()[0].endswith(f"; {workers} workers")


def test_plan_prints_each_schedules_worker_count(capsys):
    main(["plan", "--heads", "16", "--seqlen", "4096", "--mask", "causal"])
    lines = capsys.readouterr().out.splitlines()
    assert "blocks 64x128" in lines[0] and lines[1].split()[:2] == ["schedule", "workers"]
    workers = {line.split()[0]: line.split()[1] for line in lines[2:]}
    assert workers == {"fa3": "132", "spt": "132", "descending": "132", "shift": "skipped:",
                       "symmetric_shift": "128", "spt_listed": "132",
                       "hybrid": "128"}  # hybrid: symmetric_shift at 4k


# -- summaries at any size; the full view below a limit -------------------------------------------

HUGE = [(seqlen, hdim, heads, mask) for seqlen in (131072, 524288, 1048576)
        for hdim, heads in ((128, 16), (64, 32)) for mask in ("full", "causal")]


def tasks_in_closed_form(seqlen: int, hdim: int, heads: int, mask: str) -> int:
    """The backward's tiles (64x128 at head_dim 128, 128x128 at 64) of one square sequence: N
    KV tiles; causal keeps N(N+1) tasks a head at 64x128 (KV tile n: 2N - 2n Q tiles) and
    N(N+1)/2 at 128x128."""
    n = seqlen // 128
    per_kv = 2 if hdim == 128 else 1
    full = n * n * per_kv
    return heads * (full if mask == "full" else n * (n + 1) * per_kv // 2)


@pytest.mark.parametrize("seqlen, hdim, heads, mask", HUGE)
def test_show_summarizes_huge_problems_in_seconds(seqlen, hdim, heads, mask, capsys):
    problem = Problem(heads_q=heads, seqlen_q=seqlen, head_dim=hdim, mask=mask,
                      block_m=64 if hdim == 128 else 128, block_n=128)
    total = tasks_in_closed_form(seqlen, hdim, heads, mask)
    assert problem_tasks(problem) == total > FULL_VIEW_MAX_TASKS
    dash = "shift" if mask == "full" else "symmetric_shift"
    # The DASH order needs a head's units at once: one a KV tile (shift) or a pair (symmetric).
    dash_workers = seqlen // 128 // (1 if mask == "full" else 2)
    for name, workers in (("fa3", 132), ("spt", 132), ("descending", 132),
                          (dash, dash_workers), (dash, 2 * dash_workers + 5)):
        start = time.perf_counter()
        main(["show", "--schedule", name, "--seqlen", str(seqlen), "--hdim", str(hdim),
              "--heads", str(heads), "--mask", mask, "--workers", str(workers)])
        lines = capsys.readouterr().out.splitlines()
        assert time.perf_counter() - start < 10, (name, workers)
        loads = schedule_loads(name, problem, workers)
        assert sum(loads) == total
        busiest = loads.index(max(loads))
        bound = -(-total // workers)
        assert lines[0] == (f"{name}: {problem.describe()}; {len(loads)} workers")
        assert lines[1] == (f"  {total:,} tasks; per worker min {min(loads):,}, mean "
                            f"{total / len(loads):,.1f}, max {max(loads):,}")
        assert lines[2] == (f"  busiest worker {busiest}: {max(loads):,} tasks, "
                            f"{max(loads) / bound:.3f}x the bound ceil({total:,} / {workers}) = "
                            f"{bound:,}")
        assert max(loads) >= bound
        if len(loads) < workers:  # the DASH order rounds down to whole heads
            assert lines[3].startswith(f"  {len(loads)} of the {workers} workers run: a head's "
                                       f"{dash_workers} units run together")
        else:
            assert len(lines) == 3


def test_a_summary_at_1m_tokens_holds_no_task_in_memory(capsys):
    # 2^31 tasks: a built schedule would hold gigabytes; the summary holds a load per worker.
    args = ["--seqlen", "1048576", "--hdim", "64", "--heads", "32", "--mask", "full"]
    tracemalloc.start()
    try:
        main(["show", "--schedule", "fa3"] + args)
        main(["show", "--schedule", "shift", "--workers", "8192"] + args)
        main(["plan", "--workers", "8192"] + args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert peak < 16 << 20, peak
    assert "2,147,483,648 tasks" in out and "busiest worker 0: 262,144 tasks" in out


def test_plan_summarizes_a_huge_problem(capsys):
    main(["plan", "--seqlen", "1048576", "--heads", "16", "--mask", "causal"])
    lines = capsys.readouterr().out.splitlines()
    total = tasks_in_closed_form(1048576, 128, 16, "causal")
    assert lines[0].endswith(f"; {total:,} tasks: a summary in tasks (--full simulates up to "
                             f"{FULL_VIEW_MAX_TASKS:,})")
    assert lines[1].split()[:4] == ["schedule", "workers", "busiest", "bound"]
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    bound = -(-total // 132)
    for name in ("fa3", "spt", "descending"):
        loads = schedule_loads(name, Problem(heads_q=16, seqlen_q=1048576, mask="causal",
                                             block_m=64), 132)
        assert rows[name][1:7] == ["132", str(max(loads)), str(bound),
                                  f"{max(loads) / bound:.3f}x", str(loads.index(max(loads))),
                                  str(min(loads))]
    assert rows["shift"][1] == "skipped:"
    # symmetric_shift needs 4096 workers (a head's 8192 KV tiles in pairs), not 132
    assert "needs at least 4096 workers" in " ".join(rows["symmetric_shift"])
    assert lines[-1] == ("busiest: the tasks of the busiest worker; bound: ceil(tasks / 132 "
                         "workers); ratio: busiest / bound")


@pytest.mark.parametrize("command, option", [
    (["show", "--schedule", "fa3"], "--full"), (["show", "--schedule", "fa3"], "--json"),
    (["plan"], "--full"), (["plan"], "--text"), (["plan"], "--png"), (["plan"], "--kernel-model")])
def test_the_full_view_is_refused_above_the_limit(command, option, tmp_path):
    value = [str(tmp_path / "out")] if option in ("--json", "--png") else []
    proc = run_cli(*command, "--seqlen", "1048576", "--heads", "16", "--mask", "causal", option,
                   *value)
    total = tasks_in_closed_form(1048576, 128, 16, "causal")
    assert_one_line_error(proc, command[0], f"{option} needs the full per-task view, limited to "
                                            f"{FULL_VIEW_MAX_TASKS:,} tasks; this problem has "
                                            f"{total:,}")
    assert proc.stdout == "" and not (tmp_path / "out").exists()


def test_the_full_view_is_the_default_up_to_its_threshold(capsys):
    # fa3, full mask, 64x128 tiles: heads * (4096 / 64) * (4096 / 128) tasks, 8192 at 4 heads
    # and 32768 at 16.
    def show(*extra):
        main(["show", "--schedule", "fa3", "--seqlen", "4096", "--workers", "8", *extra])
        return capsys.readouterr().out.splitlines()

    small = show("--heads", "4")
    assert 4 * 64 * 32 <= FULL_VIEW_DEFAULT_TASKS < 16 * 64 * 32
    assert small[1].startswith("worker 0 | ") and "dQ reduction order" in small[9]
    big = show("--heads", "16")
    assert big[0].endswith("; 8 workers") and big[2].startswith("  busiest worker 0: 4,096")
    assert len(big) == 3
    assert show("--heads", "4", "--summary")[1:] == [
        "  8,192 tasks; per worker min 1,024, mean 1,024.0, max 1,024",
        "  busiest worker 0: 1,024 tasks, 1.000x the bound ceil(8,192 / 8) = 1,024"]
    assert show("--heads", "16", "--full")[1].startswith("worker 0 | h0.n0: m0 m1 m2")


def test_plan_simulates_up_to_the_threshold_and_summarizes_above(capsys):
    main(["plan", "--seqlen", "4096", "--heads", "4", "--schedule", "fa3", "--workers", "8"])
    assert capsys.readouterr().out.splitlines()[1].split()[2] == "makespan"
    main(["plan", "--seqlen", "4096", "--heads", "16", "--schedule", "fa3", "--workers", "8"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[2] == "busiest" and lines[2].split()[:3] == ["fa3", "8", "4096"]
    main(["plan", "--seqlen", "4096", "--heads", "4", "--schedule", "fa3", "--summary"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("; 8,192 tasks: a summary in tasks")
    assert lines[2].split()[:4] == ["fa3", "128", "64", "63"]  # 8192 tasks on 128 KV tiles


@pytest.mark.parametrize("command", [["show", "--schedule", "fa3", "--json", "x.json"],
                                     ["plan", "--text"], ["plan", "--kernel-model"]])
def test_summary_refuses_an_option_that_needs_the_full_view(command):
    proc = run_cli(*command, "--seqlen", "512", "--summary")
    option = command[-2] if command[0] == "show" else command[-1]
    assert_one_line_error(proc, command[0], f"--summary cannot go with {option}, which needs the "
                                            "full per-task view")


def test_one_schedule_below_its_minimum_is_an_error_and_all_skips_it(capsys):
    proc = run_cli("plan", "--schedule", "shift", "--seqlen", "1024", "--workers", "4")
    assert_one_line_error(proc, "plan", "schedule 'shift' needs at least 8 workers for this "
                                        "problem")
    assert proc.stdout == ""
    main(["plan", "--seqlen", "1024", "--workers", "4"])
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "skipped: schedule 'shift' needs at least 8 workers" in rows["shift"]
    assert rows["fa3"].split()[1] == "4"
    proc = run_cli("show", "--schedule", "shift", "--seqlen", "1024", "--workers", "4")
    assert_one_line_error(proc, "show", "got num_workers=4")


def test_workers_must_be_positive():
    proc = run_cli("show", "--schedule", "fa3", "--seqlen", "512", "--workers", "0")
    assert_one_line_error(proc, "show", "--workers must be a positive int, got 0")


def test_schedules_tags_the_orders_that_run_a_head_at_once(capsys):
    main(["schedules"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    # 4096 tokens in 128-key tiles: 32 units for shift, 16 pairs for symmetric_shift.
    assert lines["shift"].endswith("[a head's units run at once: at least 32 workers at seqlen "
                                   "4096]")
    assert lines["symmetric_shift"].endswith("at least 16 workers at seqlen 4096]")
    assert all("[" not in lines[name] for name in ("fa3", "spt", "descending"))


# -- schedule files and task tables, read back ---------------------------------------------------

def test_load_schedule_round_trips_show_json(tmp_path, capsys):
    path = tmp_path / "s.json"
    main(["show", "--schedule", "symmetric_shift", "--mask", "causal", "--seqlen", "1024",
          "--heads", "4", "--heads-kv", "2", "--workers", "12", "--json", str(path)])
    capsys.readouterr()
    loaded = load_schedule(path)
    built = build_schedule("symmetric_shift", Problem(heads_q=4, heads_kv=2, seqlen_q=1024,
                                                      mask="causal", block_m=64), 12)
    assert loaded.workers == built.workers and loaded.problem == built.problem
    assert (loaded.name, loaded.num_workers, loaded.depends_on_workers) == (
        "symmetric_shift", 12, False)
    assert load_schedule(str(path)).workers == built.workers  # a str path too


def test_load_schedule_verifies_unless_told_not_to(tmp_path):
    path = tmp_path / "s.json"
    data = json.loads(build_schedule("fa3", Problem(seqlen_q=256), 2).to_json())
    data["workers"][1][0][4] = 0  # n1 m0 also claims dq_rank 0
    path.write_text(json.dumps(data))
    with pytest.raises(VerificationError) as err:
        load_schedule(path)
    assert "dq-order" in {v.kind for v in err.value.violations}
    broken = load_schedule(path, verified=False)
    assert broken.workers[1][0].dq_rank == 0


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"), ('{"format": "dashgen.schedule/1"}', "missing field 'name'"),
    ('{"format": "dashgen.plan/9"}', 'got "format": "dashgen.plan/9"'),
    ('{"format": "dashgen.tasks/1", "schedule": "fa3", "problem": {}, "num_workers": 1, '
     '"worker_offsets": [0, 2], "tasks": [[0, 0, 0, -1]]}', "worker_offsets must be 2 ascending"),
])
def test_load_schedule_names_the_path_of_a_bad_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScheduleFormatError) as err:
        load_schedule(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_verify_reports_a_hand_broken_rank(tmp_path):
    path = tmp_path / "s.json"
    main(["show", "--schedule", "spt", "--seqlen", "512", "--mask", "causal", "--workers", "3",
          "--json", str(path)])
    data = json.loads(path.read_text())
    row = data["workers"][0][0]
    row[4] += 7  # a dq_rank past the tile's contributions
    path.write_text(json.dumps(data))
    proc = run_cli("verify", str(path))
    assert proc.returncode == 1 and proc.stdout.startswith(f"{path}: INVALID\n")
    assert f"dq-order: worker 0 position 0 tile b0 h0 n{row[2]} m{row[3]}: dq_rank " \
           f"{row[4]} is outside" in proc.stdout


@pytest.fixture
def task_table(tmp_path):
    """A task table as `dashgen emit` writes it, without compiling anything."""
    from dashgen.schedule.lower import lower
    from dashgen.tools.emit import tasks_json

    schedule = build_schedule("shift", Problem(heads_q=2, seqlen_q=512, block_m=64), 8)
    path = tmp_path / "shift.tasks.json"
    path.write_text(tasks_json(lower(schedule)))
    return path, schedule


def test_verify_and_load_schedule_read_an_emitted_task_table(task_table):
    path, schedule = task_table
    proc = run_cli("verify", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"{path}: OK: schedule 'shift', {schedule.num_tasks} tasks on 8 "
                           f"workers, 0 order conflicts (Lemma 1)\n")
    assert load_schedule(path).workers == schedule.workers


def test_verify_reports_a_broken_task_table(task_table):
    path, _ = task_table
    data = json.loads(path.read_text())
    data["tasks"][0][1] = 3 << 16 | data["tasks"][0][1] & 0xFFFF  # move the task to KV tile 3
    path.write_text(json.dumps(data))
    proc = run_cli("verify", str(path))
    assert proc.returncode == 1 and "INVALID" in proc.stdout
    assert "coverage-duplicate" in proc.stdout and "coverage-missing" in proc.stdout


@pytest.mark.parametrize("content, got", [
    ('{"format": "dashgen.kernel/2", "workers": []}', 'got "format": "dashgen.kernel/2"'),
    ('{"workers": []}', "got no format field"), ("[1, 2]", "got a JSON list")])
def test_verify_names_the_formats_it_expects(tmp_path, content, got):
    path = tmp_path / "other.json"
    path.write_text(content)
    proc = run_cli("verify", str(path))
    assert_one_line_error(proc, "verify", f'{path}: expected a dashgen schedule file ("format": '
                                          f'"dashgen.schedule/1" or "format": "{TASKS_FORMAT}"')
    assert got in proc.stderr


# -- errors: one line on stderr, exit status 2 ---------------------------------------------------

def assert_one_line_error(proc: subprocess.CompletedProcess, command: str, message: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert proc.stderr.startswith(f"dashgen {command}: error: "), proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_plan_png_into_a_missing_folder():
    proc = run_cli("plan", "--seqlen", "512", "--png", "/nonexistent/x.png")
    assert_one_line_error(proc, "plan", "--png /nonexistent/x.png: no such directory /nonexistent")
    assert proc.stdout == ""  # refused before any work


def test_plan_png_onto_a_folder(tmp_path):
    proc = run_cli("plan", "--seqlen", "512", "--png", str(tmp_path))
    assert_one_line_error(proc, "plan", f"--png {tmp_path}: is a directory")


def test_show_json_into_a_missing_folder():
    proc = run_cli("show", "--schedule", "fa3", "--seqlen", "512", "--json",
                   "/nonexistent/d/x.json")
    assert_one_line_error(proc, "show", "--json /nonexistent/d/x.json: no such directory "
                                        "/nonexistent/d")
    assert proc.stdout == ""


def test_emit_out_below_a_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("emit", "--schedule", "fa3", "--seqlen", "256", "--out", f"{blocker}/sub")
    assert_one_line_error(proc, "emit", f"--out {blocker}/sub: ")
    assert blocker.read_text() == "not a folder"


def test_a_closed_stdout_pipe_is_one_line_and_exit_2():
    """`dashgen show ... | head -1`: the reader leaves after one line; the rest of the output
    (far more than a pipe holds) cannot be written."""
    proc = subprocess.Popen([sys.executable, "-m", "dashgen.cli", "show", "--schedule", "fa3",
                             "--heads", "4", "--seqlen", "8192", "--workers", "8", "--full"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.stderr.close()
    returncode = proc.wait(timeout=120)
    assert first.startswith("fa3: batch 1, heads 4, seqlen 8192")
    assert_one_line_error(subprocess.CompletedProcess(proc.args, returncode, "", stderr), "show",
                          "standard output closed before the end")


# -- a real emit ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """stdout lines and cache folder of a real `dashgen emit` (symmetric_shift, head_dim 128,
    seqlen 512) into a fresh folder, with a cache folder of its own."""
    folder = tmp_path_factory.mktemp("emit")
    env = {**os.environ, CACHE_ENV: str(folder / "cache")}
    proc = subprocess.run([sys.executable, "-m", "dashgen.cli", "emit", "--schedule",
                           "symmetric_shift", "--hdim", "128", "--seqlen", "512", "--out", "out"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout.splitlines(), folder / "cache"


def test_emit_reports_every_kernel_function(emitted):
    lines, cache = emitted
    assert lines[0].startswith("emit symmetric_shift: batch 1, heads 1, seqlen 512, "
                               "head_dim 128, causal mask, blocks 64x128")
    assert list(cache.rglob("*.cubin"))  # compiled into the given cache
    # forward, backward, its preprocess and convert: a report line each, under 100 columns
    report = [line for line in lines if line.startswith("dashgen_")]
    assert len(report) == 4 and max(map(len, report)) < 100, report
    assert max(map(len, lines[1:])) < 100, max(lines[1:], key=len)


def test_emit_prints_lines_under_100_columns(emitted):
    lines, _ = emitted
    assert max(map(len, lines)) < 100, max(lines, key=len)


def _edited_schedule_file(tmp_path, capsys) -> Path:
    """spt's schedule written by `show --json` and renamed: a schedule file that is not its
    name's policy (it runs as a table)."""
    path = tmp_path / "spt.json"
    main(["show", "--schedule", "spt", "--seqlen", "512", "--hdim", "64", "--mask", "causal",
          "--workers", "3", "--json", str(path)])
    capsys.readouterr()
    data = json.loads(path.read_text())
    data["name"] = "edited"
    path.write_text(json.dumps(data))
    return path


def test_plan_simulates_a_schedule_file(tmp_path, capsys):
    path = _edited_schedule_file(tmp_path, capsys)
    main(["plan", "--schedule-file", str(path)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("edited"))
    assert row.split()[1] == "3" and "causal mask" in out


def test_emit_runs_a_schedule_file_as_a_table(tmp_path, capsys):
    path = _edited_schedule_file(tmp_path, capsys)
    out = tmp_path / "out"
    main(["emit", "--schedule-file", str(path), "--out", str(out)])
    names = sorted(p.name for p in out.iterdir())
    assert "edited_b1_h1_s512_d64_causal_w3.tasks.json" in names
    assert any(n.startswith("dashgen_bwd_bf16_d64_causal_table_det") and n.endswith(".cu")
               for n in names)


def test_a_schedule_file_that_fails_verification_is_not_planned_or_emitted(tmp_path, capsys):
    path = _edited_schedule_file(tmp_path, capsys)
    data = json.loads(path.read_text())
    data["workers"][0] = data["workers"][0][1:]  # a task gone: coverage fails
    path.write_text(json.dumps(data))
    for command in (["plan"], ["emit", "--out", str(tmp_path / "out")]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--schedule-file", str(path)])
        assert exit_.value.code == 1
        assert "failed verification" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_show_and_plan_take_the_schedules_own_mask_by_default(capsys):
    main(["show", "--schedule", "symmetric_shift", "--seqlen", "512", "--hdim", "64",
          "--workers", "2"])
    assert "causal mask" in capsys.readouterr().out.splitlines()[0]
    main(["plan", "--schedule", "symmetric_shift", "--seqlen", "1024"])
    assert "causal mask" in capsys.readouterr().out.splitlines()[0]
    main(["plan", "--seqlen", "1024"])  # every schedule: the full mask
    assert "full mask" in capsys.readouterr().out.splitlines()[0]
    proc = run_cli("show", "--schedule", "symmetric_shift", "--mask", "full", "--seqlen", "512")
    assert proc.returncode == 2 and "needs a causal mask" in proc.stderr


def test_a_usage_error_is_one_line_with_status_2():
    proc = run_cli("show", "--schedule", "nope")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dashgen show: error: argument --schedule")
    assert lines[0].endswith("(see dashgen show --help)")
    proc = run_cli("nope")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_a_full_view_past_the_default_limit_needs_full(capsys, tmp_path):
    """--png, --text and --kernel-model past FULL_VIEW_DEFAULT_TASKS refuse without --full,
    naming the limit and the flag, before any schedule is built."""
    proc = run_cli("plan", "--seqlen", "65536", "--png", str(tmp_path / "g.png"))
    assert proc.returncode == 2
    assert "past 20,000 tasks runs only with --full" in proc.stderr
    assert not (tmp_path / "g.png").exists()
    proc = run_cli("show", "--schedule", "fa3", "--seqlen", "65536", "--json",
                   str(tmp_path / "s.json"))
    assert proc.returncode == 2 and "--json needs the full per-task view" in proc.stderr


def test_golden_refuses_outside_a_checkout(monkeypatch, tmp_path):
    import dashgen.tools.emit as emit_module
    monkeypatch.setattr(emit_module, "GOLDEN_DIR", tmp_path / "site-packages" / "generated")
    with pytest.raises(SystemExit) as exc:
        main(["emit", "--golden"])
    assert exc.value.code == 2
    assert not (tmp_path / "site-packages" / "generated").exists()


def test_show_plan_and_emit_take_auto_as_attention_picks_it(capsys, tmp_path):
    from dashgen.runtime.select import resolve_schedule
    long = Problem(heads_q=16, seqlen_q=65536, mask="causal", block_m=64, block_n=128)
    expected, workers = resolve_schedule(long, "auto", None, 132)
    assert expected == "spt_listed"
    main(["show", "--schedule", "auto", "--heads", "16", "--seqlen", "65536", "--mask", "causal",
          "--summary"])
    out, err = capsys.readouterr()
    assert err.strip() == f"auto: {expected} on {workers} workers"
    assert out.startswith(f"{expected}: ")
    main(["plan", "--schedule", "auto", "--seqlen", "4096", "--mask", "causal"])
    out, err = capsys.readouterr()
    assert err.startswith("auto: symmetric_shift on 16 workers")
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["symmetric_shift"]
