"""The forward at head_dim 192 and 256 on the GPU before the runtime offers it: each variant
launched through runtime.forward with the variant given, o and lse against float64, beside
PyTorch's bf16 math error.

python3 lab/forward_head_dims.py TREE
"""
import math, sys
sys.path.insert(0, sys.argv[1])
import torch
import dashgen.runtime.forward as F
from dashgen.codegen.variants import ForwardVariant
from dashgen.runtime.select import Overrides

torch.manual_seed(0)
print(f"{'variant':<40} {'o err':>9} {'torch bf16':>10} {'lse err':>9} ok")
bad = 0
for hd in (192, 256):
    for causal in (False, True):
        for persistent in (False, True):
            for (sq, sk) in ((1000, 1000), (300, 777)):
                variant = ForwardVariant("bf16", hd, causal, persistent=persistent)
                F.forward_variant = lambda *a, **k: variant
                b, h = 2, 4
                q = torch.randn(b, sq, h, hd, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, h, hd, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, sk, h, hd, device="cuda", dtype=torch.bfloat16)
                scale = 1 / math.sqrt(hd)
                call = F.ForwardCall(q.shape, k.shape, q.dtype, causal, scale, q.device, Overrides())
                o, lse = call(q, k, v)
                torch.cuda.synchronize()
                def ref(dt):
                    qq, kk, vv = (t.transpose(1, 2).to(dt) for t in (q, k, v))
                    s = (qq @ kk.transpose(-1, -2)).to(torch.float64 if dt == torch.float64 else torch.float32) * scale
                    if causal:
                        i = torch.arange(sq, device="cuda")[:, None]; j = torch.arange(sk, device="cuda")[None]
                        s = s.masked_fill(~(j <= i + sk - sq), float("-inf"))
                    l = torch.logsumexp(s, -1)
                    p = torch.softmax(s, -1).nan_to_num(0)
                    if dt != torch.float64: p = p.to(dt)
                    out = (p @ vv.to(p.dtype)).transpose(1, 2)
                    return out.double(), l.double()
                ro, rl = ref(torch.float64)
                to, _ = ref(torch.bfloat16)
                e = float((o.double() - ro).norm() / ro.norm())
                et = float((to - ro).norm() / ro.norm())
                fin = torch.isfinite(rl)
                el = float((lse.double()[fin] - rl[fin]).abs().max())
                ok = e <= 2 * et + 1e-6 and el < 1e-2 and torch.isfinite(o).all().item()
                bad += not ok
                print(f"{variant.kernel_name + ('' if sq == sk else ' 300x777'):<40} {e:9.2e} {et:10.2e} {el:9.2e} {'yes' if ok else 'NO'}", flush=True)
print("all within 2x" if not bad else f"{bad} FAILED")
