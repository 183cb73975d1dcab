"""One packed (or fixed-length) backward for Nsight Compute: d128 causal, 16 x 1024 tokens, 16
heads, three backwards of one forward. CASE is `fixed` (the batch of 16 x 1024, auto) or
`pack_<schedule>` (the same tokens as a pack under that schedule). docs/design.md `pack-gap`
profiles the third backward's main kernel:

ncu --clock-control none --kernel-name regex:"^dashgen_bwd.*(det|ekv|varlen|fconv)$" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats -o OUT python3 scripts/pack_ncu.py CASE

(the kernel-name filter, not NVTX: autograd launches the backward from its own thread).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
import dashgen  # noqa: E402

SEQS, SEQLEN, HEADS, HEAD_DIM = 16, 1024, 16, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="fixed, or pack_<schedule> (e.g. pack_descending)")
    case = parser.parse_args().case
    total = SEQS * SEQLEN
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(total, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(4))
    if case == "fixed":
        q, k, v, do = (t.view(SEQS, SEQLEN, HEADS, HEAD_DIM) for t in (q, k, v, do))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = dashgen.attention(q, k, v, causal=True, deterministic=True)
    elif case.startswith("pack_"):
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        cu = torch.tensor([0, *itertools.accumulate([SEQLEN] * SEQS)], dtype=torch.int32,
                          device="cuda")
        o = dashgen.attention_varlen(q, k, v, cu, cu, SEQLEN, SEQLEN, causal=True,
                                     deterministic=True, schedule=case[len("pack_"):])
    else:
        parser.error(f"case must be fixed or pack_<schedule>, got {case!r}")
    for _ in range(3):
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
