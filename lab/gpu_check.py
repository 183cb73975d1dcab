"""Correctness, determinism and trace checks of the attention kernels on a GPU, printed as a table.

Run on an sm_90 machine from the repository root:
    PYTHONPATH=. python3 lab/gpu_check.py [--quick] [--fused-convert on|off] ...
Each case compares against float64 math on fresh randn inputs and against PyTorch's own math in
the input dtype (our error must stay within 2x of it). The kernels are the ones
dashgen.runtime.select picks, or what the override flags ask for.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import build_schedule  # noqa: E402
from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.forward import forward, forward_variant  # noqa: E402
from dashgen.runtime.select import Overrides, problem_for, selection  # noqa: E402

from time_kernels import add_override_flags, overrides_from, overrides_tag  # noqa: E402


def reference(q, k, v, do, causal, scale):
    """Attention forward and backward in q's dtype via autograd (float64 for the reference)."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        rows = torch.arange(sq, device=q.device)[:, None]
        cols = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + (sk - sq), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def within(x, own, ref):
    """Our error at most twice PyTorch's own (same dtype), with a floor for gradients that are
    zero in exact arithmetic (one key per row: dS = 0), where any rounding is "infinitely" off."""
    floor = 1e-5 * ref.numel() ** 0.5
    return bool((x.double() - ref).norm() <= 2 * (own.double() - ref).norm() + floor)


def check_case(batch, sq, sk, hq, hkv, d, causal, dtype, schedule, workers, repeats,
               overrides: Overrides):
    dev = "cuda"
    torch.manual_seed(hash((batch, sq, sk, hq, hkv, d, causal, schedule, workers)) % 2**31)
    q = torch.randn(batch, sq, hq, d, device=dev, dtype=dtype)
    k = torch.randn(batch, sk, hkv, d, device=dev, dtype=dtype)
    v = torch.randn(batch, sk, hkv, d, device=dev, dtype=dtype)
    do = torch.randn(batch, sq, hq, d, device=dev, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    o, lse = forward(q, k, v, causal=causal, softmax_scale=scale, overrides=overrides)
    dq, dk, dv, trace = backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                                 deterministic=True, schedule=schedule, num_workers=workers,
                                 trace=True, overrides=overrides)
    torch.cuda.synchronize()
    ref = reference(q.double(), k.double(), v.double(), do.double(), causal, scale)
    own = reference(q, k, v, do, causal, scale)
    errs = [rel(x, r) for x, r in zip((o, dq, dk, dv), ref)]
    torch_errs = [rel(x, r) for x, r in zip(own, ref)]
    ok = all(math.isfinite(e) for e in errs) and all(
        within(x, y, r) for x, y, r in zip((o, dq, dk, dv), own, ref))

    # Trace = IR: every worker ran its tasks in order and each add saw exactly dq_rank before it.
    s = build_schedule(schedule, problem_for(batch, hq, hkv, sq, sk, d, causal), workers)
    expect = [[t.batch, t.head, t.n_block, t.m_block, t.dq_rank, t.dq_rank]
              for tasks in s.workers for t in tasks]
    trace_ok = trace[:, :6].cpu().tolist() == expect

    bitwise = True
    for _ in range(repeats):
        again = backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                         deterministic=True, schedule=schedule, num_workers=workers,
                         overrides=overrides)
        bitwise &= all(torch.equal(a, b) for a, b in zip(again, (dq, dk, dv)))
    nd = backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                  deterministic=False, schedule=schedule, num_workers=workers,
                  overrides=overrides)
    nd_ok = all(within(x, y, r) for x, y, r in zip(nd, own[1:], ref[1:]))
    mask = "causal" if causal else "full"
    shapes, name = (tuple(q.shape), tuple(k.shape)), "bf16" if dtype == torch.bfloat16 else "fp16"
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    sel = selection(*shapes, name, causal, True, False, schedule, workers, sms, overrides)
    return dict(kernel=sel.backward.kernel_name,
                fwd_kernel=forward_variant(*shapes, name, causal, sms, overrides).kernel_name,
                case=f"b{batch} sq{sq} sk{sk} h{hq}/{hkv} d{d} {mask} {str(dtype)[6:]} {schedule} "
                     f"W{workers}",
                errs=errs, torch_errs=torch_errs, ok=ok, trace_ok=trace_ok, bitwise=bitwise,
                nondet_ok=nd_ok)


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, schedule, workers)
CASES = [
    (1, 128, 128, 1, 1, 128, False, torch.bfloat16, "fa3", 1),
    (1, 200, 200, 2, 2, 128, True, torch.bfloat16, "spt", 3),
    (2, 1000, 1000, 4, 4, 128, False, torch.bfloat16, "shift", 132),
    (2, 777, 777, 4, 4, 128, True, torch.bfloat16, "symmetric_shift", 132),
    (1, 100, 300, 8, 8, 128, True, torch.bfloat16, "descending", 5),
    (1, 300, 100, 16, 16, 128, True, torch.bfloat16, "fa3", 132),
    (2, 1024, 1024, 8, 8, 128, True, torch.bfloat16, "fa3", 132),
    # GQA / MQA: dK/dV summed over the query heads of a group in dkv_rank order.
    (2, 777, 777, 8, 2, 128, True, torch.bfloat16, "symmetric_shift", 132),
    (1, 1000, 1000, 16, 1, 128, False, torch.bfloat16, "shift", 132),
    (2, 300, 257, 8, 2, 128, False, torch.bfloat16, "fa3", 7),
    # head_dim 64: 128-row query tiles.
    (1, 128, 128, 1, 1, 64, False, torch.bfloat16, "fa3", 1),
    (2, 1000, 1000, 4, 4, 64, True, torch.bfloat16, "symmetric_shift", 132),
    (2, 777, 300, 8, 2, 64, False, torch.bfloat16, "shift", 132),
    (1, 1, 1, 2, 2, 64, True, torch.bfloat16, "spt", 3),
    # fp16: the same templates, f16 wgmma inputs.
    (2, 777, 777, 8, 2, 128, True, torch.float16, "symmetric_shift", 132),
    (1, 1000, 1000, 4, 4, 64, False, torch.float16, "shift", 132),
    (2, 300, 257, 8, 8, 128, False, torch.float16, "fa3", 7),
    (1, 200, 200, 4, 1, 64, True, torch.float16, "spt", 3),
]
# --quick: one case of each kind (head_dim, mask, GQA, dtype, a one-row problem).
QUICK = [CASES[i] for i in (0, 1, 3, 7, 11, 12, 13, 17)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} of the "
                                                             f"{len(CASES)} cases")
    parser.add_argument("--repeats", type=int, default=20,
                        help="deterministic backwards compared bitwise with the first")
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="folder of gpu_check<overrides>.json (default: $OUT or .)")
    add_override_flags(parser)
    args = parser.parse_args()
    overrides = overrides_from(args)
    os.makedirs(args.out, exist_ok=True)  # before the cases: a bad --out fails at once
    rows = []
    for case in QUICK if args.quick else CASES:
        t0 = time.time()
        try:
            row = check_case(*case, repeats=args.repeats, overrides=overrides)
        except Exception as exc:  # keep going: one broken case must not hide the others
            row = dict(case=str(case), error=f"{type(exc).__name__}: {exc}")
        row["seconds"] = round(time.time() - t0, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, f"gpu_check{overrides_tag(overrides)}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'case':<58} {'o/dq/dk/dv rel err (torch dtype err)':<60} ok trace bits nondet")
    failed = 0
    for r in rows:
        if "error" in r:
            failed += 1
            print(f"{r['case']:<58} ERROR {r['error'][:200]}")
            continue
        errs = " ".join(f"{e:.1e}({t:.1e})" for e, t in zip(r["errs"], r["torch_errs"]))
        good = r["ok"] and r["trace_ok"] and r["bitwise"] and r["nondet_ok"]
        failed += not good
        print(f"{r['case']:<58} {errs:<60} {r['ok']!s:5} {r['trace_ok']!s:5} {r['bitwise']!s:5} {r['nondet_ok']}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
