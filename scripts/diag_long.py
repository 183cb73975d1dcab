import sys, torch
sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import dashgen
from long_context import reference_rows
for seqlen in (131072,):
    g = torch.Generator(device="cuda").manual_seed(seqlen)
    mk = lambda: torch.randn(1, seqlen, 32, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(), mk(), mk(), mk()
    rows = sorted({0, 1, seqlen // 3, seqlen // 2, seqlen - 1})
    (ro, rdq), (lo, ldq), (_, mdq) = reference_rows(q, k, v, do, rows, True)
    print(seqlen, 'torch bf16 math per row', [f"{float((mdq[i] - rdq[i]).norm() / rdq[i].norm().clamp_min(1e-30)):.1e}" for i in range(len(rows))])
    print(seqlen, 'torch bf16 fused per row', [f"{float((ldq[i] - rdq[i]).norm() / rdq[i].norm().clamp_min(1e-30)):.1e}" for i in range(len(rows))])
    for sched, det in (("spt", True), ("auto", True)):
        try:
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            o = dashgen.attention(qg, kg, vg, causal=True, deterministic=det, schedule=sched)
            dq, = torch.autograd.grad(o, (qg,), do)
        except ValueError as e:
            print(seqlen, sched, "refused", str(e)[:80]); continue
        per_row = [float((dq[0, r, 0].double() - rdq[i]).norm() / rdq[i].norm().clamp_min(1e-30)) for i, r in enumerate(rows)]
        print(seqlen, sched, det, "dq rel err per row", [f"{e:.1e}" for e in per_row], flush=True)
