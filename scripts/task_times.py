"""The dQ hand-offs of the deterministic backward in time, from a traced run per configuration
(dashgen.tools.handoffs): the writers' waits for their rank, each worker's pace, how late a release
reaches the next writer. For modelling why one schedule's order costs more than another's.

PYTHONPATH=. python3 scripts/task_times.py --hdim 64 --seqlens 8192 16384 \
    --schedules shift fa3 --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen import build_schedule  # noqa: E402
from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.select import problem_for  # noqa: E402
from dashgen.tools.handoffs import handoffs, summarize  # noqa: E402

from time_kernels import (add_override_flags, kernel_us, overrides_from,  # noqa: E402
                          problem_inputs)


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--hdim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--schedules", nargs="+", default=["shift", "fa3"])
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="worker counts (default: the SM count)")
    parser.add_argument("--keep", nargs="*", default=[], metavar="SCHEDULE:SEQLEN:WORKERS",
                        help="also save these configurations' stamps (torch.save) under --out")
    parser.add_argument("--out", type=Path, required=True)
    add_override_flags(parser)
    args = parser.parse_args()
    overrides = overrides_from(args)
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    header = (f"{'config':<24} {'schedule':<9} {'W':>4} {'main us':>8} {'traced':>8} "
              f"{'cadence':>8} {'wait':>7} {'p90':>6} {'p99':>6} {'waited':>7} {'rel->acq':>9} "
              f"{'add':>6} {'rates':>6} {'finish':>7}")
    print(header)
    for s in args.seqlens:
        batch, heads, q, k, v, do, o, lse, scale = problem_inputs(args.hdim, args.causal, s,
                                                                  overrides)
        for name in args.schedules:
            for workers in args.workers or [sms]:
                call = lambda trace: backward(
                    do, q, k, v, o, lse, causal=args.causal, softmax_scale=scale,
                    deterministic=True, schedule=name, num_workers=workers, trace=trace,
                    overrides=overrides)
                main_us = kernel_us(lambda: call(False))["main"]
                traced_us = kernel_us(lambda: call(True))["main"]
                *_, trace = call(True)
                torch.cuda.synchronize()
                trace = trace.cpu()
                problem = problem_for(batch, heads, heads, s, s, args.hdim, args.causal)
                schedule = build_schedule(name, problem, workers)
                offsets = [0]
                for tasks in schedule.workers:
                    offsets.append(offsets[-1] + len(tasks))
                stamps = handoffs(trace, offsets)
                summary = summarize(stamps)
                tag = f"d{args.hdim} {'causal' if args.causal else 'full'} s{s}"
                results.append(dict(config=tag, schedule=name, workers=workers, main_us=main_us,
                                    traced_us=traced_us, **summary.as_dict()))
                print(f"{tag:<24} {name:<9} {workers:>4} {main_us:>8.0f} {traced_us:>8.0f} "
                      f"{summary.cadence['mean']:>8.0f} {summary.wait['mean']:>7.0f} "
                      f"{summary.wait['p90']:>6.0f} {summary.wait['p99']:>6.0f} "
                      f"{summary.waited_share:>7.3f} {summary.release_to_acquire['p50']:>9.0f} "
                      f"{summary.add['mean']:>6.0f} {summary.worker_rate_spread:>6.3f} "
                      f"{summary.finish_spread_ns / 1e3:>7.1f}", flush=True)
                if f"{name}:{s}:{workers}" in args.keep:
                    torch.save(dict(rows=trace[:, :6].to(torch.int16), ready=stamps.ready.int(),
                                    acquired=stamps.acquired.int(), landed=stamps.landed.int(),
                                    offsets=torch.tensor(offsets)),
                               args.out / f"stamps_{name}_{s}_{workers}.pt")
    (args.out / "task_times.json").write_text(json.dumps(results, indent=1))
    print("ns: cadence = a task's time at its writer, wait = for the rank, rel->acq = a release "
          "to the next writer's acquire (median over tasks that waited), rates = slowest / "
          "fastest worker's pace, finish = spread of the workers' last adds (us)")


if __name__ == "__main__":
    main()
