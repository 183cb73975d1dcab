"""A forward's query-tile start in KV steps, fitted from one `dashgen bench` run (bench.json): the
benchmark keeps 16,384 tokens at every length, so each head_dim has the same number of query
tiles at every length, and a query tile's time is F + n s with n the KV tiles of 128 keys it
runs (their mean (L / 128 + 1) / 2 under the causal mask). Its FLOPs as the benchmark counts them
are c full steps (c = n, or L / 256 under the causal mask, whose diagonal tiles count half), so
c / TFLOP/s = F' + n s' is linear in n; the least-squares line over the lengths gives F / s (the
start in KV steps) and c / n / s' at the longest length (the TFLOP/s of the step alone). Per
configuration and forward (dashgen's, SDPA cuDNN's), over all lengths and without the longest
(which the board's power cap can slow): where the 1k-2k forward rows lose, a start longer than
the other kernel's says so while a slower step does not.

python3 scripts/tile_start.py DIR/bench.json [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

BLOCK_N = 128
FORWARDS = ("dashgen forward", "sdpa_cudnn forward")


def kv_tiles(seqlen: int, causal: bool) -> tuple[float, float]:
    """(n, c): a query tile's KV tiles of BLOCK_N keys as run (their mean over the tiles under
    the causal mask) and as the benchmark's FLOP count has them (the causal mask's half)."""
    tiles, counted = -(-seqlen // BLOCK_N), seqlen / BLOCK_N
    return ((tiles + 1) / 2, counted / 2) if causal else (float(tiles), counted)


def fit(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(start in KV steps, TFLOP/s of the step alone) of the line c / tflops = a + b n through
    (n, c, tflops) points by least squares; the step's TFLOP/s is the longest length's c / n / b.
    Raises ValueError for fewer than two lengths."""
    if len({n for n, _, _ in points}) < 2:
        raise ValueError("fit: need at least two lengths")
    xs = [n for n, _, _ in points]
    ys = [c / tf for _, c, tf in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    n, c, _ = max(points)
    return a / b, c / n / b


def table(rows: list[dict]) -> list[str]:
    """The markdown table of every configuration's fits, for the forwards in FORWARDS."""
    series: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        if r.get("direction") != "forward" or r.get("label") not in FORWARDS or not r.get("tflops"):
            continue
        key = (r["head_dim"], r["mask"])
        series.setdefault(key, {}).setdefault(r["label"], []).append((r["seqlen"], r["tflops"]))
    lines = ["| config | forward | start, KV steps (all / without the longest) | step alone, "
             "TFLOP/s (all / without the longest) |", "|---|---|---|---|"]
    for (hd, mask), by_label in sorted(series.items()):
        for label in FORWARDS:
            pts = sorted(by_label.get(label, []))
            if len(pts) < 2:
                continue
            causal = mask == "causal"
            points = [(*kv_tiles(s, causal), tf) for s, tf in pts]
            fits = [fit(points)] + ([fit(points[:-1])] if len(points) > 2 else [])
            starts = " / ".join(f"{f:.2f}" for f, _ in fits)
            steps = " / ".join(f"{t:.0f}" for _, t in fits)
            lines.append(f"| d{hd} {mask} {pts[0][0]}-{pts[-1][0]} | {label} | {starts} | "
                         f"{steps} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    data = json.loads(args.bench.read_text())
    meta = data.get("meta", {})
    head = (f"Query-tile start of the forwards, {meta.get('gpu', '?')}, commit "
            f"{meta.get('commit', '?')}, {meta.get('date', '?')} ({args.bench})")
    text = "\n".join([head, "", *table(data["rows"])])
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
