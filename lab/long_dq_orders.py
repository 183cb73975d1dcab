"""The ordered long backward with dq_last on and off (runtime.backward with Overrides) beside
the unordered one, d128 and d64 causal at 131k and 262k tokens (hidden 2048), the kernels
alternated, each the median of the calls after the first. A tree is imported from TREE, so two
checkouts can be compared one process each (docs/bench/2026-12-06-long/after-parts).

python3 lab/long_dq_orders.py TREE OUT.json [--without-default] [--repeats 4] [--shapes 128:131072,...]
--without-default: only dq_last and the unordered kernel (the default order is the slowest).
"""
import argparse
import json
import math
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("tree")
ap.add_argument("out")
ap.add_argument("--without-default", action="store_true")
ap.add_argument("--repeats", type=int, default=4)
ap.add_argument("--shapes", default="128:131072,128:262144,64:131072,64:262144",
                help="head_dim:seqlen,... (one sequence each, hidden 2048)")
a = ap.parse_args()
sys.path.insert(0, a.tree)
import torch  # noqa: E402
from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.forward import forward  # noqa: E402
from dashgen.runtime.select import Overrides  # noqa: E402

res = []
for d, seqlen in (map(int, shape.split(":")) for shape in a.shapes.split(",")):
    heads = 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(4))
    scale = 1 / math.sqrt(d)
    o, lse = forward(q, k, v, causal=True, softmax_scale=scale)
    combos = {"det dq_last": dict(deterministic=True, schedule="spt_listed",
                                  overrides=Overrides(dq_last=True))}
    if not a.without_default:
        combos["det default"] = dict(deterministic=True, schedule="spt_listed",
                                     overrides=Overrides(dq_last=False))
    combos["nondet"] = dict(deterministic=False, schedule="spt")
    times = {n: [] for n in combos}
    for _ in range(a.repeats):
        for n, kw in combos.items():
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            grads = backward(do, q, k, v, o, lse, causal=True, softmax_scale=scale,
                             num_workers=None, **kw)
            e.record()
            torch.cuda.synchronize()
            times[n].append(s.elapsed_time(e))
            del grads
    med = {n: statistics.median(t[1:]) for n, t in times.items()}
    res.append(dict(head_dim=d, seqlen=seqlen, times=times, median=med))
    print(f"d{d} {seqlen}: " + "  ".join(f"{n} {m:.1f}" for n, m in med.items()) + "  | nondet/"
          + " ".join(f"{n} {med['nondet'] / m:.3f}" for n, m in med.items() if n != "nondet"),
          flush=True)
    del q, k, v, do, o, lse
json.dump(res, open(a.out, "w"), indent=1)
