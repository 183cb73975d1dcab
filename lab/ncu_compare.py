"""Nsight Compute reports side by side: for each `ncu --page details --csv` file, its longest
kernel (by elapsed cycles: the backward's main kernel beside its small pre/post kernels), and
every metric those kernels share, one row each, with their units; what only some report is
listed after. For comparing dashgen's kernels with FlashAttention-3's under the same sections.

python3 lab/ncu_compare.py LABEL=FILE.csv LABEL=FILE.csv ...
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def number(text: str) -> float | None:
    """A metric value as ncu's CSV writes it (thousands separators), None if not a number."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def kernels(path: Path) -> dict[str, dict[tuple[str, str], tuple[str, str]]]:
    """Kernel name -> {(section, metric): (unit, value)} of a details CSV (its first launch of
    each name; ncu's error lines and rule rows without a metric are skipped)."""
    out: dict[str, dict] = {}
    seen: dict[str, str] = {}
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    if not rows:
        return out
    col = {name: i for i, name in enumerate(rows[0])}
    for r in rows[1:]:
        if len(r) <= col["Metric Value"] or not r[col["Metric Name"]]:
            continue
        name, launch = r[col["Kernel Name"]], r[col["ID"]]
        if seen.setdefault(name, launch) != launch:
            continue
        key = (r[col["Section Name"]], r[col["Metric Name"]])
        out.setdefault(name, {})[key] = (r[col["Metric Unit"]], r[col["Metric Value"]])
    return out


def longest(found: dict[str, dict]) -> tuple[str, dict]:
    """The kernel with the most elapsed cycles."""
    def cycles(metrics: dict) -> float:
        for (_, metric), (_, value) in metrics.items():
            if metric == "Elapsed Cycles":
                return number(value) or 0.0
        return 0.0
    if not found:
        raise ValueError("no kernel in the report")
    name = max(found, key=lambda k: cycles(found[k]))
    return name, found[name]


def table(reports: dict[str, dict]) -> list[str]:
    """Markdown rows: the metrics every report has, in the first report's order."""
    labels = list(reports)
    first = reports[labels[0]]
    shared = [k for k in first if all(k in reports[label] for label in labels[1:])]
    lines = ["| section | metric | unit | " + " | ".join(labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    for key in shared:
        unit = first[key][0]
        values = [reports[label][key][1] for label in labels]
        lines.append(f"| {key[0]} | {key[1]} | {unit} | " + " | ".join(values) + " |")
    only = sorted({k for label in labels for k in reports[label]} - set(shared))
    if only:
        lines.append("")
        lines.append("Not in every report: " + "; ".join(f"{s} / {m}" for s, m in only))
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="LABEL=FILE")
    args = ap.parse_args(argv)
    reports = {}
    for item in args.reports:
        label, sep, path = item.partition("=")
        if not sep:
            ap.error(f"reports: expected LABEL=FILE, got {item!r}")
        name, metrics = longest(kernels(Path(path)))
        print(f"{label}: {name}", file=sys.stderr)
        reports[label] = metrics
    print("\n".join(table(reports)))


if __name__ == "__main__":
    main()
