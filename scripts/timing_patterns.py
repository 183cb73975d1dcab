"""How the order of timed calls moves a short backward's median: the same autograd call (d64
causal 1k by default) timed as one block (bench.median_ms), in rounds alone and in rounds beside
a second graph of the same op (bench.rounds_ms, as the benchmark times a configuration's rows),
then as one block again. The kernels and inputs are the same throughout; what differs is only
the order of the host's calls.

PYTHONPATH=. python3 scripts/timing_patterns.py [--seqlen 1024] [--hdim 64] [--causal]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.bench import event_ms, rounds_ms  # noqa: E402  (the protocol's timing)
from dashgen.op import attention  # noqa: E402

from time_kernels import problem_inputs  # noqa: E402  (scripts/ is on sys.path)


def spread(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10)
    return f"median {statistics.median(times):.3f}  p10 {q[0]:.3f}  p90 {q[-1]:.3f}"


def block(fn, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return [event_ms(fn) for _ in range(repeats)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--hdim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=60)
    args = p.parse_args()
    s, d = args.seqlen, args.hdim
    schedule = "symmetric_shift" if args.causal else "shift"
    batch, heads, q, k, v, do, o, lse, scale = problem_inputs(d, args.causal, s)
    flops = 2.5 * 4 * batch * heads * s * s * d / (2 if args.causal else 1)

    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def graph():
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        out = attention(*leaves, causal=args.causal, schedule=schedule, num_workers=sms)
        return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)

    a, b = graph(), graph()
    n = args.repeats
    patterns = [("one block", lambda: block(a, 3, n)),
                ("rounds, alone (6)", lambda: in_rounds({"a": a}, 6, repeats=n)["a"])]
    print(f"b{batch} h{heads} s{s} d{d} {'causal' if args.causal else 'full'} {schedule}; "
          f"ms per backward, {n} timed calls per pattern")
    results = []
    for name, run in patterns:
        gc.collect()
        results.append((name, run()))
    for rounds in (6, 2):
        gc.collect()
        per = in_rounds({"a": a, "b": b}, rounds, repeats=n)
        results.append((f"rounds beside a second graph ({rounds}), a", per["a"]))
        results.append((f"rounds beside a second graph ({rounds}), b", per["b"]))
    gc.collect()
    results.append(("one block, again", block(a, 3, n)))
    gc.collect()
    results.append(("one block, second graph", block(b, 3, n)))
    for name, times in results:
        print(f"  {name:<40} {spread(times)}  ({flops / statistics.median(times) / 1e9:.1f} "
              f"TFLOP/s)")


def in_rounds(fns: dict, rounds: int, warmup: int = 3, repeats: int = 60) -> dict:
    """Every timed call of bench.rounds_ms, by fn."""
    times = {key: [] for key in fns}
    names = {id(fn): key for key, fn in fns.items()}

    def time_once(fn):
        times[names[id(fn)]].append(event_ms(fn))
        return times[names[id(fn)]][-1]

    rounds_ms(fns, warmup, repeats, rounds=rounds, time_once=time_once)
    return times


if __name__ == "__main__":
    main()
