"""scripts/ncu_sass.py on small source-page and raw-page CSVs in Nsight Compute's layouts (the
lines ncu prints before a header, several functions in one source page, thousands separators),
and scripts/ncu_stalls.sh's arguments and command lines, with a stand-in for ncu."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import ncu_sass  # noqa: E402

STALL = "smsp__pcsamp_warps_issue_stalled_"
SOURCE_HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
                 "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
                 "Thread Instructions Executed", "Address Space", "stall_barrier", "stall_long_sb"]


def quoted(row: list) -> str:
    return ",".join(f'"{c}"' for c in row)


def sass_csv(path: Path, functions: dict[str, list[tuple]], header=SOURCE_HEADER) -> Path:
    """functions: name -> [(address, sass, samples, executed, barrier, long_sb)]."""
    lines = ["==PROF== Connected to process 1234"]
    for name, rows in functions.items():
        lines += [quoted(["Kernel Name", name]), quoted(header)]
        for address, sass, samples, executed, barrier, long_sb in rows:
            full = {"Address": address, "Source": sass,
                    "Warp Stall Sampling (All Samples)": samples,
                    "Warp Stall Sampling (Not-issued Samples)": "1",
                    "Instructions Executed": executed, "Thread Instructions Executed": "99,999",
                    "Address Space": "Generic", "stall_barrier": barrier,
                    "stall_long_sb": long_sb}
            lines.append(quoted([full[c] for c in header]))
    path.write_text("\n".join(lines) + "\n")
    return path


def raw_csv(path: Path, kernels: list[tuple[str, dict[str, str]]]) -> Path:
    """kernels: [(name, {reason: value})], every kernel with the same reasons."""
    reasons = list(kernels[0][1])
    header = ["ID", "Process ID", "Kernel Name"]
    for r in reasons:
        header += [STALL + r, STALL + r + "_not_issued"]
    header.append("smsp__pcsamp_sample_count")
    units = ["", "", ""] + [""] * (2 * len(reasons)) + [""]
    lines = ["==PROF== Disconnected from process 1234", quoted(header), quoted(units)]
    for i, (name, values) in enumerate(kernels):
        row = [str(i), "1234", name]
        for r in reasons:
            row += [values[r], "100,000"]  # the _not_issued values would swamp the shares
        row.append("5,000")
        lines.append(quoted(row))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("sass, op", [
    ("HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ, !UPT ;", "HGMMA"),
    ("@P0 HGMMA.64x128x16.F32.BF16 gdesc[UR8], R24, gsb0 ;", "HGMMA"),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "WARPGROUP"),
    ("@!P1 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R3+URZ+0x30], R4 ;", "SYNCS"),
    ("BAR.SYNC.DEFER_BLOCKING R10, 0x100 ;", "BAR"),
    ("EXIT ;", "EXIT"),
    ("NOP;", "NOP"),
    ("", "?"),
])
def test_opcode_drops_predicate_and_modifiers(sass, op):
    assert ncu_sass.opcode(sass) == op


def test_raw_stalls_take_the_first_kernel_and_leave_not_issued_out(tmp_path):
    path = raw_csv(tmp_path / "k.raw.csv", [
        ("dashgen_bwd_bf16_d64_causal_symshift_det", {"barrier": "1,500", "long_scoreboard": "500",
                                                      "math_pipe_throttle": "0"}),
        ("second_kernel", {"barrier": "7", "long_scoreboard": "7", "math_pipe_throttle": "7"}),
    ])
    name, stalls = ncu_sass.raw_stalls(path)
    assert name == "dashgen_bwd_bf16_d64_causal_symshift_det"
    assert stalls == {"barrier": 1500.0, "long_scoreboard": 500.0, "math_pipe_throttle": 0.0}


def test_sass_rows_sum_every_function_and_skip_the_preamble(tmp_path):
    path = sass_csv(tmp_path / "k.sass.csv", {
        "main": [("0x7f0000000000", "@P0 HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ ;", "1,200",
                  "2,048", "0", "1,000")],
        "helper": [("0x7f0000001000", "BAR.SYNC.DEFER_BLOCKING R10, 0x100 ;", "300", "64",
                    "290", "0")],
    })
    rows = ncu_sass.sass_rows(path)
    assert [(r.address, r.samples, r.executed) for r in rows] == [
        ("0x7f0000000000", 1200.0, 2048.0), ("0x7f0000001000", 300.0, 64.0)]
    assert rows[0].stalls == {"stall_barrier": 0.0, "stall_long_sb": 1000.0}
    assert rows[1].stalls == {"stall_barrier": 290.0, "stall_long_sb": 0.0}


def table(out: str, heading: str) -> list[str]:
    """The rows of the markdown table under a heading, without its header and rule."""
    lines = out.splitlines()
    at = lines.index(heading) + 2
    end = next((i for i in range(at, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[at + 2:end]


def write_pair(tmp_path: Path, label: str, raw: dict[str, str], sass: list[tuple]) -> str:
    prefix = tmp_path / label
    raw_csv(Path(f"{prefix}.raw.csv"), [(f"{label}_main", raw)])
    sass_csv(Path(f"{prefix}.sass.csv"), {f"{label}_main": sass})
    return f"{label}={prefix}"


def test_main_tables(tmp_path, capsys):
    # 20 reasons, so the top-15 cut matters; r00 has the most samples for dashgen.
    ours_raw = {f"r{i:02d}": f"{(20 - i) * 100:,}" for i in range(20)}  # total 21,000
    theirs_raw = {f"r{i:02d}": "50" for i in range(20)}  # 1,000, 5.0% each
    ours_sass = [
        ("0x10", "@P0 HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ ;", "4,000", "1,000", "0", "3,000"),
        ("0x20", "HGMMA.64x128x16.F32.BF16 gdesc[UR8], R24 ;", "2,000", "1,000", "0", "0"),
        ("0x30", "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "1,500", "2,000", "0", "0"),
        ("0x40", "@!P1 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R3+URZ+0x30], R4 ;", "1,000", "10",
         "0", "0"),
        ("0x50", "BAR.SYNC.DEFER_BLOCKING R10, 0x100 ;", "1,000", "20", "900", "0"),
        ("0x60", "FADD R0, |R1|, -RZ ;", "500", "5", "0", "0"),
        ("0x70", "LDS.128 R8, [R2+0x" + "0" * 80 + "] ;", "0", "7", "0", "0"),
    ]  # 10,000 samples
    theirs_sass = [(f"0x{i:x}0", f"IMAD R{i}, R{i}, R{i}, RZ ;", str(i), "1", "0", "0")
                   for i in range(1, 31)]  # 465 samples on 30 instructions
    ncu_sass.main([write_pair(tmp_path, "dashgen", ours_raw, ours_sass),
                   write_pair(tmp_path, "FA3", theirs_raw, theirs_sass)])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "dashgen: `dashgen_main`, 10,000 samples on 7 instructions"

    reasons = table(out, "## Stall reasons")
    assert len(reasons) == 15
    assert reasons[0] == "| r00 | 9.5 | 5.0 |"  # 2,000 / 21,000
    assert reasons[1] == "| r01 | 9.0 | 5.0 |"
    assert reasons[-1] == "| r14 | 2.9 | 5.0 |"  # 600 / 21,000

    opcodes = table(out, "## dashgen: samples by opcode")
    assert opcodes[:4] == ["| HGMMA | 2,000 | 6,000 | 60.0 |",
                           "| WARPGROUP | 2,000 | 1,500 | 15.0 |",
                           "| BAR | 20 | 1,000 | 10.0 |",
                           "| SYNCS | 10 | 1,000 | 10.0 |"]
    assert opcodes[-1] == "| LDS | 7 | 0 | 0.0 |"

    hot = out.splitlines()[out.splitlines().index("## dashgen: instructions with the most samples")
                           + 2]
    assert hot == "| address | SASS | samples | % of samples | stall_long_sb | stall_barrier |"
    ours_hot = table(out, "## dashgen: instructions with the most samples")
    assert ours_hot[0] == ("| 0x10 | @P0 HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ ; | 4,000 | 40.0 "
                           "| 3,000 | 0 |")
    assert ours_hot[4].startswith("| 0x50 | BAR.SYNC") and ours_hot[4].endswith("| 0 | 900 |")
    assert "| FADD R0, \\|R1\\|, -RZ ; |" in ours_hot[5]
    assert ours_hot[6] == "| 0x70 | LDS.128 R8, [R2+0x" + "0" * 52 + " | 0 | 0.0 | 0 | 0 |"

    fa3_hot = table(out, "## FA3: instructions with the most samples")
    assert len(fa3_hot) == 25
    assert fa3_hot[0] == "| 0x1e0 | IMAD R30, R30, R30, RZ ; | 30 | 6.5 |"  # no stall columns
    assert fa3_hot[-1].startswith("| 0x60 |")
    assert len(table(out, "## FA3: samples by opcode")) == 1


def test_source_page_without_per_reason_columns(tmp_path, capsys):
    header = SOURCE_HEADER[:5]
    path = sass_csv(tmp_path / "x.sass.csv",
                    {"k": [("0x10", "EXIT ;", "3", "1", "", "")]}, header=header)
    assert ncu_sass.sass_rows(path)[0].stalls == {}
    raw_csv(tmp_path / "x.raw.csv", [("k", {"barrier": "3"})])
    ncu_sass.main([f"x={tmp_path / 'x'}"])
    out = capsys.readouterr().out
    assert "| address | SASS | samples | % of samples |\n|---|---|---:|---:|\n" in out
    assert "| 0x10 | EXIT ; | 3 | 100.0 |" in out


def test_hot_table_keeps_the_stall_columns_with_most_samples():
    stalls = {f"stall_{i:02d}": i for i in range(12)}
    rows = [ncu_sass.Instruction("0x10", "EXIT ;", 1, 100, stalls)]
    header = ncu_sass.hot_table(rows)[0]
    assert header.endswith("| " + " | ".join(f"stall_{i:02d}" for i in range(11, 3, -1)) + " |")


def test_missing_files_and_headers_name_the_file(tmp_path):
    with pytest.raises(SystemExit, match="nothing.raw.csv: no such file"):
        ncu_sass.main([f"x={tmp_path / 'nothing'}"])
    bad = tmp_path / "bad.sass.csv"
    bad.write_text('==ERROR== the report has no source\n"Kernel Name","k"\n')
    with pytest.raises(SystemExit, match="bad.sass.csv: no header with an Address"):
        ncu_sass.sass_rows(bad)
    no_samples = tmp_path / "ns.sass.csv"
    no_samples.write_text('"Address","Source","Instructions Executed"\n"0x10","EXIT ;","1"\n')
    with pytest.raises(SystemExit, match="ns.sass.csv: no 'Warp Stall Sampling"):
        ncu_sass.sass_rows(no_samples)
    raw = tmp_path / "bad.raw.csv"
    raw.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"","","ns"\n"0","k","5"\n')
    with pytest.raises(SystemExit, match="bad.raw.csv: no header with smsp__pcsamp"):
        ncu_sass.raw_stalls(raw)
    units_only = tmp_path / "units.raw.csv"
    units_only.write_text(f'"ID","{STALL}barrier"\n"",""\n')
    with pytest.raises(SystemExit, match="units.raw.csv: a header but no kernel row"):
        ncu_sass.raw_stalls(units_only)
    with pytest.raises(SystemExit):
        ncu_sass.main([str(tmp_path / "x")])  # no LABEL=


def run_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/ncu_stalls.sh", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


@pytest.mark.parametrize("args", [(), ("out_dir",)])
def test_script_without_a_config_prints_usage(args):
    done = run_script(*args)
    assert done.returncode == 2
    assert "usage: bash scripts/ncu_stalls.sh OUT_DIR CONFIG" in done.stderr


FAKE_NCU = """#!/usr/bin/env bash
# Records its arguments; writes a report for -o, the test's CSVs for -i.
printf '%s\\n' "$*" >> "$NCU_LOG"
[[ " $* " == *" --impl ${NCU_FAIL:-none} "* ]] && { echo "==ERROR== failed" >&2; exit 1; }
args=("$@")
for ((i = 0; i < $#; i++)); do
    case ${args[i]} in
        -o) touch "${args[i+1]}.ncu-rep";;
        -i) rep=${args[i+1]};;
        source) page=sass;;
        raw) page=raw;;
    esac
done
if [[ -n ${rep:-} ]]; then
    impl=${rep%.ncu-rep}; impl=${impl##*.}
    cat "$NCU_DATA/$impl.$page.csv"
fi
"""


def fake_ncu(tmp_path, impls, stalls, sass, **env_vars) -> tuple[dict, Path]:
    """A stand-in ncu on PATH whose reports hold `stalls` (raw page) and `sass` (source page)
    for each of `impls`; returns the environment and the log of its command lines."""
    data = tmp_path / "data"
    data.mkdir()
    for impl in impls:
        raw_csv(data / f"{impl}.raw.csv", [(f"{impl}_main", stalls)])
        sass_csv(data / f"{impl}.sass.csv", {"k": [sass]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").write_text(FAKE_NCU)
    (bin_dir / "ncu").chmod(0o755)
    log = tmp_path / "ncu.log"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", NCU_LOG=str(log),
               NCU_DATA=str(data), **env_vars)
    return env, log


def test_script_profiles_both_main_kernels_and_tables_them(tmp_path):
    env, log = fake_ncu(tmp_path, ("dashgen", "fa3"), {"barrier": "3", "wait": "1"},
                        ("0x10", "BAR.SYNC 0x0 ;", "4", "1", "3", "0"), FA3_PATH="/opt/fa3")
    out = tmp_path / "out"
    done = run_script(str(out), "d64-causal-8192", env=env)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    common = ("--profile-from-start off --clock-control none --kernel-name-base {base} "
              "--kernel-name {kernel} --launch-count 1 --section WarpStateStats "
              "--section SourceCounters --section SpeedOfLight --import-source no "
              "-o {out}/d64-causal-8192.{impl} python3 scripts/ncu_backward.py --impl {impl} "
              "--fa3-path /opt/fa3 --head-dim 64 --mask causal --seqlen 8192")
    dashgen_kernel = "regex:^dashgen_bwd_[a-z0-9_]*det(_gqa)?(_fconv)?(_ekv)?(_trace)?(_varlen)?$"
    assert calls == [
        common.format(base="function", kernel=dashgen_kernel, out=out, impl="dashgen"),
        f"-i {out}/d64-causal-8192.dashgen.ncu-rep --page source --csv --print-source sass",
        f"-i {out}/d64-causal-8192.dashgen.ncu-rep --page raw --csv",
        common.format(base="demangled", kernel="regex:FlashAttnBwdSm90", out=out, impl="fa3"),
        f"-i {out}/d64-causal-8192.fa3.ncu-rep --page source --csv --print-source sass",
        f"-i {out}/d64-causal-8192.fa3.ncu-rep --page raw --csv",
    ]
    md = (out / "d64-causal-8192.md").read_text()
    assert md.startswith("dashgen: `dashgen_main`, 4 samples on 1 instructions\n"
                         "FA3: `fa3_main`, 4 samples on 1 instructions\n")
    assert "| barrier | 75.0 | 75.0 |" in md


def test_script_tables_what_it_has_when_one_profile_fails(tmp_path):
    env, _ = fake_ncu(tmp_path, ("dashgen",), {"barrier": "1"},
                      ("0x10", "EXIT ;", "1", "1", "0", "0"), NCU_FAIL="fa3")
    out = tmp_path / "out"
    done = run_script(str(out), "d128-full-4096", env=env)
    assert done.returncode == 0
    log = out / "d128-full-4096.fa3.log"
    assert f"d128-full-4096 fa3: ncu exited 1 or wrote no report, see {log}" in done.stderr
    assert "==ERROR== failed" in log.read_text()
    md = (out / "d128-full-4096.md").read_text()
    assert "| barrier | 100.0 |" in md and "FA3" not in md


def test_region_table_splits_the_code_at_each_exit(tmp_path):
    # Two role stretches, each ending in EXIT, then an out-of-line retry loop.
    path = sass_csv(tmp_path / "r.sass.csv", {"k": [
        ("0x00", "HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], R0", "30", "10", "20", "0"),
        ("0x10", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "30", "10", "30", "0"),
        ("0x20", "EXIT", "0", "1", "0", "0"),
        ("0x30", "UTMALDG.4D [UR8], [UR4]", "10", "2", "0", "5"),
        ("0x40", "@!P0 BRA 0x80", "20", "4", "0", "20"),
        ("0x50", "EXIT", "0", "1", "0", "0"),
        ("0x60", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3", "10", "3", "0", "10"),
    ]})
    lines = ncu_sass.region_table(ncu_sass.sass_rows(path))
    assert lines[2] == ("| 0x00..0x20 (EXIT) | 3 | wgmma | 60.0 | "
                        "stall_barrier 83.3 |")
    assert lines[3] == ("| 0x30..0x50 (EXIT) | 3 | TMA loads | 30.0 | "
                        "stall_long_sb 83.3 |")
    assert lines[4] == ("| 0x60..0x60 (out-of-line, after the last EXIT) | 1 | - | 10.0 | "
                        "stall_long_sb 100.0 |")
    assert len(lines) == 5


def test_task_loop_is_the_code_run_as_often_as_the_wgmmas(tmp_path):
    # Two wgmma paths: 4 HGMMAs run 1,000 times (every task) and 2 run 100 times (masked tasks
    # only), so the loop runs 1,000 times; within 10% of that count counts, the rest does not.
    path = sass_csv(tmp_path / "l.sass.csv", {"k": [
        ("0x00", "UTMALDG.4D [UR8], [UR4]", "50", "125", "0", "50"),
        ("0x10", "HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], RZ", "100", "1,000", "0", "0"),
        ("0x20", "HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], R0", "0", "1,000", "0", "0"),
        ("0x30", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "3", "1,000", "3", "0"),
        ("0x40", "FFMA R1, R2, R3, R4", "600", "960", "0", "0"),
        ("0x50", "HGMMA.64x64x16.F32.BF16 R8, gdesc[UR6], RZ", "200", "100", "200", "0"),
        ("0x60", "HGMMA.64x64x16.F32.BF16 R8, gdesc[UR6], R8", "0", "100", "0", "0"),
        ("0x70", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "0", "1,000", "0", "0"),
        ("0x80", "IMAD R5, R5, R5, RZ", "297", "1,000", "0", "297"),
        ("0x90", "HGMMA.64x64x16.F32.BF16 R8, gdesc[UR6], RZ", "0", "1,000", "0", "0"),
        ("0xa0", "HGMMA.64x64x16.F32.BF16 R8, gdesc[UR6], R8", "0", "1,000", "0", "0"),
        ("0xb0", "IADD3 R6, R6, 1, RZ", "0", "1,090", "0", "0"),
        ("0xc0", "IADD3 R7, R7, 1, RZ", "500", "1,200", "0", "0"),
    ]})
    rows = ncu_sass.sass_rows(path)
    runs, loop = ncu_sass.loop_rows(rows)
    assert runs == 1000
    assert [ins.address for ins in loop] == ["0x10", "0x20", "0x30", "0x40", "0x70", "0x80",
                                             "0x90", "0xa0", "0xb0"]
    lines = ncu_sass.loop_tables(rows)
    # 1,000 of the kernel's 1,750 samples.
    assert lines[0] == ("9 instructions run 1,000 times (a task, per MMA warp), 1,000 samples "
                        "(57.1% of the kernel's).")
    ops = lines[4:lines.index("", 4)]
    assert ops[0] == "| FFMA | 1 | 600 | 60.0 | - |"
    assert ops[1] == "| IMAD | 1 | 297 | 29.7 | stall_long_sb 100.0 |"
    assert ops[2] == "| HGMMA | 4 | 100 | 10.0 | - |"
    assert ops[3] == "| WARPGROUP | 1 | 3 | 0.3 | stall_barrier 100.0 |"
    # Waits and barriers in program order, and what holds 1% of the loop's samples; the IADD3
    # with none is left out.
    events = lines[lines.index("", 4) + 3:]
    assert [e.split(" | ")[0] for e in events] == ["| 0x10", "| 0x30", "| 0x40", "| 0x70",
                                                   "| 0x80"]
    assert events[1] == "| 0x30 | WARPGROUP.DEPBAR.LE gsb0, 0x0 | 3 | 0.3 | stall_barrier 100.0 |"
    assert events[3] == "| 0x70 | BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 | 0 | 0.0 | - |"


def test_task_loop_of_a_kernel_without_wgmmas(tmp_path, capsys):
    path = sass_csv(tmp_path / "n.sass.csv", {"k": [("0x10", "FADD R0, R1, R2", "5", "7", "0",
                                                     "0")]})
    assert ncu_sass.loop_rows(ncu_sass.sass_rows(path)) == (0.0, [])
    raw_csv(tmp_path / "n.raw.csv", [("k", {"barrier": "5"})])
    ncu_sass.main([f"n={tmp_path / 'n'}"])
    out = capsys.readouterr().out.splitlines()
    assert out[out.index("## n: the task loop") + 2] == "No wgmma in this kernel: no task loop."


@pytest.mark.parametrize("nondet, flagged", [("", ()), ("1", ("dashgen", "fa3")),
                                             ("fa3", ("fa3",))])
def test_nondet_picks_which_backwards_run_without_the_order(tmp_path, nondet, flagged):
    env, log = fake_ncu(tmp_path, ("dashgen", "fa3"), {"barrier": "1"},
                        ("0x10", "EXIT ;", "1", "1", "0", "0"), NONDET=nondet)
    done = run_script(str(tmp_path / "out"), "d128-causal-8192", env=env)
    assert done.returncode == 0, done.stderr
    profiled = {line.split("--impl ")[1].split()[0]: line.endswith(" --nondeterministic")
                for line in log.read_text().splitlines() if " -o " in line}
    assert profiled == {impl: impl in flagged for impl in ("dashgen", "fa3")}


def test_nondet_refuses_other_values_by_name(tmp_path):
    env = dict(os.environ, NONDET="yes")
    done = run_script(str(tmp_path / "out"), "d128-causal-8192", env=env)
    assert done.returncode == 2
    assert "NONDET must be empty, 1 or fa3, got 'yes'" in done.stderr


def test_stretches_run_from_one_wait_to_the_next(tmp_path):
    # A loop of 9 instructions (as in the task-loop test): the stretch before the first wait,
    # the one the wgmma wait opens (its own samples and the exponential's), and the one the named
    # barrier opens. The try-wait opens a stretch too; the barrier's arrive form does not.
    path = sass_csv(tmp_path / "s.sass.csv", {"k": [
        ("0x10", "HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], RZ", "100", "1,000", "0", "0"),
        ("0x20", "HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], R0", "0", "1,000", "0", "0"),
        ("0x30", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "3", "1,000", "3", "0"),
        ("0x40", "@P1 MUFU.EX2 R1, R2", "600", "1,000", "0", "0"),
        ("0x50", "BAR.ARV 0x2, 0x100", "7", "1,000", "0", "0"),
        ("0x60", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "0", "1,000", "0", "0"),
        ("0x70", "IMAD R5, R5, R5, RZ", "190", "1,000", "0", "190"),
        ("0x80", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R0", "20", "1,000", "0", "0"),
        ("0x90", "@!P0 BRA 0x200", "80", "1,000", "0", "80"),
    ]})
    rows = ncu_sass.sass_rows(path)
    assert [ncu_sass.is_wait(i.sass) for i in rows] == [False, False, True, False, False, True,
                                                       False, True, False]
    lines = ncu_sass.stretch_table(rows)
    assert lines[0].split(" | ")[4] == "exponentials"
    assert lines[2:] == [
        "| 0x10 | HGMMA.64x128x16.F32.BF16 R0, gdesc[UR4], RZ | 2 | 2 | 0 | 100 | 10.0 | - |",
        "| 0x30 | WARPGROUP.DEPBAR.LE gsb0, 0x0 | 3 | 0 | 1 | 610 | 61.0 | stall_barrier 0.5 |",
        "| 0x60 | BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 | 2 | 0 | 0 | 190 | 19.0 | "
        "stall_long_sb 100.0 |",
        "| 0x80 | SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R0 | 2 | 0 | 0 | 100 | 10.0 | "
        "stall_long_sb 80.0 |",
    ]


def test_runs_table_reads_once_a_tile_code_in_loop_iterations(tmp_path):
    # A forward-like kernel: a loop of 700 runs (7 steps a tile, 100 tiles) holding 1,400
    # samples (2 a run), and code run once a tile (100 runs) holding 500 (5 a run: 2.5 steps).
    path = sass_csv(tmp_path / "k.sass.csv", {"fwd": [
        ("0x10", "HGMMA.64x128x16.F32.BF16 gdesc[UR4], R24, gsb0 ;", "1,000", "700", "0", "0"),
        ("0x20", "MUFU.EX2 R1, R2 ;", "400", "700", "0", "0"),
        ("0x30", "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "300", "100", "0", "0"),
        ("0x40", "MUFU.EX2 R3, R4 ;", "200", "100", "0", "0"),
        ("0x50", "EXIT ;", "7", "3", "0", "0"),
    ]})
    lines = ncu_sass.runs_table(ncu_sass.sass_rows(path))
    assert lines[2] == "| 700 | 1.000 | 2 | 1 | 1 | 1,400 | 73.4 | 1.000 |"
    assert lines[3] == "| 100 | 0.143 | 2 | 0 | 1 | 500 | 26.2 | 2.500 |"
    assert lines[4] == "| 3 | 0.004 | 1 | 0 | 0 | 7 | 0.4 | 1.167 |"
    assert ncu_sass.runs_table([]) == ["No wgmma in this kernel: no task loop."]
