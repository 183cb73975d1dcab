"""Python host time of the launch paths, without a GPU: runtime.forward, attention() under
no_grad, runtime.backward, building a BackwardCall and calling one, on CPU tensors with the
driver stubbed (no launch, no descriptor encoding) and the buffers reused (no allocation). What
is left is dashgen's own Python per call, the part autograd's device thread runs 2-4x slower
(docs/perf-notes.md). The kernels are compiled with NVRTC (cached) to get their handles.

PYTHONPATH=. python3 scripts/host_python_us.py [--seqlen 1024] [--hdim 64] [--calls 3000]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import launch, op, runtime  # noqa: E402


class _Map:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def getPtr(self):  # noqa: N802 (cuda-bindings' name)
        return self.ptr


class _Driver:
    """libcuda's entry points the runtime calls, doing nothing."""

    def cuCtxGetCurrent(self, out):  # noqa: N802
        out._obj.value = 1
        return 0

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return 0

    def cuLaunchKernel(self, *args):  # noqa: N802
        return 0


def stub_the_device() -> None:
    handles: list[str] = []
    launch.ensure_context = lambda device=0: None
    launch.load_kernel = lambda cubin, name: handles.append(name) or launch.Kernel(
        name, None, len(handles))
    launch.Kernel.set_max_dynamic_shared_bytes = lambda self, n: None
    launch.encode_tensor_map = lambda ptr, *a, **k: _Map(ptr)
    launch._LIBCUDA = _Driver()
    launch._PRIMARY[0] = 1
    runtime._stream = lambda device: 0
    pool: dict[tuple, torch.Tensor] = {}

    def reuse(shape, dtype, device):
        key = (tuple(shape), dtype)
        if key not in pool:
            pool[key] = torch.empty(shape, dtype=dtype)
        return pool[key]

    runtime._allocator = lambda: reuse
    op._DEVICE_TYPE = "cpu"
    op._device_facts = lambda index: (9, 0, 132, "NVIDIA H200")


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--hdim", type=int, default=64)
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args()
    stub_the_device()
    heads = 2048 // args.hdim
    q, k, v, o, do = (torch.randn(1, args.seqlen, heads, args.hdim, dtype=torch.bfloat16)
                      for _ in range(5))
    lse = torch.zeros(1, heads, args.seqlen)
    kw = dict(causal=True, softmax_scale=0.125, deterministic=True, schedule="symmetric_shift",
              num_workers=132, kernel="sm90")
    call = runtime.BackwardCall(q, k, v, o, lse, **kw)

    def no_grad():
        with torch.no_grad():
            return op.attention(q, k, v, causal=True)

    paths = [("runtime.forward", lambda: runtime.forward(q, k, v, causal=True,
                                                          softmax_scale=0.125)),
             ("attention(), no_grad", no_grad),
             ("runtime.backward", lambda: runtime.backward(do, q, k, v, o, lse, **kw)),
             ("BackwardCall(...)", lambda: runtime.BackwardCall(q, k, v, o, lse, **kw)),
             ("a BackwardCall, called", lambda: call(do))]
    print(f"d{args.hdim} causal seqlen {args.seqlen}, {heads} heads; median us of Python per "
          f"call over {args.calls} calls (driver stubbed, buffers reused)")
    for name, fn in paths:
        fn()  # builds what the first call builds
        print(f"  {name:<24} {median_us(fn, args.calls):7.1f}")


if __name__ == "__main__":
    main()
