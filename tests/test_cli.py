"""The dashgen command line: help and --version, the defaults that follow the kernels (tiles
and worker counts), every error one line on stderr with exit status 2, plan on a real problem
and a real emit."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dashgen import Problem, __version__
from dashgen.caches import CACHE_ENV
from dashgen.cli import build_parser, main
from dashgen.schedule.builders import balanced_workers

COMMANDS = ["schedules", "show", "plan", "verify", "emit", "calibrate"]


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
                                                   "symmetric_shift"]


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
    proc = run_cli("plan", "--heads", "16", "--seqlen", "4096", "--hdim", "128",
                   "--workers", "132", "--mask", mask, "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in served:
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        workers, makespan, lower = int(row.split()[1]), float(row.split()[2]), float(
            row.split()[3])
        assert workers == 132 and makespan >= lower > 0
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
        assert rows[name][1] == "16"
        assert float(rows[name][-1]) <= float(rows[name][2])


# -- --version and the defaults that follow the kernels ------------------------------------------

def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"dashgen {__version__}\n"


@pytest.mark.parametrize("hdim, blocks", [(None, "64x128"), ("128", "64x128"), ("64", "128x128")])
def test_show_defaults_to_the_backwards_tiles(hdim, blocks, capsys):
    main(["show", "--schedule", "shift", "--seqlen", "512"] + (["--hdim", hdim] if hdim else []))
    first = capsys.readouterr().out.splitlines()[0]
    head_dim = int(hdim or 128)
    # shift over 4 KV tiles of 128 keys: the fewest workers as busy as 132, one a KV tile.
    workers = balanced_workers("shift", Problem(seqlen_q=512, head_dim=head_dim,
                                                block_m=int(blocks.split("x")[0]),
                                                block_n=128), 132)
    assert workers == 4
    assert first == (f"shift: batch 1, heads 1, seqlen 512, head_dim {head_dim}, full mask, "
                     f"blocks {blocks}; {workers} workers")


def test_show_block_options_still_override_the_defaults(capsys):
    main(["show", "--schedule", "fa3", "--seqlen", "512", "--block-m", "128", "--block-n", "64"])
    assert "blocks 128x64; 132 workers" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("name, mask, workers", [
    ("shift", "full", 128), ("symmetric_shift", "causal", 128),  # balanced_workers on 132 SMs
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
                       "symmetric_shift": "128"}


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
                             "--heads", "4", "--seqlen", "8192", "--workers", "8"],
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
