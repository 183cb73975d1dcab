"""Where the time of one backward goes outside the kernels: the same head_dim-128 backward timed
through runtime.backward, the custom op and autograd (CUDA events, median), autograd with the
backward prepared by the forward (attention()) against prepared in the backward, alternated,
plus the host time
per call (no sync), the same call with its host time hidden behind a GPU sleep (what is left is
GPU time; the difference is host time the GPU waited for) and a CUDA-graph replay (kernels
only, no launch gaps); then the forward
through runtime.forward and through attention() under no_grad (forward TFLOP/s).

PYTHONPATH=. python3 lab/overhead.py [--seqlen 1024] [--causal] [--fused-convert on|off] ...
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.runtime import backward as runtime_backward  # noqa: E402
from dashgen.runtime import forward as runtime_forward  # noqa: E402
from dashgen.runtime.op import attention  # noqa: E402
from dashgen.tools.timing import event_ms, median_ms, rounds_ms  # noqa: E402  (the protocol)

from time_kernels import (add_override_flags, overrides_from,  # noqa: E402  (lab/)
                          problem_inputs)


def host_us(fn, calls: int = 50) -> float:
    """Median host time of a call, synchronizing between calls (pure host work + launch)."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def hidden_ms(fn, calls: int = 20, sleep_cycles: int = 5_000_000) -> float:
    """Median GPU time of fn with its host time hidden: the GPU first sleeps (~2.5 ms), fn
    queues its kernels meanwhile, and the clock starts when the sleep ends. What the plain
    median shows beyond this is host time the GPU waited for."""
    fn()
    return statistics.median(event_ms(fn, before=lambda: torch.cuda._sleep(sleep_cycles))
                             for _ in range(calls))


def graph_replay_ms(fn) -> float | None:
    """Median replay time of fn captured in a CUDA graph (its kernels, no host time), or None
    where capture fails (reported: the capture is a probe)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # kernels loaded and memos filled outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return median_ms(graph.replay, 3, 20)
    except Exception as exc:
        print(f"graph capture failed: {type(exc).__name__}: {exc}", flush=True)
        return None


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--schedule", default=None)
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="also trace 10 autograd.grad calls with torch.profiler: the top host "
                        "ops, and a Chrome trace DIR/trace_autograd.json")
    add_override_flags(p)
    args = p.parse_args()
    overrides = overrides_from(args)  # runtime.forward/backward only: attention() takes none
    s, d = args.seqlen, args.hdim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = args.schedule or ("symmetric_shift" if args.causal else "shift")
    batch, heads, q, k, v, do, o, lse, scale = problem_inputs(d, args.causal, s, overrides)
    kw = dict(causal=args.causal, softmax_scale=scale, deterministic=True, schedule=schedule,
              num_workers=sms)

    def direct():
        return runtime_backward.backward(do, q, k, v, o, lse, overrides=overrides, **kw)

    def op():
        return torch.ops.dashgen.attention_bwd(do, q, k, v, o, lse, args.causal, scale, True,
                                               schedule, sms)

    ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(ql, kl, vl, causal=args.causal, schedule=schedule, num_workers=sms,
                    deterministic=True)

    def autograd():
        return torch.autograd.grad(out, (ql, kl, vl), do, retain_graph=True)

    class _PreparedInBackward(torch.autograd.Function):
        """attention()'s node with the backward prepared on autograd's device thread, as
        runtime.backward does it, instead of by the forward: the difference is what preparing
        in the forward saves."""

        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = runtime_forward.forward(q, k, v, causal=args.causal,
                                             softmax_scale=scale)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, grad):
            return runtime_backward.backward(grad.contiguous(), *ctx.saved_tensors, **kw)

    out_late = _PreparedInBackward.apply(ql, kl, vl)

    def autograd_late():
        return torch.autograd.grad(out_late, (ql, kl, vl), do, retain_graph=True)

    class _Floor(torch.autograd.Function):
        """autograd's own cost on CUDA: a backward that launches one small copy."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad[:1].clone()

    xl = torch.zeros(1, device="cuda", requires_grad=True)
    floor_out = _Floor.apply(xl)
    floor_grad = torch.ones(1, device="cuda")

    def floor():
        return torch.autograd.grad(floor_out, (xl,), floor_grad, retain_graph=True)

    def forward_no_grad():
        with torch.no_grad():
            return attention(q, k, v, causal=args.causal, deterministic=True)

    def forward_runtime():
        return runtime_forward.forward(q, k, v, causal=args.causal, softmax_scale=scale,
                                       overrides=overrides)

    fwd_flops = 4 * batch * heads * s * s * d / (2 if args.causal else 1)
    flops = 2.5 * fwd_flops
    rows = []
    for name, fn in (("runtime.backward", direct), ("custom op", op), ("autograd.grad", autograd),
                     ("autograd floor", floor)):
        ms = median_ms(fn, 3, 20)
        rows.append((name, ms, host_us(fn), hidden_ms(fn)))
    # The two autograd paths alternated in rounds (as the benchmark times rows), repeated.
    paired, _ = rounds_ms({"prepared by the forward": autograd,
                           "prepared in the backward": autograd_late}, 3, 120, rounds=12)
    fwd_rows = [(name, median_ms(fn, 3, 20), host_us(fn))
                for name, fn in (("runtime.forward", forward_runtime),
                                 ("attention, no_grad", forward_no_grad))]
    graph_ms = graph_replay_ms(direct)
    print(f"b{batch} h{heads} s{s} d{d} {'causal' if args.causal else 'full'} {schedule}")
    print(f"{'path':<20} {'median ms':>10} {'TFLOP/s':>8} {'host us/call':>13} "
          f"{'ms, host hidden':>16} {'exposed host us':>16}")
    for name, ms, us, gpu_ms in rows:
        print(f"{name:<20} {ms:>10.3f} {flops / ms / 1e9:>8.1f} {us:>13.1f} {gpu_ms:>16.3f} "
              f"{(ms - gpu_ms) * 1e3:>16.1f}")
    if graph_ms is not None:
        print(f"{'graph replay':<20} {graph_ms:>10.3f} {flops / graph_ms / 1e9:>8.1f}")
    print("autograd.grad, the two preparations alternated (12 rounds, 120 calls each):")
    for name, ms in paired.items():
        print(f"  {name:<26} {ms:>10.3f} {flops / ms / 1e9:>8.1f}")
    for name, ms, us in fwd_rows:  # forward TFLOP/s
        print(f"{name:<20} {ms:>10.3f} {fwd_flops / ms / 1e9:>8.1f} {us:>13.1f}")
    if args.profile:
        profile(autograd, Path(args.profile))


def profile(fn, out: Path) -> None:
    """Where the host time of fn goes, per op and thread (the autograd engine runs the backward
    on its own device thread)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            event_ms(fn)  # as the benchmark times it: the GPU idle before each call
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    prof.export_chrome_trace(str(out / "trace_autograd.json"))


if __name__ == "__main__":
    main()
