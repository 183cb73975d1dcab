"""q/k 192 with v 128 (MLA): dashgen's deterministic and unordered backward and its forward
beside the same call with v zero-padded to 192 (what a kernel without the pair runs, FA3's way)
and SDPA cuDNN's (v 128 as given; a cell it refuses is left empty). FLOPs are those of the
pair: forward 2 (d + dv) a kept (query, key) pair, backward 2 (3 d + 2 dv), so the padded
call's TFLOP/s count the same work. CUDA events, median of --repeats after a warm-up; a JSON
line per row and a table last.

PYTHONPATH=. python3 lab/mla_timing.py [--seqlens 4096,16384] [--hidden 2048]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import dashgen  # noqa: E402
from dashgen.tools.timing import median_ms  # noqa: E402  (the protocol's CUDA-event median)

D, DV = 192, 128


def cudnn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=causal).transpose(1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden // 192")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    heads = args.hidden // D
    rows = []
    for seqlen in map(int, args.seqlens.split(",")):
        batch = max(1, 16384 // seqlen)
        torch.manual_seed(0)
        q, k = (torch.randn(batch, seqlen, heads, D, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True) for _ in range(2))
        v = torch.randn(batch, seqlen, heads, DV, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        do = torch.randn(batch, seqlen, heads, DV, device="cuda", dtype=torch.bfloat16)
        v_pad = F.pad(v.detach(), (0, D - DV)).requires_grad_()
        do_pad = F.pad(do, (0, D - DV))
        for causal in (False, True):
            pairs = batch * heads * seqlen * (seqlen + 1) / 2 if causal else \
                batch * heads * seqlen * seqlen
            cells = [("dashgen det", lambda: dashgen.attention(q, k, v, causal=causal,
                                                               deterministic=True), (q, k, v), do),
                     ("dashgen unordered", lambda: dashgen.attention(
                         q, k, v, causal=causal, deterministic=False), (q, k, v), do),
                     ("dashgen det, v padded to 192", lambda: dashgen.attention(
                         q, k, v_pad, causal=causal, deterministic=True), (q, k, v_pad), do_pad),
                     ("sdpa cudnn", lambda: cudnn(q, k, v, causal), (q, k, v), do)]
            for name, fn, leaves, grad in cells:
                row = dict(gpu=torch.cuda.get_device_name(), impl=name, seqlen=seqlen,
                           batch=batch, heads=heads, mask="causal" if causal else "full")
                try:
                    o = fn()
                    bwd = median_ms(lambda: torch.autograd.grad(o, leaves, grad,
                                                                retain_graph=True),
                                    2, args.repeats)
                    with torch.no_grad():
                        fwd = median_ms(fn, 2, args.repeats)
                    row.update(bwd_ms=bwd, fwd_ms=fwd,
                               bwd_tflops=pairs * 2 * (3 * D + 2 * DV) / bwd / 1e9,
                               fwd_tflops=pairs * 2 * (D + DV) / fwd / 1e9)
                except RuntimeError as exc:  # a backend that refuses the shapes
                    row.update(error=str(exc).splitlines()[0][:200])
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("| seqlen | mask | impl | bwd TFLOP/s | fwd TFLOP/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        cell = lambda key: f"{r[key]:.1f}" if key in r else "-"  # noqa: E731
        print(f"| {r['seqlen']} | {r['mask']} | {r['impl']} | {cell('bwd_tflops')} | "
              f"{cell('fwd_tflops')} |")


if __name__ == "__main__":
    main()
