"""Sliding-window backward and forward times against the causal mask's, one call: dashgen's
window kernels (deterministic: spt on the listed deal; unordered: spt) beside the causal mask at
the same shapes. FLOPs count the kept (query, key) pairs only (4 * head_dim a pair forward, 10 *
head_dim backward, FlashAttention's convention), so a window's TFLOP/s compare with causal's.
CUDA events, median of --repeats after a warm-up; a JSON line per row and a table last.

Each row also gets its byte ceiling: the TFLOP/s a backward could reach if it moved only the
bytes no kernel avoids (q, k, v, o, dO read, dq, dk, dv written, 16-bit each) at the bandwidth a
device-to-device copy reaches in the same call. A narrow window's pairs are few against those
bytes, so its rate is bounded by memory well below the causal mask's (the ceiling column).

PYTHONPATH=. python3 lab/window_timing.py [--seqlens 8192,16384] [--windows 4095,1023]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import dashgen  # noqa: E402
from dashgen.tools.bench import window_pairs  # noqa: E402  (the pairs a window keeps)
from dashgen.tools.timing import median_ms  # noqa: E402  (the protocol's CUDA-event median)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="8192,16384")
    parser.add_argument("--windows", default="4095,1023,127", help="left bounds (right 0)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--early-kv", choices=["on", "off"], default=None,
                        help="replace select's early-K/V policy for every row (default: it decides)")
    args = parser.parse_args()
    if args.early_kv is not None:
        # A lab switch: the policy function itself, so that dashgen.attention's own plan takes it.
        import dashgen.runtime.select as select
        select.early_kv_pays = lambda problem, on=args.early_kv == "on": on
    heads = args.hidden // args.head_dim
    copy_gbs = copy_bandwidth_gbs()
    print(json.dumps({"copy_GBps": round(copy_gbs, 1)}), flush=True)
    rows = []
    for seqlen in map(int, args.seqlens.split(",")):
        batch = max(1, 16384 // seqlen)
        q, k, v, do = (torch.randn(batch, seqlen, heads, args.head_dim, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(4))
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        for left in [None, *map(int, args.windows.split(","))]:
            window = (-1, -1) if left is None else (left, 0)
            pairs = batch * heads * window_pairs(seqlen, left, 0)
            for det in (True, False):
                kw = dict(causal=True, window_size=window, deterministic=det)
                o = dashgen.attention(q, k, v, **kw)
                bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), do,
                                                            retain_graph=True), 1, args.repeats)
                with torch.no_grad():
                    fwd = median_ms(lambda: dashgen.attention(q, k, v, **kw), 1, args.repeats)
                row = dict(gpu=torch.cuda.get_device_name(), seqlen=seqlen, batch=batch,
                           heads=heads, head_dim=args.head_dim,
                           mask="causal" if left is None else f"window:{left},0",
                           deterministic=det, bwd_ms=bwd, fwd_ms=fwd,
                           bwd_tflops=pairs * 10 * args.head_dim / bwd / 1e9,
                           bwd_ceiling_tflops=pairs * 10 * args.head_dim / (
                               8 * q.numel() * q.element_size() / copy_gbs / 1e6) / 1e9,
                           fwd_tflops=pairs * 4 * args.head_dim / fwd / 1e9)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s")
    print("| seqlen | mask | det | bwd ms | bwd TFLOP/s | byte ceiling | fwd ms | fwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seqlen']} | {r['mask']} | {r['deterministic']} | {r['bwd_ms']:.3f} | "
              f"{r['bwd_tflops']:.1f} | {r['bwd_ceiling_tflops']:.0f} | {r['fwd_ms']:.3f} | "
              f"{r['fwd_tflops']:.1f} |")


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """GB/s (read + write) of one device-to-device copy of nbytes, median of 10."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 2, 10)
    return 2 * nbytes / ms / 1e6


if __name__ == "__main__":
    main()
