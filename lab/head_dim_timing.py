"""One head_dim timed beside SDPA's cuDNN backend in one process (with --open, one the runtime
does not serve yet: variants.OPENED_HEAD_DIMS): dashgen's backward (deterministic and unordered) and
forward, cuDNN's backward and forward, at the benchmark's 16,384 tokens and hidden 2048, full and
causal. FLOPs as FlashAttention counts them (backward 2.5x the forward's 4 * seqlen^2 * head_dim
per head, halved under the causal mask). CUDA events, median of --repeats after a warm-up; a JSON
line per row and a table last.

PYTHONPATH=. python3 lab/head_dim_timing.py --head-dim 256 [--seqlens 1024,4096,16384]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import dashgen  # noqa: E402
from dashgen.codegen import variants  # noqa: E402
from dashgen.tools.timing import median_ms  # noqa: E402  (the protocol's CUDA-event median)


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=causal).transpose(1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--open", action="store_true", help="serve --head-dim for this run")
    args = parser.parse_args()
    if args.open:
        variants.OPENED_HEAD_DIMS = (args.head_dim,)
    heads = args.hidden // args.head_dim
    rows = []
    for causal in (False, True):
        for seqlen in map(int, args.seqlens.split(",")):
            batch = max(1, args.tokens // seqlen)
            q, k, v, do = (torch.randn(batch, seqlen, heads, args.head_dim, device="cuda",
                                       dtype=torch.bfloat16) for _ in range(4))
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
            flops = 4 * batch * heads * seqlen * seqlen * args.head_dim / (2 if causal else 1)
            calls = {"dashgen_det": lambda: dashgen.attention(q, k, v, causal=causal,
                                                               deterministic=True),
                     "dashgen_nondet": lambda: dashgen.attention(q, k, v, causal=causal,
                                                                  deterministic=False),
                     "cudnn": lambda: cudnn(q, k, v, causal)}
            row = dict(gpu=torch.cuda.get_device_name(), head_dim=args.head_dim, seqlen=seqlen,
                       batch=batch, heads=heads, mask="causal" if causal else "full")
            for name, call in calls.items():
                o = None
                try:
                    o = call()
                    bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), do,
                                                                retain_graph=True),
                                    1, args.repeats)
                    with torch.no_grad():
                        fwd = median_ms(call, 1, args.repeats)
                    row[f"{name}_bwd_tflops"] = 2.5 * flops / bwd / 1e9
                    row[f"{name}_fwd_tflops"] = flops / fwd / 1e9
                except Exception as exc:  # noqa: BLE001 (a backend that refuses: say so)
                    row[f"{name}_error"] = repr(exc)[:200]
                o = None  # freed before the next backend's call
            rows.append(row)
            print(json.dumps(row), flush=True)
    names = ("dashgen_det", "dashgen_nondet", "cudnn")
    print("| mask | seqlen | " + " | ".join(f"{n} bwd" for n in names) + " | "
          + " | ".join(f"{n} fwd" for n in names[::2]) + " |")
    print("|---" * (2 + len(names) + 2) + "|")
    for r in rows:
        cells = [f"{r.get(f'{n}_bwd_tflops', float('nan')):.1f}" for n in names]
        cells += [f"{r.get(f'{n}_fwd_tflops', float('nan')):.1f}" for n in names[::2]]
        print(f"| {r['mask']} | {r['seqlen']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
