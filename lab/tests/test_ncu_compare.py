"""lab/ncu_compare.py on small details CSVs in Nsight Compute's layout: the longest kernel
of each report is the one compared, shared metrics line up, the rest is named."""
from __future__ import annotations

import pytest

import ncu_compare  # lab/ is on the path (the root conftest.py)

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value","Rule Name","Rule Type","Rule Description"')


def row(launch: int, kernel: str, section: str, metric: str, unit: str, value: str) -> str:
    return (f'"{launch}","1","python3","host","{kernel}","1","7","(384, 1, 1)","(132, 1, 1)",'
            f'"0","9.0","{section}","{metric}","{unit}","{value}",')


def write(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


SOL = "GPU Speed Of Light Throughput"


def test_the_longest_kernel_of_each_report_is_compared(tmp_path, capsys):
    ours = write(tmp_path / "ours.csv", [
        row(0, "prep", SOL, "Elapsed Cycles", "cycle", "1,000"),
        row(0, "prep", SOL, "Duration", "us", "1.0"),
        row(1, "main", SOL, "Elapsed Cycles", "cycle", "900,000"),
        row(1, "main", SOL, "Duration", "us", "500.0"),
        row(1, "main", "Memory Workload Analysis", "L2 Hit Rate", "%", "77"),
        row(2, "main", SOL, "Elapsed Cycles", "cycle", "5"),  # a second launch: ignored
    ])
    theirs = write(tmp_path / "theirs.csv", [
        "==PROF== Disconnected",
        row(0, "fa3_main", SOL, "Elapsed Cycles", "cycle", "800,000"),
        row(0, "fa3_main", SOL, "Duration", "us", "440.0"),
        row(1, "fa3_post", SOL, "Elapsed Cycles", "cycle", "2,000"),
    ])
    ncu_compare.main([f"dashgen={ours}", f"fa3={theirs}"])
    out, err = capsys.readouterr()
    assert "dashgen: main" in err and "fa3: fa3_main" in err
    lines = out.splitlines()
    assert lines[0] == "| section | metric | unit | dashgen | fa3 |"
    assert f"| {SOL} | Elapsed Cycles | cycle | 900,000 | 800,000 |" in lines
    assert f"| {SOL} | Duration | us | 500.0 | 440.0 |" in lines
    assert lines[-1] == "Not in every report: Memory Workload Analysis / L2 Hit Rate"


def test_a_report_without_kernels_or_label_is_refused(tmp_path):
    empty = write(tmp_path / "empty.csv", ["==ERROR== Could not open report file"])
    with pytest.raises(ValueError, match="no kernel in the report"):
        ncu_compare.main([f"x={empty}"])
    with pytest.raises(SystemExit):
        ncu_compare.main([str(empty)])
