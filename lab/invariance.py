"""Bits fixed by the tiles, on the GPU: one sequence's dq/dk/dv equal bitwise alone and inside
batches of 1-16 sequences at every position, and across worker counts from each schedule's
minimum to the SM count; every named schedule, both masks. Prints a table, writes JSON.

python3 lab/invariance.py --out DIR [--quick]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dashgen  # noqa: E402
from dashgen.runtime.select import problem_for  # noqa: E402
from dashgen.schedule.builders import BUILDERS, unsupported_reason  # noqa: E402


def grads(q, k, v, do, causal, schedule, workers):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = dashgen.attention(q, k, v, causal=causal, deterministic=True, schedule=schedule,
                          num_workers=workers)
    return torch.autograd.grad(o, (q, k, v), do)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = []
    cases = [(64, 8, 2, 1000), (128, 4, 4, 777)]  # head_dim, heads_q, heads_kv, seqlen
    for head_dim, hq, hkv, seqlen in cases:
        one = lambda s, h: torch.randn(1, s, h, head_dim, device="cuda", dtype=torch.bfloat16,
                                       generator=gen)
        q, k, v, do = one(seqlen, hq), one(seqlen, hkv), one(seqlen, hkv), one(seqlen, hq)
        for causal in (False, True):
            problem = problem_for(1, hq, hkv, seqlen, seqlen, head_dim, causal)
            for name, policy in BUILDERS.items():
                if unsupported_reason(name, problem) is not None:
                    continue
                start = time.time()
                ref = grads(q, k, v, do, causal, name, sms)
                lo = policy.min_workers(problem)
                counts = range(lo, sms + 1) if not args.quick else sorted({lo, lo + 1, 7, 64, 128, sms} & set(range(lo, sms + 1)))
                worker_ok = all(all(torch.equal(a, b) for a, b in
                                    zip(ref, grads(q, k, v, do, causal, name, w))) for w in counts)
                batch_ok = True
                for size in (1, 2, 3, 5, 8, 16) if not args.quick else (2, 5, 16):
                    for pos in range(size):
                        big = [torch.randn(size, seqlen, t.shape[2], head_dim, device="cuda",
                                           dtype=torch.bfloat16, generator=gen) for t in (q, k, v, do)]
                        for b, t in zip(big, (q, k, v, do)):
                            b[pos] = t[0]
                        g = grads(*big, causal, name, sms)
                        batch_ok &= all(torch.equal(a[0], b[pos]) for a, b in zip(ref, g))
                rows.append(dict(head_dim=head_dim, heads=f"{hq}/{hkv}", seqlen=seqlen,
                                 mask="causal" if causal else "full", schedule=name,
                                 workers=f"{lo}..{sms}", worker_counts=len(list(counts)),
                                 across_workers=bool(worker_ok), in_batches=bool(batch_ok),
                                 seconds=round(time.time() - start, 1)))
                print(rows[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "invariance.json").write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), rows=rows), indent=1))
    print(f"{'hd':>3} {'heads':>5} {'seq':>5} {'mask':>6} {'schedule':>16} {'workers':>9} "
          f"{'W-equal':>7} {'B-equal':>7}")
    for r in rows:
        print(f"{r['head_dim']:>3} {r['heads']:>5} {r['seqlen']:>5} {r['mask']:>6} "
              f"{r['schedule']:>16} {r['workers']:>9} {str(r['across_workers']):>7} "
              f"{str(r['in_batches']):>7}")
    sys.exit(0 if all(r["across_workers"] and r["in_batches"] for r in rows) else 1)


if __name__ == "__main__":
    main()
