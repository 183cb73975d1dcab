"""Does the row timed before a row change its figure? For one ANCHORS.md configuration: the
deterministic backward of `--measured` (and of schedule="auto", which runs the same plan) timed
call by call right after `--warmup` calls of a slower schedule's backward (`--before`) or of
itself, alternated over blocks. Prints the median ms and TFLOP/s per predecessor and per
position of the timed call after the switch.

PYTHONPATH=. python3 scripts/row_order.py [--hdim 128] [--seqlen 16384] [--mask causal]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.bench import Config, event_ms, make_inputs, rows_for  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--mask", default="causal")
    parser.add_argument("--measured", default="symmetric_shift")
    parser.add_argument("--before", default="fa3")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=5)
    args = parser.parse_args()
    import torch
    cfg = Config(args.seqlen, args.hdim, args.mask, 16384, 2048)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    inputs = make_inputs(cfg)
    # The benchmark's own rows (worker counts included), set up for the three we time.
    plan = {row.label: (row, setup) for row, setup in
            rows_for(cfg, [args.measured, args.before], [], sms)}
    rows = {name: plan[f"dashgen_det {name}"] for name in (args.measured, args.before, "auto")}
    fns = {name: setup(inputs) for name, (_, setup) in rows.items()}
    print(f"auto runs {rows['auto'][0].picked} on {rows['auto'][0].num_workers} workers; "
          f"{args.measured} on {rows[args.measured][0].num_workers}")
    times = {}  # (measured, predecessor) -> [[ms at position 0..timed-1] per block]
    for block in range(args.blocks):
        for measured in (args.measured, "auto"):
            preds = (args.before, "itself") if block % 2 else ("itself", args.before)
            for pred in preds:
                warm = fns[measured if pred == "itself" else pred]
                for _ in range(args.warmup):
                    warm()
                times.setdefault((measured, pred), []).append(
                    [event_ms(fns[measured]) for _ in range(args.timed)])
    flops = cfg.flops(backward=True)
    print(f"head_dim {cfg.head_dim}, seqlen {cfg.seqlen}, {cfg.mask}: medians over "
          f"{args.blocks} blocks, after {args.warmup} calls of the predecessor")
    for (measured, pred), blocks in times.items():
        cols = [statistics.median(b[i] for b in blocks) for i in range(args.timed)]
        every = statistics.median(t for b in blocks for t in b)
        print(f"{measured} after {pred}: all {every:.3f} ms ({flops / every / 1e9:.1f}); "
              "by position, TFLOP/s:")
        for start in range(0, args.timed, 10):
            print("   " + " ".join(f"{flops / c / 1e9:6.1f}" for c in cols[start:start + 10]))


if __name__ == "__main__":
    main()
