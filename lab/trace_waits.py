"""Where an ordered backward waits: one traced deterministic backward (the dQ writer's ready,
acquired and landed stamps per task) summarized by lab/handoffs.py, beside the untraced
deterministic and non-deterministic times of the same call. Any head_dim and mask; the
schedule is the one dashgen.attention's plan resolves ("auto" by default), on its workers.

PYTHONPATH=. python3 lab/trace_waits.py --head-dim 256 --mask full --seqlen 16384 --out F.json
PYTHONPATH=. python3 lab/trace_waits.py --head-dim 128 --mask causal --seqlen 262144 --out F.json

Batch and heads follow the benchmark's shapes: 16,384 tokens a batch (one sequence past it),
hidden 2048 (--heads to change). Times: CUDA events, median of the last 2 of 3 calls.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.forward import forward  # noqa: E402
from dashgen.runtime.plans import trace_offsets  # noqa: E402
from dashgen.runtime.select import Overrides, selection  # noqa: E402
from handoffs import handoffs, summarize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mask", choices=["full", "causal"], default="causal")
    ap.add_argument("--seqlen", type=int, default=262144)
    ap.add_argument("--heads", type=int, default=None, help="default: 2048 / head_dim")
    ap.add_argument("--schedule", default="auto")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    d, causal = args.head_dim, args.mask == "causal"
    heads = args.heads or 2048 // d
    batch = max(1, 16384 // args.seqlen)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(batch, args.seqlen, heads, d, device="cuda",
                               dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = 1 / math.sqrt(d)
    o, lse = forward(q, k, v, causal=causal, softmax_scale=scale)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sel = selection(tuple(q.shape), tuple(k.shape), "bf16", causal, True, True, args.schedule,
                    None, sms, Overrides())
    res = {"gpu": torch.cuda.get_device_name(), "head_dim": d, "mask": args.mask,
           "seqlen": args.seqlen, "batch": batch, "heads": heads, "schedule": sel.schedule,
           "workers": sel.num_workers, "kernel": sel.backward.kernel_name}

    def timed(**kw):
        times, grads = [], None
        for _ in range(3):
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            grads = backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale, **kw)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times[1:]), grads

    for name, kw in (("det", dict(deterministic=True, schedule=args.schedule, num_workers=None)),
                     ("nondet", dict(deterministic=False, schedule=args.schedule,
                                     num_workers=None)),
                     ("det_traced", dict(deterministic=True, schedule=sel.schedule,
                                         num_workers=sel.num_workers, trace=True))):
        ms, grads = timed(**kw)
        res[name + "_ms"] = ms
        print(name, f"{ms:.2f} ms", flush=True)
    offsets = trace_offsets(sel.problem, sel.schedule, sel.num_workers)
    res["summary"] = summarize(handoffs(grads[3], offsets)).as_dict()
    Path(args.out).write_text(json.dumps(res, indent=1))
    for key, value in res.items():
        print(key, value)


if __name__ == "__main__":
    main()
