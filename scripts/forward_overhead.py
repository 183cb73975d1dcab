"""The forward's time outside its kernels, dashgen's beside SDPA cuDNN's, in the configurations
of `dashgen bench` (16,384 tokens a batch, 2048 / head_dim heads): the benchmark's reading (one
call between CUDA events on an idle GPU, median), the same call with its host time hidden behind
a GPU sleep (its GPU time), a CUDA-graph replay (its kernels alone) and its host time per call.
The first minus the second is host time the GPU waited for; the second minus the third, gaps
between its kernels. Rows alternate in rounds as the benchmark's do. Prints a table, writes JSON.

python3 scripts/forward_overhead.py --out DIR [--seqlens 1024,2048,16384] [--configs d64,d128]
    [--masks full,causal]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dashgen.tools.bench import (Config, make_inputs, setup_dashgen_forward,  # noqa: E402
                                 setup_sdpa_forward)
from dashgen.tools.timing import WARMUP_MS, commit_id, rounds_ms  # noqa: E402

from overhead import graph_replay_ms, hidden_ms, host_us  # noqa: E402  (scripts/)

HEAD_DIMS = {"d64": 64, "d128": 128}


def measure(cfg: Config) -> list[dict]:
    inputs = make_inputs(cfg)
    fns = {"dashgen": setup_dashgen_forward(cfg, inputs),
           "sdpa_cudnn": setup_sdpa_forward(cfg, inputs, "CUDNN_ATTENTION")}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    medians, errors = rounds_ms(fns, warmup=3, repeats=30, warmup_ms=WARMUP_MS)
    if errors:
        raise RuntimeError(f"{cfg}: {errors}")
    flops = cfg.flops(backward=False)
    rows = []
    for name, fn in fns.items():
        ms, gpu_ms, kernels_ms = medians[name], hidden_ms(fn), graph_replay_ms(fn)
        rows.append(dict(impl=name, seqlen=cfg.seqlen, head_dim=cfg.head_dim, mask=cfg.mask,
                         batch=cfg.batch, heads=cfg.heads, ms=ms, tflops=flops / ms / 1e9,
                         gpu_ms=gpu_ms, graph_ms=kernels_ms, host_us=host_us(fn),
                         exposed_host_us=(ms - gpu_ms) * 1e3))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", default="1024,2048,16384")
    ap.add_argument("--configs", default="d64,d128")
    ap.add_argument("--masks", default="full,causal")
    args = ap.parse_args()
    rows = []
    for name in args.configs.split(","):
        for mask in args.masks.split(","):
            for seqlen in map(int, args.seqlens.split(",")):
                cfg = Config(seqlen, HEAD_DIMS[name], mask, tokens=16384, hidden=2048)
                rows += measure(cfg)
                print(rows[-2], rows[-1], sep="\n", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "forward_overhead.json").write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), commit=commit_id(None),
        rows=rows), indent=1))
    print(f"{'config':<18} {'impl':<10} {'ms':>7} {'TFLOP/s':>8} {'gpu ms':>7} {'graph ms':>8} "
          f"{'host us':>8} {'exposed us':>10}")
    for r in rows:
        graph = "-" if r["graph_ms"] is None else f"{r['graph_ms']:.3f}"
        print(f"d{r['head_dim']} {r['mask']} {r['seqlen']:<9} {r['impl']:<10} {r['ms']:>7.3f} "
              f"{r['tflops']:>8.1f} {r['gpu_ms']:>7.3f} {graph:>8} {r['host_us']:>8.1f} "
              f"{r['exposed_host_us']:>10.1f}")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["head_dim"], r["mask"], r["seqlen"]), {})[r["impl"]] = r
    ratios = [(p["dashgen"]["ms"], p["sdpa_cudnn"]["ms"], p["dashgen"]["gpu_ms"],
               p["sdpa_cudnn"]["gpu_ms"]) for p in pairs.values()]
    print("fwd / cuDNN as the benchmark reads it: geomean "
          f"{statistics.geometric_mean([c / d for d, c, _, _ in ratios]):.3f}; with both host "
          f"times hidden: {statistics.geometric_mean([c / d for _, _, d, c in ratios]):.3f}")


if __name__ == "__main__":
    main()
