"""Quick timing of dashgen's forward and backward on the ANCHORS.md shapes (a subset), for
comparing kernel versions inside one device call. The full protocol is `dashgen bench`.

PYTHONPATH=. python3 scripts/time_kernels.py [--seqlens 1024 4096] [--hdims 64 128]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.runtime import backward as runtime# noqa: E402
from dashgen.tools.bench import median_ms  # noqa: E402  (the protocol's timing)
from dashgen.codegen.variants import SM90_BWD_BLOCK_M, Sm90BwdConfig, sm90_bwd_refusal  # noqa: E402

import backward_options  # noqa: E402  (scripts/, the script's own folder, is on sys.path)


def kernel_us(fn, calls: int = 10) -> dict[str, float]:
    """Median GPU time of each of the backward's kernels over `calls` calls, in microseconds,
    keyed preprocess / main / convert (from torch.profiler's CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or "dashgen" not in event.name:
            continue
        part = ("preprocess" if "_preprocess" in event.name else
                "convert" if "_convert" in event.name else "main")
        times.setdefault(part, []).append(event.time_range.elapsed_us())
    return {part: statistics.median(t) for part, t in times.items()}


def problem_inputs(d: int, causal: bool, s: int, fwd_kernel: str = "auto"):
    """The ANCHORS.md shapes at one configuration: (batch, heads, q, k, v, do, o, lse, scale)."""
    heads, batch = 2048 // d, 16384 // s
    q, k, v, do = (torch.randn(batch, s, heads, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    scale = 1 / math.sqrt(d)
    o, lse = runtime.forward(q, k, v, causal=causal, softmax_scale=scale, kernel=fwd_kernel)
    return batch, heads, q, k, v, do, o, lse, scale


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--schedules", nargs="+", default=["fa3"])
    parser.add_argument("--kernel", default="auto", choices=["auto", "mma", "sm90"])
    parser.add_argument("--fwd-kernel", default="auto", choices=["auto", "mma", "sm90"])
    backward_options.add_flags(parser)
    parser.add_argument("--block-m-d64", type=int, choices=[64, 128], default=None,
                        help="query rows per task of the Hopper backward at head_dim 64 "
                             "(default: dashgen's, kernels.SM90_BWD_BLOCK_M)")
    parser.add_argument("--kernels", action="store_true",
                        help="also each deterministic backward kernel's GPU time (profiler)")
    parser.add_argument("--compare", metavar="OPTION", choices=sorted(runtime.SM90_BWD_OPTIONS),
                        help="instead: each deterministic backward kernel's GPU time with a "
                             "runtime.SM90_BWD_OPTIONS option at its default and switched, "
                             "configuration by configuration")
    args = parser.parse_args()
    backward_options.apply(args)
    if args.block_m_d64 is not None:
        SM90_BWD_BLOCK_M[64] = args.block_m_d64
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.compare:
        compare(args, sms)
        return
    print(f"{'config':<32} {'schedule':<16} {'fwd TF/s':>9} {'bwd det':>9} {'bwd nondet':>10}")
    for d in args.hdims:
        for causal in (False, True):
            for s in args.seqlens:
                batch, heads, q, k, v, do, o, lse, scale = problem_inputs(d, causal, s,
                                                                          args.fwd_kernel)
                flops = 4 * batch * heads * s * s * d / (2 if causal else 1)
                fwd = median_ms(lambda: runtime.forward(q, k, v, causal=causal, softmax_scale=scale,
                                                         kernel=args.fwd_kernel),
                                3, 10)
                for name in args.schedules:
                    if name == "shift" and causal or name == "symmetric_shift" and not causal:
                        continue
                    calls = [lambda det=det: runtime.backward(
                        do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                        deterministic=det, schedule=name, num_workers=sms, kernel=args.kernel)
                        for det in (True, False)]
                    res = [median_ms(call, 3, 10) for call in calls]
                    tag = f"d{d} {'causal' if causal else 'full'} s{s} b{batch} h{heads}"
                    parts = ""
                    if args.kernels:
                        us = kernel_us(calls[0])
                        parts = "  " + " ".join(f"{part} {us[part]:.1f} us"
                                                for part in ("preprocess", "main", "convert")
                                                if part in us)
                    print(f"{tag:<32} {name:<16} {flops / fwd / 1e9:>9.1f} "
                          f"{2.5 * flops / res[0] / 1e9:>9.1f} {2.5 * flops / res[1] / 1e9:>10.1f}"
                          f"{parts}", flush=True)


def compare(args, sms: int) -> None:
    """Main-kernel and total kernel time of the deterministic backward, option at its default
    and switched, on the same inputs (the auto schedule's order: shift / symmetric_shift)."""
    name = args.compare
    setting = runtime.SM90_BWD_OPTIONS[name]
    print(f"{name}: dashgen's default -> switched")
    print(f"{'config':<28} {'main us':>9} {'switched':>9} {'ratio':>6} {'all us':>8} "
          f"{'switched':>9} {'ratio':>6}")
    for d in args.hdims:
        # None in SM90_BWD_OPTIONS: the config's own default at this head_dim.
        default = getattr(Sm90BwdConfig("bf16", d, False), name) if setting is None else setting
        refusal = (sm90_bwd_refusal(d, False, **{name: default})
                   or sm90_bwd_refusal(d, False, **{name: not default}))
        if refusal:
            print(f"d{d}: {refusal}")
            continue
        print(f"d{d}: {name} {default} -> {not default}")
        for causal in (False, True):
            for s in args.seqlens:
                _, _, q, k, v, do, o, lse, scale = problem_inputs(d, causal, s)
                schedule = "symmetric_shift" if causal else "shift"
                times = []
                for value in (default, not default):
                    runtime.SM90_BWD_OPTIONS[name] = value
                    times.append(kernel_us(lambda: runtime.backward(
                        do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                        deterministic=True, schedule=schedule, num_workers=sms,
                        kernel=args.kernel)))
                runtime.SM90_BWD_OPTIONS[name] = setting
                main = [t["main"] for t in times]
                total = [sum(t.values()) for t in times]
                tag = f"d{d} {'causal' if causal else 'full'} s{s}"
                print(f"{tag:<28} {main[0]:>9.1f} {main[1]:>9.1f} {main[1] / main[0]:>6.3f} "
                      f"{total[0]:>8.1f} {total[1]:>9.1f} {total[1] / total[0]:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
