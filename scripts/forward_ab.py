"""The Hopper forward on persistent CTAs against one CTA a query tile (runtime.SM90_FWD_PERSISTENT),
alternated in one process on the ANCHORS.md shapes: TFLOP/s of each (median of blocks), whether
their outputs are bitwise equal, and o / lse against a float64 reference at the 1k shapes.

PYTHONPATH=. python3 scripts/forward_ab.py [--hdims 64 128] [--seqlens 1024 ...]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import runtime  # noqa: E402
from dashgen.bench import median_ms  # noqa: E402


def reference(q, k, v, causal, scale):
    """o and lse in float64, (batch, seqlen, heads, d) layout."""
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ vd).transpose(1, 2), lse


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    parser.add_argument("--blocks", type=int, default=6)
    args = parser.parse_args()
    print(f"{'config':<22} {'one a tile':>10} {'persistent':>10} {'ratio':>6} {'same bits':>9} "
          f"{'o err':>8} {'lse err':>8}")
    for d in args.hdims:
        for causal in (False, True):
            for s in args.seqlens:
                heads, batch = 2048 // d, 16384 // s
                q, k, v = (torch.randn(batch, s, heads, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                scale = 1 / math.sqrt(d)
                outs, times = {}, {True: [], False: []}
                for block in range(args.blocks):
                    for mode in ((True, False) if block % 2 else (False, True)):
                        runtime.SM90_FWD_PERSISTENT = mode
                        fn = lambda: runtime.forward(q, k, v, causal=causal, softmax_scale=scale)
                        outs[mode] = fn()
                        times[mode].append(median_ms(fn, 3, 5))
                runtime.SM90_FWD_PERSISTENT = None
                flops = 4 * batch * heads * s * s * d / (2 if causal else 1)
                tf = {mode: flops / statistics.median(t) / 1e9 for mode, t in times.items()}
                same = all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))
                errs = ""
                if s <= 1024:
                    ro, rl = reference(q[:2], k[:2], v[:2], causal, scale)
                    o, lse = outs[True]
                    oe = ((o[:2].double() - ro).norm() / ro.norm()).item()
                    le = (lse[:2].double() - rl).abs().max().item()
                    errs = f"{oe:>8.1e} {le:>8.1e}"
                tag = f"d{d} {'causal' if causal else 'full'} {s}"
                print(f"{tag:<22} {tf[False]:>10.1f} {tf[True]:>10.1f} "
                      f"{tf[True] / tf[False]:>6.3f} {same!s:>9} {errs}", flush=True)


if __name__ == "__main__":
    main()
