"""Long causal rows through dashgen.attention: the backward of one sequence (hidden 2048, bf16)
per (mode, schedule) combination, each the median of 3 calls after one, combinations in the
order given (repeat one to alternate). A tree is imported from --tree, so two checkouts can be
timed in one call, one process each.

python3 lab/long_schedules.py --tree . --rows d64:131072 d128:262144 \\
    --combos det:auto nondet:auto det:auto nondet:auto --out rows.json
--patch-dqlast64: dq_last allowed at head_dim 64 in this process (how dq_last at 64 was timed
before DQ_LAST_HEAD_DIMS held 64; docs/bench/2026-12-06-long/dq-last-64).
"""
import argparse
import json
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--tree", required=True)
ap.add_argument("--rows", nargs="+", required=True, help="dHEADDIM:SEQLEN, e.g. d64:131072")
ap.add_argument("--combos", nargs="+", required=True, help="det|nondet:SCHEDULE, e.g. det:auto")
ap.add_argument("--patch-dqlast64", action="store_true")
ap.add_argument("--out", required=True)
a = ap.parse_args()
sys.path.insert(0, a.tree)
import torch  # noqa: E402
import dashgen  # noqa: E402
if a.patch_dqlast64:
    import dashgen.codegen.variants as variants
    import dashgen.runtime.select as select
    variants.DQ_LAST_HEAD_DIMS = select.DQ_LAST_HEAD_DIMS = (64, 128)
res = []
for row in a.rows:
    d, seqlen = row.split(":")
    d, seqlen = int(d[1:]), int(seqlen)
    heads = 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                           generator=g).requires_grad_() for _ in range(3))
    do = torch.randn(1, seqlen, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
    flops = 2.5 * 4 * seqlen * seqlen * d * heads / 2
    for combo in a.combos:
        mode, schedule = combo.split(":")
        try:
            o = dashgen.attention(q, k, v, causal=True, deterministic=mode == "det",
                                  schedule=schedule)
        except Exception as exc:  # a schedule that cannot serve the row: say so, go on
            print(row, combo, "refused:", exc)
            continue
        times = []
        for _ in range(4):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        ms = statistics.median(times[1:])
        res.append(dict(row=row, combo=combo, dqlast64=a.patch_dqlast64, ms=ms, all=times,
                        tflops=flops / ms / 1e9))
        print(f"{row:>10} {combo:<18} {'dqlast64' if a.patch_dqlast64 else '':<8} {ms:9.1f} ms "
              f"{res[-1]['tflops']:6.1f} TF/s", flush=True)
        del grads, o
json.dump(res, open(a.out, "w"), indent=1)
