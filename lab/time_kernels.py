"""Quick timing of dashgen's forward and backward on the ANCHORS.md shapes (a subset), for
comparing kernel versions inside one device call. The full protocol is `dashgen bench`.

PYTHONPATH=. python3 lab/time_kernels.py [--seqlens 1024 4096] [--hdims 64 128]
    [--fused-convert on|off] [--early-kv on|off] [--persistent-forward on|off]
PYTHONPATH=. python3 lab/time_kernels.py --compare fused_convert|early_kv|persistent_forward

The --fused-convert, --early-kv and --persistent-forward flags (also used by gpu_check.py
and overhead.py) replace a per-problem policy of dashgen.runtime.select through
Overrides; without them the policy decides.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.forward import forward, forward_variant  # noqa: E402
from dashgen.runtime.select import Overrides, selection  # noqa: E402
from dashgen.tools.timing import median_ms  # noqa: E402  (the protocol's timing)

OVERRIDES = tuple(f.name for f in dataclasses.fields(Overrides))  # each policy select has


def add_override_flags(parser: argparse.ArgumentParser) -> None:
    """--fused-convert, --early-kv, --persistent-forward: on / off replaces select's policy."""
    group = parser.add_argument_group(
        "overrides", "replace a per-problem policy of dashgen.runtime.select (default: the "
                     "policy decides, per configuration)")
    for name in OVERRIDES:
        group.add_argument("--" + name.replace("_", "-"), choices=["on", "off"], default=None,
                           dest=name)


def override_value(name: str, on: bool) -> bool | int:
    """An override's value for on / off: dq_writers counts lanes (on: 2, off: 1)."""
    if name == "dq_writers":
        return 2 if on else 1
    return on


def override_on(name: str, value: bool | int) -> bool:
    """Whether an override's value is its "on" (override_value's, compared by name: True == 1
    in Python, so a bool test would call one dQ writer "on")."""
    return value == override_value(name, True)


def overrides_from(args: argparse.Namespace) -> Overrides:
    return Overrides(**{name: None if getattr(args, name) is None
                        else override_value(name, getattr(args, name) == "on")
                        for name in OVERRIDES})


def overrides_tag(overrides: Overrides) -> str:
    """A file-name suffix naming the overrides set: "" or "_fused_convert-off_early_kv-on"."""
    return "".join(f"_{name}-{'on' if override_on(name, value) else 'off'}"
                   for name, value in dataclasses.asdict(overrides).items() if value is not None)


def kernel_us(fn, calls: int = 10) -> dict[str, float]:
    """Median GPU time of each of dashgen's kernels over `calls` calls, in microseconds, keyed
    preprocess / main / convert (the forward's kernel is a "main"), from torch.profiler's CUDA
    activity."""
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


def problem_inputs(d: int, causal: bool, s: int, overrides: Overrides = Overrides()):
    """The ANCHORS.md shapes at one configuration: (batch, heads, q, k, v, do, o, lse, scale)."""
    heads, batch = 2048 // d, max(1, 16384 // s)  # one sequence past 16,384 tokens
    q, k, v, do = (torch.randn(batch, s, heads, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    scale = 1 / math.sqrt(d)
    o, lse = forward(q, k, v, causal=causal, softmax_scale=scale, overrides=overrides)
    return batch, heads, q, k, v, do, o, lse, scale


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--schedules", nargs="+", default=["fa3"],
                        help="schedules to time (default fa3; auto runs on the worker count it "
                             "picks, the others on the SM count)")
    add_override_flags(parser)
    parser.add_argument("--kernels", action="store_true",
                        help="also each deterministic backward kernel's GPU time (profiler)")
    parser.add_argument("--compare", choices=OVERRIDES,
                        help="instead: the kernels' GPU time with the policy's pick and with it "
                             "switched through Overrides, configuration by configuration")
    parser.add_argument("--unordered", action="store_true",
                        help="with --compare: the non-deterministic backward's kernels")
    return parser


def main():
    args = build_parser().parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.compare:
        compare(args.compare, args, sms)
        return
    overrides = overrides_from(args)
    print(f"{'config':<32} {'schedule':<16} {'fwd TF/s':>9} {'bwd det':>9} {'bwd nondet':>10}")
    for d in args.hdims:
        for causal in (False, True):
            for s in args.seqlens:
                batch, heads, q, k, v, do, o, lse, scale = problem_inputs(d, causal, s,
                                                                          overrides)
                flops = 4 * batch * heads * s * s * d / (2 if causal else 1)
                fwd = median_ms(lambda: forward(q, k, v, causal=causal, softmax_scale=scale,
                                                overrides=overrides), 3, 10)
                for name in args.schedules:
                    if name == "shift" and causal or name == "symmetric_shift" and not causal:
                        continue
                    # Named worker-dependent schedules need their count; auto picks its own.
                    workers = None if name == "auto" else sms
                    calls = [lambda det=det: backward(
                        do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                        deterministic=det, schedule=name, num_workers=workers,
                        overrides=overrides) for det in (True, False)]
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


def picked(name: str, q, k, causal: bool, sms: int, deterministic: bool = True) -> bool:
    """What select's policy `name` picks for these inputs (schedule auto)."""
    shapes, dtype = (tuple(q.shape), tuple(k.shape)), "bf16"
    if name == "persistent_forward":
        return forward_variant(*shapes, dtype, causal, sms, Overrides()).persistent
    sel = selection(*shapes, dtype, causal, deterministic, False, "auto", None, sms,
                    Overrides())
    return override_on(name, getattr(sel.backward, name))


def compare(name: str, args, sms: int) -> None:
    """The kernels' GPU time with select's pick for `name` and with it switched, on the same
    inputs: the forward kernel for persistent_forward, else the backward's kernels (auto
    schedule; deterministic unless --unordered). The other override flags set apply to both."""
    print(f"{name}: select's pick -> switched (Overrides)"
          + (", unordered backward" if args.unordered else ""))
    print(f"{'config':<24} {'pick':>5} {'main us':>9} {'switched':>9} {'ratio':>6} {'all us':>8} "
          f"{'switched':>9} {'ratio':>6}")
    for d in args.hdims:
        for causal in (False, True):
            for s in args.seqlens:
                _, _, q, k, v, do, o, lse, scale = problem_inputs(d, causal, s)
                pick = picked(name, q, k, causal, sms, not args.unordered)
                times = []
                for value in (pick, not pick):
                    # The other override flags given stay set on both sides.
                    overrides = dataclasses.replace(overrides_from(args),
                                                    **{name: override_value(name, value)})
                    if name == "persistent_forward":
                        call = lambda: forward(q, k, v, causal=causal, softmax_scale=scale,
                                               overrides=overrides)
                    else:
                        call = lambda: backward(do, q, k, v, o, lse, causal=causal,
                                                softmax_scale=scale,
                                                deterministic=not args.unordered,
                                                schedule="auto", num_workers=None,
                                                overrides=overrides)
                    times.append(kernel_us(call))
                main = [t["main"] for t in times]
                total = [sum(t.values()) for t in times]
                tag = f"d{d} {'causal' if causal else 'full'} s{s}"
                bits = ""
                if name == "persistent_forward":  # both kernels do each tile's arithmetic alike
                    outs = [forward(q, k, v, causal=causal, softmax_scale=scale,
                                    overrides=Overrides(persistent_forward=value))
                            for value in (True, False)]
                    same = all(torch.equal(a, b) for a, b in zip(*outs))
                    bits = "  o, lse: " + ("same bits" if same else "DIFFER")
                print(f"{tag:<24} {'on' if pick else 'off':>5} {main[0]:>9.1f} {main[1]:>9.1f} "
                      f"{main[1] / main[0]:>6.3f} {total[0]:>8.1f} {total[1]:>9.1f} "
                      f"{total[1] / total[0]:>6.3f}{bits}", flush=True)


if __name__ == "__main__":
    main()
