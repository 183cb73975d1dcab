"""Where the ordered long backward waits: a traced d128 causal backward (spt_listed, auto's
policies) summarized by lab/handoffs.py, beside the untraced det and non-det times.

python3 lab/long_trace.py TREE SEQLEN OUT.json
"""
import json, math, statistics, sys
tree = sys.argv[1]; S = int(sys.argv[2]); out = sys.argv[3]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/lab")
import torch
from dashgen.runtime.forward import forward
from dashgen.runtime.backward import backward
from dashgen.runtime.select import problem_for
from dashgen.runtime.plans import trace_offsets
from handoffs import handoffs, summarize
H, D = 16, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
sc = 1 / math.sqrt(D)
o, lse = forward(q, k, v, causal=True, softmax_scale=sc)
res = {}
def timed(**kw):
    ts = []
    for _ in range(3):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); r = backward(do, q, k, v, o, lse, causal=True, softmax_scale=sc, num_workers=None, **kw); e.record()
        torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts[1:]), r
for name, kw in (("det", dict(deterministic=True, schedule="spt_listed")),
                 ("nondet", dict(deterministic=False, schedule="spt")),
                 ("det_traced", dict(deterministic=True, schedule="spt_listed", trace=True))):
    ms, r = timed(**kw); res[name + "_ms"] = ms; print(name, f"{ms:.1f} ms", flush=True)
trace = r[3]
offsets = trace_offsets(problem_for(1, H, H, S, S, D, True), "spt_listed", 132)
s = summarize(handoffs(trace, offsets)).as_dict()
res["summary"] = s
json.dump(res, open(out, "w"), indent=1)
for k_, v_ in s.items(): print(k_, v_)
