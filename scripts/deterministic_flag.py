"""The backward under torch.use_deterministic_algorithms(True), the setting our users train with.

torch then fills every new tensor with NaN; dashgen's runtime allocates its buffers without
that fill (runtime._allocator). This times one autograd backward (the benchmark's protocol)
three ways in one process: the flag off; the flag on (dashgen as shipped); the flag on with
the buffers filled (runtime._allocator forced to torch.empty, as before the change); and checks
that the three give the same bits.

PYTHONPATH=. python3 scripts/deterministic_flag.py [--configs 1024:64:causal 16384:128:full]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import runtime  # noqa: E402
from dashgen.bench import Config, make_inputs, median_ms, setup_dashgen  # noqa: E402


def timed(cfg: Config, inputs, flag: bool, fill: bool):
    """(median ms, grads) of the backward with the flag set and dashgen's buffers filled or not."""
    allocator = runtime._allocator
    if fill:
        runtime._allocator = lambda: runtime._empty
    torch.use_deterministic_algorithms(flag)
    try:
        backward = setup_dashgen(cfg, inputs, "auto", True, None)
        ms = median_ms(backward, 3, 20)
        grads = backward()
    finally:
        torch.use_deterministic_algorithms(False)
        runtime._allocator = allocator
    return ms, grads


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", nargs="+", default=["1024:64:causal", "1024:128:full",
                                                    "4096:64:causal", "16384:128:full"])
    args = p.parse_args()
    print(f"{'config':<20} {'flag off ms':>12} {'flag on ms':>11} {'on, filled ms':>14} "
          f"{'filled/on':>10} {'same bits':>10}")
    for text in args.configs:
        seqlen, head_dim, mask = text.split(":")
        cfg = Config(int(seqlen), int(head_dim), mask, 16384, 2048)
        inputs = make_inputs(cfg)
        results = [timed(cfg, inputs, flag, fill)
                   for flag, fill in ((False, False), (True, False), (True, True))]
        same = all(torch.equal(a, b) for _, grads in results[1:]
                   for a, b in zip(results[0][1], grads))
        (off, _), (on, _), (filled, _) = results
        print(f"d{head_dim} {mask} {seqlen:<10} {off:>12.3f} {on:>11.3f} {filled:>14.3f} "
              f"{filled / on:>10.3f} {str(same):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
