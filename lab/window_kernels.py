"""Where a windowed backward call's GPU time goes, kernel by kernel: the preprocess, main and
convert kernels of one deterministic backward, 16,384 tokens of 16 heads at head_dim 128, at
windows (127, 0), (1023, 0) and the causal mask (torch.profiler, device time per call, mean of 5
after 3 warm-ups). Their sum set against a call's CUDA-event time (lab/window_timing.py)
bounds what the host path and launches add, once both run in the same process.

PYTHONPATH=. python3 lab/window_kernels.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import dashgen  # noqa: E402


def main() -> None:
    q, k, v, do = (torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    print(torch.cuda.get_device_name())
    for left in (127, 1023, None):
        kw = dict(causal=True, window_size=(-1, -1) if left is None else (left, 0),
                  deterministic=True)
        o = dashgen.attention(q, k, v, **kw)
        for _ in range(3):
            torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
        print("window", left)
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t > 0:
                print(f"  {e.key[:70]:70s} {t / e.count:9.1f} us x{e.count}")


if __name__ == "__main__":
    main()
