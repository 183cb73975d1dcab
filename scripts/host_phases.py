"""Where the host time of one backward goes, phase by phase, and on which thread: timestamps
(time.perf_counter_ns) taken in the main thread around torch.autograd.grad, at the entry of the
eager autograd node's backward, at the entry and exit of the backward's prepared call
(runtime.BackwardCall, built by the forward), and around each kernel launch. The same runtime.backward is also timed called directly on the main thread and on a
second Python thread, to tell a cost of the autograd device thread from one of our code.

Medians over calls, each after a synchronize (the GPU idle, as the benchmark times them).

PYTHONPATH=. python3 scripts/host_phases.py [--seqlen 1024] [--hdim 64] [--causal]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import launch, op, runtime  # noqa: E402
from dashgen.op import attention  # noqa: E402

from time_kernels import problem_inputs  # noqa: E402  (scripts/ is on sys.path)

_MARKS: list[tuple[str, int]] = []


def mark(name: str) -> None:
    _MARKS.append((name, time.perf_counter_ns()))


def instrument() -> None:
    """Wrap the functions whose entry and exit are phases (a diagnostic: never in the library)."""
    node_backward = op._EagerAttention.backward
    call_backward, call = runtime.BackwardCall.__call__, launch.Launcher.__call__

    def node_backward_marked(ctx, grad_o):
        mark("node backward entered")
        return node_backward(ctx, grad_o)

    def call_backward_marked(self, do):
        mark("prepared backward called")
        out = call_backward(self, do)
        mark("prepared backward returned")
        return out

    def call_marked(self, stream, addresses):
        kind = next((s for s in ("preprocess", "convert") if self.kernel.name.endswith(s)), "main")
        mark(f"launch {kind} start")
        call(self, stream, addresses)
        mark(f"launch {kind} done")

    op._EagerAttention.backward = staticmethod(node_backward_marked)
    runtime.BackwardCall.__call__ = call_backward_marked
    launch.Launcher.__call__ = call_marked


def phases(fn, calls: int) -> list[tuple[str, float]]:
    """Median us from the call's start to each mark (marks named alike are numbered)."""
    per_call: dict[str, list[float]] = {}
    for _ in range(calls):
        torch.cuda.synchronize()
        _MARKS.clear()
        mark("call")
        fn()
        mark("returned")
        seen: dict[str, int] = {}
        start = _MARKS[0][1]
        for name, ns in _MARKS:
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name} #{seen[name]}"
            per_call.setdefault(key, []).append((ns - start) / 1e3)
    return [(key, statistics.median(v)) for key, v in per_call.items()]


def on_thread(fn):
    """fn run on a fresh Python thread each call (a second thread, as autograd's device thread
    is)."""
    def call():
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    return call


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--hdim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--after-flex", action="store_true",
                   help="then compile and run FlexAttention's backward (as the benchmark's peer "
                        "row does) and time the two main-thread paths again")
    args = p.parse_args()
    s, d = args.seqlen, args.hdim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = "symmetric_shift" if args.causal else "shift"
    batch, heads, q, k, v, do, o, lse, scale = problem_inputs(d, args.causal, s)
    ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(ql, kl, vl, causal=args.causal, schedule=schedule, num_workers=sms)
    instrument()

    def direct():
        return runtime.backward(do, q, k, v, o, lse, causal=args.causal, softmax_scale=scale,
                                deterministic=True, schedule=schedule, num_workers=sms)

    def autograd():
        return torch.autograd.grad(out, (ql, kl, vl), do, retain_graph=True)

    print(f"b{batch} h{heads} s{s} d{d} {'causal' if args.causal else 'full'} {schedule}; "
          f"median us since the call, {args.calls} calls; switch interval "
          f"{sys.getswitchinterval() * 1e3:.1f} ms, {threading.active_count()} Python threads")
    paths = [("runtime.backward, main thread", direct),
             ("runtime.backward, a second thread", on_thread(direct)),
             ("autograd.grad", autograd)]
    if args.after_flex:
        paths += [("FlexAttention compiled and run", lambda: flex_backward(args)),
                  ("runtime.backward, main thread, after flex", direct),
                  ("autograd.grad, after flex", autograd)]
    for name, fn in paths:
        for _ in range(5):  # warm-up
            fn()
        print(f"\n{name}")
        for key, us in phases(fn, args.calls):
            print(f"  {key:<32} {us:8.1f}")


_FLEX_BACKWARD = []


def flex_backward(args):
    """The benchmark's FlexAttention row (torch.compile'd), set up on first call."""
    from dashgen import bench
    if not _FLEX_BACKWARD:
        cfg = bench.Config(args.seqlen, args.hdim, "causal" if args.causal else "full", 16384,
                           2048)
        _FLEX_BACKWARD.append(bench.setup_flex(cfg, bench.make_inputs(cfg)))
    return _FLEX_BACKWARD[0]()


if __name__ == "__main__":
    main()
