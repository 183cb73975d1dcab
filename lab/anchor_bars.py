"""The speed bars against the anchors, per configuration, from one run of the anchor kit
(anchors.json: FA3, the DASH fork, dashgen and SDPA cuDNN timed together) and, for the forward,
one `dashgen bench` run (bench.json). FA4 is not in the kit: its figures come from
docs/bench/anchors_fa4_2026-12-01.json (ANCHORS.md), scaled per configuration by this run's SDPA
cuDNN backward against the one recorded there when the two differ by more than 3%.

- det: dashgen's deterministic backward / the best correct deterministic anchor (FA3_det, DASH_det
  where its gradient norms are within 1% of SDPA's, FA4_det): >= 1 in every configuration;
- nondet: dashgen's deterministic backward / the best non-deterministic backward (FA3, DASH where
  correct, SDPA cuDNN, FA4): geometric mean >= 0.95, none below 0.88;
- forward: dashgen's forward / SDPA cuDNN's forward of the same bench run: >= 1 everywhere;
  against FA4's recorded forward for reference;
- price of determinism: 1 - dashgen's deterministic / its non-deterministic backward, both of
  the kit: <= 3% at seqlen >= 2048;
- memory: the backward's extra memory / its floor, of the bench run's auto row: within 10%.

python3 lab/anchor_bars.py --anchors DIR/anchors.json [--bench DIR/bench.json] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "docs/bench/anchors_fa4_2026-12-01.json"
WRONG = 1e-2  # the kit's threshold: a gradient norm this far from SDPA cuDNN's is wrong
DRIFT = 0.03  # scale FA4's recorded figures when this run's cuDNN moved more than this
DET_BAR, GEOMEAN_BAR, WORST_BAR, FORWARD_BAR = 1.0, 0.95, 0.88, 1.0
PRICE_BAR, PRICE_FROM, MEMORY_BAR = 0.03, 2048, 1.10


def _kit(rows: list[dict]) -> dict:
    """(impl, mode, hdim, causal, seqlen) -> row of the kit's anchors.json."""
    return {(r["impl"], r["mode"], r["hdim"], r["causal"], r["seqlen"]): r for r in rows
            if r.get("bwd_tflops")}


def _reference(data: dict) -> dict:
    """(impl, mode, direction, hdim, causal, seqlen) -> TFLOP/s recorded in ANCHORS.md."""
    out = {}
    for r in data["rows"]:
        for seqlen, value in zip(data["seqlens"], r["tflops"]):
            out[r["impl"], r["mode"], r["direction"], r["hdim"], r["causal"], seqlen] = value
    return out


def _forwards(bench: dict | None) -> dict:
    """(impl, hdim, causal, seqlen) -> forward TFLOP/s of a `dashgen bench` run."""
    if bench is None:
        return {}
    return {(r["impl"], r["head_dim"], r["mask"] == "causal", r["seqlen"]): r["tflops"]
            for r in bench["rows"] if r["direction"] == "forward" and r.get("tflops")}


def _memory(bench: dict | None) -> dict:
    """(hdim, causal, seqlen) -> extra bytes / floor bytes of a bench run's auto backward."""
    if bench is None:
        return {}
    return {(r["head_dim"], r["mask"] == "causal", r["seqlen"]): r["extra_bytes"] / r["floor_bytes"]
            for r in bench["rows"] if r["impl"] == "dashgen_auto" and r["direction"] == "backward"
            and r.get("extra_bytes") and r.get("floor_bytes")}


def _best(candidates: dict) -> tuple[str | None, float | None]:
    known = {k: v for k, v in candidates.items() if v}
    if not known:
        return None, None
    name = max(known, key=known.get)
    return name, known[name]


def bars(kit_rows: list[dict], reference: dict, bench: dict | None = None) -> list[dict]:
    """One dict per configuration the kit measured dashgen's deterministic backward in."""
    kit, ref, fwd, memory = _kit(kit_rows), _reference(reference), _forwards(bench), _memory(bench)
    out = []
    for (impl, mode, hdim, causal, seqlen), row in sorted(kit.items(),
                                                         key=lambda kv: kv[0][2:]):
        if (impl, mode) != ("dashgen", "det"):
            continue

        def tf(name, how):
            r = kit.get((name, how, hdim, causal, seqlen))
            if r is None or (name == "dash" and r.get("norm_rel_dev_vs_sdpa", 0) > WRONG):
                return None
            return r["bwd_tflops"]
        cudnn = tf("sdpa_cudnn", "nondet")
        cudnn_ref = ref.get(("sdpa_cudnn", "nondet", "backward", hdim, causal, seqlen))
        scale = 1.0
        if cudnn and cudnn_ref and abs(cudnn / cudnn_ref - 1) > DRIFT:
            scale = cudnn / cudnn_ref
        fa4 = {m: ref.get(("FA4", m, "backward", hdim, causal, seqlen)) for m in ("det", "nondet")}
        det_name, det = _best({"FA3_det": tf("fa3", "det"), "DASH_det": tf("dash", "det"),
                               "FA4_det": fa4["det"] and fa4["det"] * scale})
        nondet_name, nondet = _best({"FA3_nondet": tf("fa3", "nondet"),
                                     "DASH_nondet": tf("dash", "nondet"), "sdpa_cudnn": cudnn,
                                     "FA4_nondet": fa4["nondet"] and fa4["nondet"] * scale})
        ours = row["bwd_tflops"]
        ours_nondet = tf("dashgen", "nondet")
        forward = fwd.get(("dashgen", hdim, causal, seqlen))
        cudnn_fwd = fwd.get(("sdpa_cudnn", hdim, causal, seqlen))
        fa4_fwd = ref.get(("FA4", None, "forward", hdim, causal, seqlen))
        out.append(dict(
            hdim=hdim, causal=causal, seqlen=seqlen, dashgen_det=ours, fa4_scale=scale,
            best_det=det_name, det=ours / det if det else None,
            best_nondet=nondet_name, nondet=ours / nondet if nondet else None,
            forward=forward, forward_vs_cudnn=forward / cudnn_fwd if forward and cudnn_fwd
            else None, forward_vs_fa4=forward / fa4_fwd if forward and fa4_fwd else None,
            price=1 - ours / ours_nondet if ours_nondet else None,
            memory=memory.get((hdim, causal, seqlen))))
    return out


def verdicts(rows: list[dict]) -> list[str]:
    def count(key, bar):
        known = [r[key] for r in rows if r[key] is not None]
        return sum(v >= bar for v in known), len(known)
    lines = []
    met, n = count("det", DET_BAR)
    lines.append(f"det / best deterministic anchor >= {DET_BAR}: {met} of {n} configurations")
    known = [r["nondet"] for r in rows if r["nondet"] is not None]
    if known:
        geomean = math.exp(sum(map(math.log, known)) / len(known))
        lines.append(f"det / best non-deterministic: geometric mean {geomean:.3f} (bar "
                     f"{GEOMEAN_BAR}), worst {min(known):.3f} (bar {WORST_BAR})")
    met, n = count("forward_vs_cudnn", FORWARD_BAR)
    lines.append(f"forward / SDPA cuDNN forward >= {FORWARD_BAR}: {met} of {n} configurations")
    prices = [r for r in rows if r["price"] is not None and r["seqlen"] >= PRICE_FROM]
    if prices:
        worst = max(prices, key=lambda r: r["price"])
        lines.append(f"price of determinism <= {PRICE_BAR:.0%} at seqlen >= {PRICE_FROM}: "
                     f"{sum(r['price'] <= PRICE_BAR for r in prices)} of {len(prices)} "
                     f"configurations (highest {worst['price']:.1%}, d{worst['hdim']} "
                     f"{'causal' if worst['causal'] else 'full'} {worst['seqlen']})")
    memory = [r["memory"] for r in rows if r["memory"] is not None]
    if memory:
        lines.append(f"memory / floor <= {MEMORY_BAR}: {sum(m <= MEMORY_BAR for m in memory)} of "
                     f"{len(memory)} configurations (highest {max(memory):.3f})")
    return lines


def render(rows: list[dict]) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)
    lines = ["| config | dashgen det TFLOP/s | / best det (which) | / best non-det (which) | "
             "forward TFLOP/s | fwd / cuDNN | fwd / FA4 | FA4 scale | price | memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| d{r['hdim']} {'causal' if r['causal'] else 'full'} {r['seqlen']} | "
                     f"{r['dashgen_det']:.1f} | {f(r['det'])} ({r['best_det']}) | "
                     f"{f(r['nondet'])} ({r['best_nondet']}) | {f(r['forward'], '.1f')} | "
                     f"{f(r['forward_vs_cudnn'])} | {f(r['forward_vs_fa4'])} | "
                     f"{r['fa4_scale']:.3f} | {f(r['price'], '.1%')} | {f(r['memory'])} |")
    return "\n".join(lines + [""] + [f"- {line}" for line in verdicts(rows)]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", type=Path, required=True, help="the kit's anchors.json")
    ap.add_argument("--bench", type=Path, help="a `dashgen bench` bench.json (the forward)")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    bench = json.loads(args.bench.read_text()) if args.bench else None
    text = render(bars(json.loads(args.anchors.read_text()),
                       json.loads(args.reference.read_text()), bench))
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
