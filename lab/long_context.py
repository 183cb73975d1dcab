"""One long sequence (131k to 1M tokens) forward and backward on the GPU: the first call's host
time (the kernels compiled or loaded beforehand, timed apart), backward TFLOP/s (the first call, or
for rows under half a second the median of 7 calls after ~200 ms of warm calls), peak memory, and
accuracy against a float64 reference on sampled query rows (dq, o) and key rows (dk, dv) within
2x of PyTorch's own bf16 error on those rows (its fused bf16 SDPA). Prints a table, writes JSON.

python3 lab/long_context.py --out DIR [--seqlens 131072,1048576] [--configs d128,d64]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
# torch.autograd.grad imports torch.fx's symbolic shapes (and sympy) on its first call with
# grad_outputs, 2.4 s on the H200 (measured in a fresh process): imported here, so that the first
# row's first-call host time is dashgen's and not PyTorch's one-time import.
import torch.fx.experimental.symbolic_shapes  # noqa: E402,F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dashgen  # noqa: E402
from dashgen.tools.timing import load_kernels, median_ms  # noqa: E402

# head_dim, heads (hidden 2048). One head would leave a 1M-token causal sequence's dQ tiles
# rank chains of 16,384 adds with nothing else to run beside them.
CONFIGS = {"d128": (128, 16), "d64": (64, 32), "d256": (256, 8)}


def reference_rows(q, k, v, do, rows, causal):
    """o and dq of query rows `rows` of head 0: in float64 (the reference, SDPA's math backend),
    and from PyTorch's own bf16 kernels: its fused memory-efficient SDPA (which, like dashgen,
    takes D = rowsum(dO * o) from its bf16 o) and its bf16 math SDPA (D from the softmax's own
    probabilities). A query row's o and dq read only that row, so the rows alone suffice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = []
    for dtype, backend in ((torch.float64, SDPBackend.MATH),
                           (torch.bfloat16, SDPBackend.EFFICIENT_ATTENTION),
                           (torch.bfloat16, SDPBackend.MATH)):
        qs = q[:, rows, :1].transpose(1, 2).to(dtype).requires_grad_()
        kk, vv = (t[:, :, :1].transpose(1, 2).to(dtype) for t in (k, v))
        mask = None
        if causal:  # bottom-right aligned; seqlen_q == seqlen_k here
            keys = torch.arange(k.shape[1], device=q.device)
            seen = keys[None, :] <= torch.tensor(rows, device=q.device)[:, None]
            mask = torch.zeros(seen.shape, dtype=dtype, device=q.device).masked_fill(
                ~seen, float("-inf"))[None, None]
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(qs, kk, vv, attn_mask=mask)
        (dq,) = torch.autograd.grad(o, (qs,), do[:, rows, :1].transpose(1, 2).to(dtype))
        out.append((o[0, 0].double().detach(), dq[0, 0].double()))
    return out


@torch.no_grad()  # q, k, v require grad in main: a graph would keep every chunk's scores
def reference_keys(q, k, v, do, keys, causal, chunk: int = 256):
    """dk and dv of key rows `keys` of head 0 in float64: every query row's lse and
    D = rowsum(dO * o) first (one pass over the whole score matrix, `chunk` query rows at a
    time), then the key rows' sums over the query rows that see them."""
    seqlen, scale = q.shape[1], q.shape[-1] ** -0.5
    q0, k0, v0, do0 = (t[0, :, 0].double() for t in (q, k, v, do))
    kj, vj = k0[keys], v0[keys]
    dk = torch.zeros_like(kj)
    dv = torch.zeros_like(vj)
    positions = torch.arange(seqlen, device=q.device)
    key_pos = torch.tensor(keys, device=q.device)
    for start in range(0, seqlen, chunk):
        rows = positions[start:start + chunk]
        s = (q0[rows] @ k0.T) * scale
        if causal:  # bottom-right aligned, seqlen_q == seqlen_k
            s.masked_fill_(positions[None, :] > rows[:, None], float("-inf"))
        lse = torch.logsumexp(s, dim=1)
        o = torch.softmax(s, dim=1) @ v0
        d = (do0[rows] * o).sum(dim=1)
        del s, o
        sj = (q0[rows] @ kj.T) * scale
        if causal:
            sj.masked_fill_(key_pos[None, :] > rows[:, None], float("-inf"))
        p = torch.exp(sj - lse[:, None])
        dp = do0[rows] @ vj.T
        ds = p * (dp - d[:, None])
        dv += p.T @ do0[rows]
        dk += scale * (ds.T @ q0[rows])
    return dk, dv


def torch_key_rows(q, k, v, do, keys, causal):
    """dk and dv of key rows `keys` of head 0 from PyTorch's fused bf16 SDPA (memory-efficient
    backend) over head 0 alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qs, ks, vs = (t[:, :, :1].transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    dk, dv = torch.autograd.grad(o, (ks, vs), do[:, :, :1].transpose(1, 2))
    return dk[0, 0, keys].double(), dv[0, 0, keys].double()


def warm_backward_ms(qg, kg, vg, do, causal, first_ms: float, warm_ms: float) -> float:
    """The backward's GPU time as the median of 7 calls after about `warm_ms` of calls.
    Rows under half a second take two readings: after ~200 ms (the first call of a short row
    runs on an idle GPU's clocks: a 16k row measured 0.5x its benchmark figure so), and with
    --sustain-s after that many seconds, the clocks a long row runs at: a 1M row's one call
    draws the board's power limit for up to a minute and its SM clock falls below what a short
    burst keeps (on the H200, 1515-1875 MHz under the software power cap against 1980)."""
    o = dashgen.attention(qg, kg, vg, causal=causal, deterministic=True)
    call = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)  # noqa: E731
    return median_ms(call, warmup=max(3, int(warm_ms / max(first_ms, 1e-3))), repeats=7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", default="131072,524288,1048576")
    ap.add_argument("--configs", default="d128,d64")
    ap.add_argument("--masks", default="causal,full")
    ap.add_argument("--no-repeat", dest="repeat", action="store_false",
                    help="skip the second call that checks the bits repeat (it doubles the time)")
    ap.add_argument("--sustain-s", type=float, default=0.0,
                    help="also time rows under half a second after this many seconds of "
                         "back-to-back calls (the clocks a long row runs at)")
    args = ap.parse_args()
    rows_out = []
    for name in args.configs.split(","):
        head_dim, heads = CONFIGS[name]
        for seqlen in map(int, args.seqlens.split(",")):
            for mask in args.masks.split(","):
                causal = mask == "causal"
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                g = torch.Generator(device="cuda").manual_seed(seqlen)
                make = lambda: torch.randn(1, seqlen, heads, head_dim, device="cuda",
                                           dtype=torch.bfloat16, generator=g)
                q, k, v, do = make(), make(), make(), make()
                base = torch.cuda.max_memory_allocated()
                qg, kg, vg = (t.requires_grad_() for t in (q, k, v))
                compile_s = load_kernels(q, k, causal)
                s, e = torch.cuda.Event(True), torch.cuda.Event(True)
                t0 = time.perf_counter()
                o = dashgen.attention(qg, kg, vg, causal=causal, deterministic=True)
                t1 = time.perf_counter()
                s.record()
                dq, dk, dv = torch.autograd.grad(o, (qg, kg, vg), do)
                e.record()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                first_host = (t1 - t0) + (t2 - t1)
                ms = s.elapsed_time(e)  # the first backward's GPU time (kernels loaded before)
                peak = torch.cuda.max_memory_allocated() - base
                short = ms <= 500  # a longer row keeps its first call
                steady = warm_backward_ms(qg, kg, vg, do, causal, ms, 200) if short else ms
                sustained = (warm_backward_ms(qg, kg, vg, do, causal, ms, args.sustain_s * 1000)
                             if short and args.sustain_s > 0 else None)
                same = None
                if args.repeat:  # a second call must give the same bits
                    o2 = dashgen.attention(qg, kg, vg, causal=causal, deterministic=True)
                    again = torch.autograd.grad(o2, (qg, kg, vg), do)
                    same = all(torch.equal(a, b) for a, b in zip((dq, dk, dv), again))
                    del o2, again
                flops = 2.5 * 4 * seqlen * seqlen * heads * head_dim * (0.5 if causal else 1.0)
                rows = sorted({0, 1, seqlen // 3, seqlen // 2, seqlen - 1})
                (ro, rdq), (lo, ldq), (_, mdq) = reference_rows(q, k, v, do, rows, causal)
                err = lambda x, r: float((x.detach() - r).norm() / r.norm().clamp_min(1e-30))
                o_err, o_torch = err(o[0, rows, 0].double(), ro), err(lo, ro)
                dq_err, dq_torch = err(dq[0, rows, 0].double(), rdq), err(ldq, rdq)
                keys = sorted({0, 1, seqlen // 2, seqlen - 2, seqlen - 1})
                rdk, rdv = reference_keys(q, k, v, do, keys, causal)
                tdk, tdv = torch_key_rows(q, k, v, do, keys, causal)
                dk_err, dk_torch = err(dk[0, keys, 0].double(), rdk), err(tdk, rdk)
                dv_err, dv_torch = err(dv[0, keys, 0].double(), rdv), err(tdv, rdv)
                row = dict(config=name, head_dim=head_dim, heads=heads, seqlen=seqlen, mask=mask,
                           compile_or_load_s=round(compile_s, 3),
                           first_call_host_s=round(first_host, 3),
                           first_forward_host_s=round(t1 - t0, 3),
                           first_backward_host_s=round(t2 - t1, 3),
                           first_backward_ms=round(ms, 2), backward_ms=round(steady, 2),
                           backward_tflops=round(flops / steady / 1e9, 1),
                           sustained_backward_ms=None if sustained is None
                           else round(sustained, 2),
                           sustained_tflops=None if sustained is None
                           else round(flops / sustained / 1e9, 1),
                           peak_gib=round(peak / 2**30, 2),
                           repeat_bitwise_equal=same, o_err=o_err, o_err_torch_bf16=o_torch,
                           dq_err=dq_err, dq_err_torch_bf16=dq_torch,
                           dq_err_torch_bf16_math=err(mdq, rdq),
                           # relative to all sampled rows' reference norm: query row 0 of a
                           # causal mask sees one key, so its own reference dq is ~0
                           dq_err_per_row=[float((dq[0, r, 0].double() - rdq[i]).norm()
                                                 / rdq.norm().clamp_min(1e-30))
                                           for i, r in enumerate(rows)],
                           # PyTorch's bf16 error row by row on the same scale: whether a row
                           # past the bound is dashgen's alone or the row's
                           dq_err_torch_bf16_per_row=[float((ldq[i] - rdq[i]).norm()
                                                            / rdq.norm().clamp_min(1e-30))
                                                      for i in range(len(rows))],
                           dk_err=dk_err, dk_err_torch_bf16=dk_torch,
                           dv_err=dv_err, dv_err_torch_bf16=dv_torch,
                           within_2x=bool(o_err <= 2 * o_torch + 1e-7
                                          and dq_err <= 2 * dq_torch + 1e-7),
                           keys_within_2x=bool(dk_err <= 2 * dk_torch + 1e-7
                                               and dv_err <= 2 * dv_torch + 1e-7))
                rows_out.append(row)
                print(row, flush=True)
                del q, k, v, do, qg, kg, vg, o, dq, dk, dv
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "long_context.json").write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), rows=rows_out), indent=1))
    print(f"{'cfg':>4} {'seqlen':>8} {'mask':>6} {'host s':>7} {'bwd ms':>9} {'TFLOP/s':>8} "
          f"{'sust.':>6} {'peak GiB':>8} {'o err/2x':>9} {'dq err/2x':>9} {'dk err/2x':>9} "
          f"{'dv err/2x':>9}")
    for r in rows_out:
        print(f"{r['config']:>4} {r['seqlen']:>8} {r['mask']:>6} {r['first_call_host_s']:>7} "
              f"{r['backward_ms']:>9} {r['backward_tflops']:>8} "
              f"{r['sustained_tflops'] or '-':>6} {r['peak_gib']:>8} "
              f"{r['o_err'] / (2 * r['o_err_torch_bf16']):>9.2f} "
              f"{r['dq_err'] / (2 * r['dq_err_torch_bf16']):>9.2f} "
              f"{r['dk_err'] / (2 * r['dk_err_torch_bf16']):>9.2f} "
              f"{r['dv_err'] / (2 * r['dv_err_torch_bf16']):>9.2f}")


if __name__ == "__main__":
    main()
