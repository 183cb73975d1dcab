"""Two `dashgen bench` runs row by row: every deterministic dashgen backward row (each schedule,
and the auto row, "dashgen_det auto") of OLD against the same row of NEW, old ms / new ms (above
1: NEW is faster), raw and divided by the configuration's SDPA cuDNN backward ratio between the
two runs (the machines' drift, where both runs timed cuDNN). Prints a table, the geometric means
and the rows below --bar.

python3 lab/bench_vs.py OLD/bench.json NEW/bench.json [--bar 0.98] [--out FILE.md]
A run kept in git history: git show REV:docs/bench/RUN/bench.json > /tmp/old.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _rows(path: str) -> dict:
    """(label, head_dim, mask, seqlen) -> backward ms, for rows without an error."""
    data = json.loads(Path(path).read_text())
    out = {}
    for r in data["rows"]:
        if r.get("direction", "backward") != "backward" or r.get("error") or not r.get("ms"):
            continue
        out[r["label"], r["head_dim"], r["mask"], r["seqlen"]] = r["ms"]
    return out


def compare(old: dict, new: dict, bar: float) -> tuple[list[str], dict]:
    lines = ["| row | config | old ms | new ms | old/new | / cuDNN's old/new |", "|---|---|---|---|---|---|"]
    raw, scaled, below, below_scaled = [], [], [], []
    wanted = lambda label: label.startswith("dashgen_det")  # noqa: E731  (each schedule, and auto)
    for key in sorted(k for k in old if k in new and wanted(k[0])):
        label, hd, mask, seqlen = key
        ratio = old[key] / new[key]
        cudnn = ("sdpa_cudnn (nondet)", hd, mask, seqlen)
        drift = old[cudnn] / new[cudnn] if cudnn in old and cudnn in new else None
        adjusted = ratio / drift if drift else None
        raw.append(ratio)
        if adjusted is not None:
            scaled.append(adjusted)
        if ratio < bar:
            below.append(f"{label} d{hd} {mask} {seqlen} ({ratio:.3f})")
        if adjusted is not None and adjusted < bar:
            below_scaled.append(f"{label} d{hd} {mask} {seqlen} ({adjusted:.3f})")
        lines.append(f"| {label} | d{hd} {mask} {seqlen} | {old[key]:.3f} | {new[key]:.3f} | "
                     f"{ratio:.3f} | {adjusted:.3f} |" if adjusted is not None else
                     f"| {label} | d{hd} {mask} {seqlen} | {old[key]:.3f} | {new[key]:.3f} | "
                     f"{ratio:.3f} | - |")
    g = statistics.geometric_mean
    summary = {"rows": len(raw), "geomean": g(raw) if raw else None,
               "geomean_cudnn_scaled": g(scaled) if scaled else None, "below_bar": below,
               "below_bar_scaled": below_scaled}
    return lines, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--bar", type=float, default=0.98, help="flag rows whose old/new is below")
    ap.add_argument("--out")
    args = ap.parse_args()
    lines, s = compare(_rows(args.old), _rows(args.new), args.bar)
    if not s["rows"]:
        raise SystemExit("no deterministic dashgen backward row in both runs")
    tail = [f"\n{s['rows']} rows: old/new geometric mean {s['geomean']:.3f}"
            + (f", {s['geomean_cudnn_scaled']:.3f} divided by cuDNN's"
               if s["geomean_cudnn_scaled"] else ""),
            f"below {args.bar}: {len(s['below_bar'])}"
            + (": " + "; ".join(s["below_bar"]) if s["below_bar"] else ""),
            f"below {args.bar} divided by cuDNN's: {len(s['below_bar_scaled'])}"
            + (": " + "; ".join(s["below_bar_scaled"]) if s["below_bar_scaled"] else "")]
    text = "\n".join(lines + tail)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
