"""Where a packed backward's time goes outside its kernels, against the fixed-length control:
one autograd.grad call timed as the benchmark times it (CUDA events on an idle GPU, median), its
host time per call, the same call with the host time hidden behind a GPU sleep (what is left is
GPU time; the difference is host time the GPU waited for) and a CUDA-graph replay of it
(kernels with no launch gaps). Cases per head_dim and mask: `bench --varlen`'s pack (seed 0),
the same 16 x 1024 tokens as a pack, and the fixed-length batch of 16 x 1024.

PYTHONPATH=. python3 scripts/pack_overhead.py [--out results.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import dashgen  # noqa: E402
from dashgen.runtime import op_varlen  # noqa: E402
from dashgen.runtime.select import PACK_SCHEDULES, select_pack  # noqa: E402
from dashgen.tools.bench_varlen import document_lengths, kept_pairs  # noqa: E402
from dashgen.tools.timing import median_ms  # noqa: E402

from overhead import hidden_ms, host_us, profile  # noqa: E402  (scripts/)

TOKENS = 16384


def pack_inputs(lengths: list[int], heads: int, head_dim: int):
    """Seeded packed q, k, v, dO (total, heads, head_dim), the offsets and the longest length."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(sum(lengths), heads, head_dim, device="cuda",
                               dtype=torch.bfloat16, generator=g) for _ in range(4))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    return q, k, v, do, cu, max(lengths)


def case_call(lengths: list[int], heads: int, head_dim: int, causal: bool, fixed: bool,
              schedule: str = "auto"):
    """The autograd.grad call of one deterministic dashgen forward over the documents."""
    q, k, v, do, cu, n = pack_inputs(lengths, heads, head_dim)
    if fixed:  # equal lengths as a (batch, seqlen, heads, head_dim) batch
        q, k, v, do = (t.view(len(lengths), lengths[0], heads, head_dim) for t in (q, k, v, do))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if fixed:
        o = dashgen.attention(q, k, v, causal=causal, deterministic=True)
    else:
        o = dashgen.attention_varlen(q, k, v, cu, cu, n, n, causal=causal, deterministic=True,
                                     schedule=schedule)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def pack_op_call(lengths: list[int], heads: int, head_dim: int, causal: bool):
    """The packed backward's custom op called directly, on this thread (no autograd)."""
    q, k, v, do, cu, n = pack_inputs(lengths, heads, head_dim)
    opts = op_varlen._check_all((q, k, v, cu, cu, n, n), (causal, None, True, "auto", None))
    o, lse = torch.ops.dashgen.attention_varlen_fwd(q, k, v, cu, cu, n, n, *opts)
    return lambda: torch.ops.dashgen.attention_varlen_bwd(do, q, k, v, o, lse, cu, cu, n, n,
                                                          *opts)


def host_profile(fn, calls: int = 200) -> str:
    """cProfile of fn's host work over `calls` calls: the top functions by own time."""
    import cProfile
    import io
    import pstats
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def mask_schedules(head_dim: int, causal: bool) -> list[str]:
    """The pack schedules that run under this mask (select_pack refuses the others)."""
    out = []
    for schedule in PACK_SCHEDULES:
        try:
            select_pack("bf16", head_dim, causal, schedule)
        except ValueError:
            continue
        out.append(schedule)
    return out


def graph_ms(fn) -> float | None:
    """Median replay time of fn captured in a CUDA graph (None, and why, if capture fails)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return median_ms(graph.replay, 3, 20)
    except Exception as exc:  # capture is a probe here; report why it failed
        print(f"graph capture failed: {type(exc).__name__}: {exc}")
        return None


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--out", default=None)
    p.add_argument("--schedules", action="store_true",
                   help="also each pack under every pack schedule its mask allows (auto's "
                        "rows are the default cases)")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="also trace 10 calls of the head_dim-128 causal pack and of its "
                        "fixed-length control with torch.profiler (the top host ops, Chrome "
                        "traces in DIR), and a cProfile of the packed op's host work")
    args = p.parse_args()
    rows = []
    for head_dim, causal in ((64, False), (64, True), (128, False), (128, True)):
        heads = 2048 // head_dim
        cases = [("pack", document_lengths(TOKENS, 0), False, "auto"),
                 ("pack 16x1k", [1024] * 16, False, "auto"),
                 ("fixed 16x1k", [1024] * 16, True, "auto")]
        if args.schedules:
            cases += [(f"{name} {schedule}", lengths, False, schedule)
                      for name, lengths, _, _ in cases[:2]
                      for schedule in mask_schedules(head_dim, causal)]
        for name, lengths, fixed, schedule in cases:
            fn = case_call(lengths, heads, head_dim, causal, fixed, schedule)
            ms = median_ms(fn, 3, 20)
            row = dict(head_dim=head_dim, causal=causal, case=name, documents=len(lengths),
                       event_ms=ms, host_us=host_us(fn), hidden_ms=hidden_ms(fn),
                       graph_ms=graph_ms(fn),
                       flops=2.5 * 4 * heads * head_dim * kept_pairs(lengths, causal))
            if not fixed and schedule == "auto":  # the op alone; autograd's share is the rest
                row["op_host_us"] = host_us(pack_op_call(lengths, heads, head_dim, causal))
            rows.append(row)
            if args.profile and head_dim == 128 and causal and name in ("pack", "fixed 16x1k"):
                print(f"--- host ops, d128 causal {name}")
                profile(fn, Path(args.profile) / name.split()[0])
                if not fixed:
                    print(host_profile(pack_op_call(lengths, heads, head_dim, causal)))
    print(f"{'config':<14} {'case':<28} {'event ms':>9} {'TFLOP/s':>8} {'host us':>8} "
          f"{'hidden ms':>10} {'graph ms':>9} {'exposed host us':>16} {'gpu gaps us':>12} "
          f"{'op host us':>11}")
    for r in rows:
        cfg = f"d{r['head_dim']} {'causal' if r['causal'] else 'full'}"
        gr = r["graph_ms"]
        print(f"{cfg:<14} {r['case']:<28} {r['event_ms']:>9.3f} "
              f"{r['flops'] / r['event_ms'] / 1e9:>8.1f} {r['host_us']:>8.1f} "
              f"{r['hidden_ms']:>10.3f} {gr if gr is not None else float('nan'):>9.3f} "
              f"{(r['event_ms'] - r['hidden_ms']) * 1e3:>16.1f} "
              f"{(r['hidden_ms'] - gr) * 1e3 if gr is not None else float('nan'):>12.1f} "
              f"{r.get('op_host_us', float('nan')):>11.1f}")
    if args.out:
        info = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)
        Path(args.out).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
