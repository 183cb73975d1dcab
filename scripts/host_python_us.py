"""dashgen's own Python per forward call, without a GPU: `runtime.forward.forward` and
`attention()` under no_grad on CPU tensors, with the driver stubbed (no launch, no descriptor
encoding) and the outputs reused (no allocation), as tests/test_runtime_launches.py runs the host
path. The kernels compile with NVRTC (cached) for their handles. Each figure is the least median
of `--blocks` blocks of `--calls` calls: a shared CPU drifts between clock states, and the least
block is the one the code's cost decides.

python3 scripts/host_python_us.py [--hdim 128] [--seqlen 1024] [--causal]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dashgen.runtime import backward as runtime_backward  # noqa: E402
from dashgen.runtime import forward as runtime_forward  # noqa: E402
from dashgen.runtime import launch, op  # noqa: E402


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
    for module in (runtime_forward, runtime_backward):
        module.stream = lambda device: 0
        module.sm_count = lambda device: 132
    pool: dict[tuple, torch.Tensor] = {}

    def reuse(shape, dtype, device):
        key = (tuple(shape), dtype)
        if key not in pool:
            pool[key] = torch.empty(shape, dtype=dtype)
        return pool[key]

    runtime_forward.allocator = lambda: reuse
    op._DEVICE_TYPE = "cpu"
    op._device_facts = lambda index: (9, 0, 132, "NVIDIA H200")


def least_median_us(fn, calls: int, blocks: int) -> float:
    for _ in range(200):
        fn()
    medians = []
    for _ in range(blocks):
        times = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - start)
        medians.append(statistics.median(times) / 1e3)
    return min(medians)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=600)
    p.add_argument("--blocks", type=int, default=8)
    args = p.parse_args()
    stub_the_device()
    d, s = args.hdim, args.seqlen
    q, k, v = (torch.randn(16384 // s, s, 2048 // d, d, dtype=torch.bfloat16) for _ in range(3))

    def runtime_call():
        return runtime_forward.forward(q, k, v, causal=args.causal, softmax_scale=d ** -0.5)

    def attention_no_grad():
        with torch.no_grad():
            return op.attention(q, k, v, causal=args.causal)

    mask = "causal" if args.causal else "full"
    print(f"d{d} s{s} {mask}: runtime.forward "
          f"{least_median_us(runtime_call, args.calls, args.blocks):.1f} us, attention no_grad "
          f"{least_median_us(attention_no_grad, args.calls, args.blocks):.1f} us")


if __name__ == "__main__":
    main()
