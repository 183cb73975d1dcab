"""scripts/ncu_pipes.py on small raw CSVs in Nsight Compute's layout (metric names, units, one
launch a row): the pipe metrics line up per file, a metric a report lacks reads "-"."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ncu_pipes  # noqa: E402


def write(path: Path, kernel: str, metrics: dict[str, tuple[str, str]]) -> Path:
    names = ["ID", "Kernel Name", *metrics]
    units = ["", "", *(u for u, _ in metrics.values())]
    values = ["0", kernel, *(v for _, v in metrics.values())]
    path.write_text("\n".join(",".join(f'"{c}"' for c in row)
                              for row in (names, units, values)) + "\n")
    return path


def test_the_table_has_each_files_values_under_its_label(tmp_path):
    a = write(tmp_path / "a.csv", "kernel_a", {
        "gpu__time_duration.sum": ("ms", "1.14"),
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "51.2"),
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": ("%", "52.9")})
    b = write(tmp_path / "b.csv", "kernel_b", {
        "gpu__time_duration.sum": ("ms", "1.15"),
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "77.3")})
    lines = ncu_pipes.table([("ours", a), ("theirs", b)]).splitlines()
    assert lines[0] == "| metric | ours | theirs |"
    assert "| duration | 1.14 ms | 1.15 ms |" in lines
    assert "| tensor pipe active (% of active cycles) | 51.2 % | 77.3 % |" in lines
    assert "| XU instructions (% of peak, active) | 52.9 % | - |" in lines
    assert "ours: `kernel_a`" in lines and "theirs: `kernel_b`" in lines


def test_a_csv_without_a_launch_is_refused(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text('"ID","Kernel Name"\n"",""\n')
    with pytest.raises(SystemExit, match="no launch"):
        ncu_pipes.table([("x", empty)])
