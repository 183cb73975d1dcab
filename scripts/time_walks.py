"""The backward's GPU time with a named schedule's policy against the same schedule walked as
a task table (the schedule-file path), alternated in one process: what computing the policy in
the scheduler lane costs, if anything. Prints a table.

python3 scripts/time_walks.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dashgen  # noqa: E402
from dashgen.runtime.select import problem_for, resolve_schedule  # noqa: E402
from dashgen.runtime.tables import register  # noqa: E402
from dashgen.schedule.builders import build_schedule  # noqa: E402

SHAPES = [(64, False, 16384), (128, False, 16384), (128, True, 16384), (64, True, 4096),
          (128, True, 1024)]


def gpu_ms(fn, calls=10, batches=7):
    for _ in range(3):
        fn()
    times = []
    for _ in range(batches):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / calls)
    return statistics.median(times)


print("| shape | schedule | workers | policy ms | table ms | table/policy | same bits |")
print("|---|---|---|---|---|---|---|")
for head_dim, causal, seqlen in SHAPES:
    heads, batch = 2048 // head_dim, 16384 // seqlen
    problem = problem_for(batch, heads, heads, seqlen, seqlen, head_dim, causal)
    name, workers = resolve_schedule(problem, "auto", None, 132)
    table = build_schedule(name, problem, workers)
    table.name = "table_of_" + name
    key = register(table)
    g = torch.Generator(device="cuda").manual_seed(seqlen)
    q, k, v, do = (torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                               dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    runs = {}
    for sched in (name, key):
        o = dashgen.attention(q, k, v, causal=causal, schedule=sched, num_workers=workers,
                              deterministic=True)
        runs[sched] = (o, torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    times = {name: [], key: []}
    for _ in range(3):
        for sched in (name, key):
            o = runs[sched][0]
            times[sched].append(gpu_ms(lambda: torch.autograd.grad(o, (q, k, v), do,
                                                                   retain_graph=True)))
    same = all(torch.equal(a, b) for a, b in zip(runs[name][1], runs[key][1]))
    a, b = statistics.median(times[name]), statistics.median(times[key])
    print(f"| d{head_dim}_{'causal' if causal else 'full'}_{seqlen} | {name} | {workers} | "
          f"{a:.3f} | {b:.3f} | {b / a:.3f} | {same} |", flush=True)
