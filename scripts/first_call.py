"""Host time of the first attention call of a fresh process, kernels already compiled (disk
cache): forward and torch.autograd.grad, timed with perf_counter, each case in its own process.

  sdpa       F.scaled_dot_product_attention (cuDNN) as the reference for PyTorch's own first-call
             costs (torch.autograd.grad with grad_outputs imports torch.fx's symbolic shapes,
             and through it sympy, on its first call)
  dashgen    dashgen.attention, deterministic
  dashgen_warm_torch  the same after that import, so that what is left is dashgen's

python3 scripts/first_call.py --out DIR [--seqlen 16384 --head-dim 128 --causal]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])  # this checkout's dashgen, installed or not
CASES = ("dashgen", "sdpa", "dashgen_warm_torch")


def child(case: str, seqlen: int, head_dim: int, causal: bool) -> dict:
    t_import = time.perf_counter()
    import torch
    if case == "dashgen_warm_torch":
        import torch.fx.experimental.symbolic_shapes  # noqa: F401  what autograd.grad imports
    sys.path.insert(0, ROOT)
    import dashgen
    t_import = time.perf_counter() - t_import
    heads = 2048 // head_dim
    q, k, v, do = (torch.randn(16384 // seqlen, seqlen, heads, head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(4))
    if case == "sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))

        def call(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        def call(q, k, v):
            return dashgen.attention(q, k, v, causal=causal, deterministic=True)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if case != "sdpa":  # load the kernels the call runs (a compile, or the disk cache)
        from dashgen.tools.timing import load_kernels
        load_kernels(q, k, causal)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = call(q, k, v)
    t1 = time.perf_counter()
    torch.autograd.grad(o, (q, k, v), do)
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    o = call(q, k, v)
    torch.autograd.grad(o, (q, k, v), do)
    t4 = time.perf_counter()
    torch.cuda.synchronize()
    return dict(case=case, import_s=round(t_import, 3), first_forward_host_s=round(t1 - t0, 4),
                first_backward_host_s=round(t2 - t1, 4), first_call_to_sync_s=round(t3 - t0, 4),
                second_call_host_s=round(t4 - t3, 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seqlen, args.head_dim, args.causal)))
        return
    rows = []
    for case in CASES:
        cmd = [sys.executable, __file__, "--out", args.out, "--seqlen", str(args.seqlen),
               "--head-dim", str(args.head_dim), "--child", case] + (["--causal"] * args.causal)
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    import torch
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "first_call.json").write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), seqlen=args.seqlen,
        head_dim=args.head_dim, causal=args.causal, rows=rows), indent=1))
    keys = ("import_s", "first_forward_host_s", "first_backward_host_s", "second_call_host_s")
    print(f"{'case':<20}" + "".join(f"{k:>24}" for k in keys))
    for r in rows:
        print(f"{r['case']:<20}" + "".join(f"{r[k]:>24}" for k in keys))


if __name__ == "__main__":
    main()
