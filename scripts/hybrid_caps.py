"""hybrid's bound in the simulator's kernel model: the makespan of `bench --varlen`'s packs
(16,384 tokens, seeds 0-2) under the ordered schedule (fa3 full, descending causal) and under
hybrid with a bound of 4-128 KV tiles (under a causal mask half as many units), 132 workers. The model has no L2, so it charges the
shift orders their waits and idle wave tails and credits nothing for their reuse
(docs/design.md, `pack-auto`).

PYTHONPATH=. python3 scripts/hybrid_caps.py [--hdim 128]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from dashgen.codegen.variants import backward_tiles  # noqa: E402
from dashgen.schedule.builders import get_builder, hybrid_policy  # noqa: E402
from dashgen.schedule.builders.base import assemble  # noqa: E402
from dashgen.schedule.problem import Problem  # noqa: E402
from dashgen.tools.bench_varlen import document_lengths  # noqa: E402
from dashgen.tools.kernel_model import KernelCost, kernel_makespan  # noqa: E402

CAPS = (4, 8, 16, 32, 64, 128)  # KV tiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdim", type=int, default=128, choices=(64, 128))
    args = parser.parse_args()
    block_m, block_n = backward_tiles(args.hdim)
    print("mask   seed longest docs  ordered " + " ".join(f"{f'cap {c}':>7}" for c in CAPS))
    for mask in ("full", "causal"):
        ordered = get_builder("fa3" if mask == "full" else "descending")
        for seed in range(3):
            lengths = document_lengths(16384, seed)
            problem = Problem.pack(lengths, heads_q=2048 // args.hdim, head_dim=args.hdim,
                                   mask=mask, block_m=block_m, block_n=block_n)
            spans = [kernel_makespan(assemble(p, problem, 132), KernelCost())
                     for p in (ordered, *map(hybrid_policy, CAPS))]
            print(f"{mask:<6} {seed:>4} {max(lengths):>7} {len(lengths):>4} "
                  + " ".join(f"{s:>8.0f}" if i == 0 else f"{s:>7.0f}" for i, s in enumerate(spans)),
                  flush=True)


if __name__ == "__main__":
    main()
