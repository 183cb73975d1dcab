"""One forward, dashgen's or SDPA cuDNN's, between cudaProfilerStart and cudaProfilerStop after
three warm-up calls, on the benchmark's inputs (dashgen.tools.bench: 16,384 tokens, hidden
2048, bf16), for Nsight Compute run with --profile-from-start off
(scripts/ncu_forward_stalls.sh): the report holds that call's kernels alone.

python3 scripts/ncu_forward.py --impl dashgen|cudnn --head-dim 64 --mask full --seqlen 4096
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dashgen.tools.bench import (Config, make_inputs, setup_dashgen_forward,  # noqa: E402
                                 setup_sdpa_forward)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=("dashgen", "cudnn"), required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--mask", choices=("full", "causal"), required=True)
    ap.add_argument("--seqlen", type=int, required=True)
    ap.add_argument("--list", action="store_true",
                    help="instead: print the kernels one call launches (torch.profiler)")
    args = ap.parse_args()
    cfg = Config(args.seqlen, args.head_dim, args.mask, tokens=16384, hidden=2048)
    inputs = make_inputs(cfg)
    call = (setup_dashgen_forward(cfg, inputs) if args.impl == "dashgen"
            else setup_sdpa_forward(cfg, inputs, "CUDNN_ATTENTION"))
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    if args.list:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                print(f"{event.time_range.elapsed_us():10.1f} us  {event.name}")
        return
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
