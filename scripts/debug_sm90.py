"""Run the Hopper backward once on a small problem next to the mma backward and report where
they differ; meant to run under compute-sanitizer while the kernel is being brought up.

PYTHONPATH=. python3 scripts/debug_sm90.py [--regs 24 240] [--seqlen 128] [--causal]
"""
from __future__ import annotations

import argparse
import math

import torch

from dashgen import runtime


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--regs", type=int, nargs=2, default=[24, 240])
    parser.add_argument("--seqlen", type=int, default=128)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    runtime.SM90_REGISTERS = tuple(args.regs)
    torch.manual_seed(0)
    s, h, d = args.seqlen, args.heads, 128
    q, k, v, do = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1 / math.sqrt(d)
    o, lse = runtime.forward(q, k, v, causal=args.causal, softmax_scale=scale)
    ref = runtime.backward(do, q, k, v, o, lse, causal=args.causal, softmax_scale=scale,
                           deterministic=True, schedule="fa3", num_workers=args.workers,
                           kernel="mma")
    torch.cuda.synchronize()
    out = runtime.backward(do, q, k, v, o, lse, causal=args.causal, softmax_scale=scale,
                           deterministic=True, schedule="fa3", num_workers=args.workers,
                           kernel="sm90")
    torch.cuda.synchronize()
    for name, x, r in zip(("dq", "dk", "dv"), out, ref):
        err = ((x.float() - r.float()).norm() / r.float().norm()).item()
        print(f"{name}: rel diff to mma kernel {err:.3e}; nan {x.isnan().sum().item()}")
        # Localize: error per (64-row block, 64-column block) of the first head.
        x0, r0 = x[0, :, 0].float(), r[0, :, 0].float()
        cells = []
        for rb in range(0, x0.shape[0], 64):
            row = []
            for cb in range(0, x0.shape[1], 64):
                a, b = x0[rb:rb + 64, cb:cb + 64], r0[rb:rb + 64, cb:cb + 64]
                row.append(f"{((a - b).norm() / b.norm().clamp_min(1e-9)).item():.2e}")
            cells.append(" ".join(row))
        print("  per 64x64 block: " + " | ".join(cells))
        print(f"  ratio x/ref (median over elements): {(x0 / r0).median().item():.4f}")


if __name__ == "__main__":
    main()
