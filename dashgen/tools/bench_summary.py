"""The benchmark's rows held against the speed targets: per configuration, dashgen's
deterministic backward with schedule="auto" against the best schedule measured, the FA3
deterministic anchor, FlexAttention and SDPA flash (deterministic); the price of determinism;
the forward against SDPA flash's forward; the backward's extra memory against its floor.

Pure functions of the rows bench.json holds, so the summary can be recomputed from a committed
run and is tested without a GPU.
"""
from __future__ import annotations

import math
import statistics

# The targets, as fractions.
FA3_GEOMEAN = 0.9      # geometric mean of auto / FA3_det over the configurations
FA3_WORST = 0.8        # no configuration below this fraction of FA3_det
PRICE_MAX = 0.10       # 1 - det / nondet, same schedule, at seqlen >= PRICE_FROM
PRICE_FROM = 2048
AUTO_WITHIN = 0.03     # auto within this fraction of the best schedule measured
MEMORY_WITHIN = 0.10   # extra memory within this fraction above the floor


def _index(rows: list[dict]) -> dict:
    return {(r["label"], r["head_dim"], r["mask"], r["seqlen"]): r for r in rows
            if r.get("tflops")}


def configurations(rows: list[dict]) -> list[tuple[int, str, int]]:
    return sorted({(r["head_dim"], r["mask"], r["seqlen"]) for r in rows},
                  key=lambda c: (c[0], c[1] != "full", c[2]))


def summarize(rows: list[dict], anchors: dict) -> list[dict]:
    """One dict per configuration with the auto row: the figures the targets compare (None
    where a row is missing). `anchors` maps (head_dim, mask) to {name: {seqlen: TFLOP/s}}."""
    cell = _index(rows)
    out = []
    for head_dim, mask, seqlen in configurations(rows):
        def tf(label):
            row = cell.get((label, head_dim, mask, seqlen))
            return row["tflops"] if row else None
        auto = tf("dashgen_det auto")
        if auto is None:
            continue
        det = {r["schedule"]: r for r in rows if r["impl"] == "dashgen" and r["deterministic"]
               and r["direction"] == "backward" and r["schedule"] not in (None, "auto")
               and (r["head_dim"], r["mask"], r["seqlen"]) == (head_dim, mask, seqlen)
               and r.get("tflops")}
        best_schedule = max(det, key=lambda s: det[s]["tflops"]) if det else None
        best = det[best_schedule]["tflops"] if det else None
        nondet = tf(f"dashgen_nondet {best_schedule}") if best_schedule else None
        fa3 = anchors.get((head_dim, mask), {}).get("FA3_det", {}).get(seqlen)
        auto_row = cell[("dashgen_det auto", head_dim, mask, seqlen)]
        picked = auto_row.get("picked")
        extra, floor = auto_row.get("extra_bytes"), auto_row.get("floor_bytes")
        out.append(dict(
            head_dim=head_dim, mask=mask, seqlen=seqlen, auto=auto, best=best,
            best_schedule=best_schedule, fa3=fa3, picked=picked,
            pick=det[picked]["tflops"] if picked in det else None,
            flex=tf("flex (det)"), flash_det=tf("sdpa_flash_det (FA2)"),
            forward=tf("dashgen forward"), sdpa_forward=tf("sdpa_flash forward"),
            cudnn_forward=tf("sdpa_cudnn forward"),
            price=None if not (best and nondet) else 1 - best / nondet,
            memory=None if not (extra and floor) else extra / floor))
    return out


def _ratio(a, b):
    return None if a is None or b is None else a / b


def verdicts(summary: list[dict]) -> list[tuple[str, str]]:
    """(target, result) lines: how many configurations meet each target, and the worst case."""
    def count(name, ok, values):
        known = [v for v in values if v is not None]
        return (name, f"{sum(ok(v) for v in known)} of {len(known)} configurations")
    fa3 = [_ratio(s["auto"], s["fa3"]) for s in summary]
    known = [r for r in fa3 if r is not None]
    geomean = math.exp(sum(map(math.log, known)) / len(known)) if known else None
    prices = [s["price"] for s in summary if s["seqlen"] >= PRICE_FROM]
    lines = [
        count("auto faster than FlexAttention", lambda r: r > 1,
              [_ratio(s["auto"], s["flex"]) for s in summary]),
        count("auto faster than SDPA flash deterministic", lambda r: r > 1,
              [_ratio(s["auto"], s["flash_det"]) for s in summary]),
        ("auto / FA3_det anchor", "no anchors" if geomean is None else
         f"geometric mean {geomean:.2f} (target {FA3_GEOMEAN}), worst {min(known):.2f} "
         f"(target {FA3_WORST})"),
        count(f"price of determinism <= {PRICE_MAX:.0%} at seqlen >= {PRICE_FROM}",
              lambda p: p <= PRICE_MAX, prices),
        count("forward >= SDPA flash forward", lambda r: r >= 1,
              [_ratio(s["forward"], s["sdpa_forward"]) for s in summary]),
        count("forward >= SDPA cuDNN forward", lambda r: r >= 1,
              [_ratio(s["forward"], s["cudnn_forward"]) for s in summary]),
        count(f"extra memory within {MEMORY_WITHIN:.0%} of the floor",
              lambda m: m <= 1 + MEMORY_WITHIN, [s["memory"] for s in summary]),
        count(f"auto within {AUTO_WITHIN:.0%} of the best schedule", lambda r: r >= 1 - AUTO_WITHIN,
              [_ratio(s["auto"], s["best"]) for s in summary]),
    ]
    if any(s.get("picked") for s in summary):
        # The rule's choice, judged by its schedule's own row (the same kernel and schedule as
        # the auto row, timed separately: the auto row's ratio above carries both rows' noise).
        lines.append(count(f"auto's pick (its schedule's own row) within {AUTO_WITHIN:.0%} of "
                           f"the best schedule", lambda r: r >= 1 - AUTO_WITHIN,
                           [_ratio(s.get("pick"), s["best"]) for s in summary]))
        lines.append(noise(summary))
    return lines


def block_spread(rows: list[dict]) -> tuple[str, str] | None:
    """Not a target: how far one row's figure moves between its rounds, over every backward
    row that kept its timed calls (bench.json of runs before carry none): the spread of the
    row's round medians, max / min - 1. A gap between two rows smaller than this is noise."""
    spreads = []
    for r in rows:
        rounds = [b for b in r.get("times") or [] if b]
        if r.get("direction") == "backward" and len(rounds) > 1:
            medians = [statistics.median(b) for b in rounds]
            spreads.append((max(medians) / min(medians) - 1, r))
    if not spreads:
        return None
    worst, at = max(spreads, key=lambda s: s[0])
    return ("block spread (a backward row's round medians, max / min - 1)",
            f"median {statistics.median(s for s, _ in spreads):.1%}, worst {worst:.1%} "
            f"({at['label']}, d{at['head_dim']} {at['mask']} {at['seqlen']})")


def noise(summary: list[dict]) -> tuple[str, str]:
    """Not a target: how far apart the auto row and its pick's own row measured. They run the
    same kernel with the same schedule, timed at different moments of the configuration, so
    their gap is the run's timing noise, the yardstick for the margins above."""
    gaps = sorted(((abs(s["auto"] / s["pick"] - 1), s) for s in summary if s.get("pick")),
                  key=lambda gap: gap[0])
    name = "timing noise (the auto row against its pick's own row, the same kernel)"
    if not gaps:
        return name, "no pairs"
    worst, at = gaps[-1]
    return name, (f"median {statistics.median(g for g, _ in gaps):.1%}, worst {worst:.1%} "
                  f"(d{at['head_dim']} {at['mask']} {at['seqlen']})")


def render(summary: list[dict], rows: list[dict] | None = None) -> str:
    """The markdown section bench.md ends with (`rows`: bench.json's, for the block spread)."""
    if not summary:
        return ""
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)
    lines = ["## Against the targets", "",
             "TFLOP/s; auto = dashgen_det auto; price = 1 - det/nondet of the best "
             "deterministic schedule; memory = extra / floor.", "",
             "| config | auto | best (schedule) | auto/best | auto/FA3 | flex | FA2 det | "
             "fwd / SDPA flash fwd / cuDNN fwd | price | memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(
            f"| d{s['head_dim']} {s['mask']} {s['seqlen']} | {f(s['auto'])} | {f(s['best'])} "
            f"({s['best_schedule'] or '-'}) | {f(_ratio(s['auto'], s['best']), '.3f')} | "
            f"{f(_ratio(s['auto'], s['fa3']), '.2f')} | {f(s['flex'])} | {f(s['flash_det'])} | "
            f"{f(s['forward'])} / {f(s['sdpa_forward'])} / {f(s['cudnn_forward'])} | "
            f"{'-' if s['price'] is None else format(s['price'], '.1%')} | "
            f"{f(s['memory'], '.3f')} |")
    found = verdicts(summary) + [line for line in [block_spread(rows or [])] if line]
    lines += [""] + [f"- {name}: {result}" for name, result in found] + [""]
    return "\n".join(lines)
