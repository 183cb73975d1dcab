"""Which SM pipes a kernel keeps busy, from Nsight Compute's raw page: for each
`ncu --page raw --csv` file (one kernel launch, the sections of scripts/ncu_forward_pipes.sh),
its duration, the tensor pipe's active cycles, the XU pipe's instructions (MUFU: the softmax's
exponentials), the FMA and ALU pipes, shared-memory wavefronts and bank conflicts, and the
instructions issued per cycle, one column per file. The tensor and XU figures side by side say
whether the exponentials run under the matmuls (their sum well above 100%) or beside them.

python3 scripts/ncu_pipes.py LABEL=FILE.raw.csv LABEL=FILE.raw.csv ...
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

# (row label, raw metric)
PIPES = (
    ("duration", "gpu__time_duration.sum"),
    ("tensor pipe active (% of active cycles)",
     "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("XU instructions (% of peak, active)",
     "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("FMA pipe active (%)", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("ALU pipe active (%)", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
    ("shared-memory wavefronts (% of peak, elapsed)",
     "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"),
    ("shared-memory bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
    ("instructions a cycle (SM, active)", "sm__inst_executed.avg.per_cycle_active"),
)


def read(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """The kernel's name and {metric: (unit, value)} of a raw CSV's first launch (row 0 names
    the metrics, row 1 gives their units, row 2 on one launch each)."""
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    if len(rows) < 3:
        raise SystemExit(f"{path}: no launch in this raw CSV")
    names, units, values = rows[0], rows[1], rows[2]
    metrics = {n: (u, v) for n, u, v in zip(names, units, values)}
    return metrics.get("Kernel Name", ("", "?"))[1], metrics


def table(columns: list[tuple[str, Path]]) -> str:
    """The markdown table: one row per PIPES metric, one column per labelled file."""
    read_in = [(label, *read(path)) for label, path in columns]
    lines = ["| metric | " + " | ".join(label for label, _, _ in read_in) + " |",
             "|---|" + "---|" * len(read_in)]
    for row_label, metric in PIPES:
        cells = []
        for _, _, metrics in read_in:
            unit, value = metrics.get(metric, ("", "-"))
            cells.append(f"{value} {unit}".strip())
        lines.append(f"| {row_label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{label}: `{kernel}`" for label, kernel, _ in read_in]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="LABEL=FILE.raw.csv")
    args = parser.parse_args()
    columns = []
    for item in args.files:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"files: expected LABEL=FILE, got {item!r}")
        columns.append((label, Path(path)))
    print(table(columns))


if __name__ == "__main__":
    main()
