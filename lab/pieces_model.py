"""A model of the swapped backward's dQ hand-off (head_dim 192 and 256), where the kernel model
of dashgen.tools.kernel_model does not reach: there a task's dQ goes to the writer in pieces
through a staging buffer taken in turns, during the task's dQ MMAs, so the MMA warpgroups
cannot finish a task before the writer has taken its turn and read the pieces.

Per task on a worker, in one unit (c = a task's MMA work):
- the first piece is ready c * (1 - dq_share) after the task's MMAs start;
- the writer takes the tile's turn: after the first piece (the served writer) at
  max(writer free, first piece, release) + acquire, or first (turn_first, FA3's order) at
  max(writer free, release) + acquire;
- its add starts at max(turn, first piece), reads and lands the pieces in r; the turn passes
  then (a release seen by another worker signal_latency later);
- the MMA warpgroups finish the task at max(start + c, add start + r): the next task waits.
ordered=False: no turns. A prediction for where the ordered 256 backward loses 10-17% to the
unordered one, against measurements of lab/trace_waits.py; not calibrated.

PYTHONPATH=. python3 lab/pieces_model.py [--seqlen 16384] [--head-dim 256] [--mask full]
"""
from __future__ import annotations

import argparse
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from dashgen.schedule.ir import Schedule  # noqa: E402


@dataclass(frozen=True)
class PieceCost:
    c: float = 1.0               # a task's MMA work
    dq_share: float = 0.25       # of it, the dQ MMAs, during which the pieces are handed over
    r: float = 0.2               # the writer's reads and adds of a task's pieces, landed
    acquire: float = 0.1         # the load that takes a free turn (an L2 round trip)
    signal_latency: float = 0.05


def pieces_makespan(schedule: Schedule, cost: PieceCost, ordered: bool = True,
                    turn_first: bool = False) -> float:
    """Finish time of the last worker; RuntimeError on a deadlock."""
    programs = schedule.workers
    n = len(programs)
    done = [0] * n
    mma_t = [0.0] * n
    writer_t = [0.0] * n
    counters: dict[tuple, tuple[int, float, int]] = {}  # dQ tile -> (adds, landed, worker)
    waiters: dict[tuple, int] = {}
    ready = deque(range(n))
    while ready:
        w = ready.popleft()
        prog = programs[w]
        while done[w] < len(prog):
            task = prog[done[w]]
            first_piece = mma_t[w] + cost.c * (1 - cost.dq_share)
            if ordered:
                count, landed, last_w = counters.get(task.dq_tile, (0, 0.0, -1))
                if count != task.dq_rank:
                    waiters[(task.dq_tile, task.dq_rank)] = w
                    break
                release = landed + (cost.signal_latency if last_w not in (w, -1) else 0.0)
                if turn_first:
                    start = max(max(writer_t[w], release) + cost.acquire, first_piece)
                else:
                    start = max(writer_t[w], first_piece, release) + cost.acquire
            else:
                start = max(writer_t[w], first_piece)
            writer_t[w] = start + cost.r
            mma_t[w] = max(mma_t[w] + cost.c, writer_t[w])
            done[w] += 1
            if ordered:
                counters[task.dq_tile] = (task.dq_rank + 1, writer_t[w], w)
                woken = waiters.pop((task.dq_tile, task.dq_rank + 1), None)
                if woken is not None:
                    ready.append(woken)
    stuck = [w for w in range(n) if done[w] < len(programs[w])]
    if stuck:
        raise RuntimeError(f"deadlock: workers {stuck[:10]} wait on dQ counters nobody releases")
    return max(max(mma_t), max(writer_t)) if n else 0.0


def main() -> None:
    from dashgen import build_schedule
    from dashgen.runtime.select import problem_for, resolve_schedule
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--mask", choices=["full", "causal"], default="full")
    ap.add_argument("--workers", type=int, default=132)
    ap.add_argument("--acquire", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.2])
    ap.add_argument("--r", type=float, default=0.2)
    args = ap.parse_args()
    heads = 2048 // args.head_dim
    problem = problem_for(max(1, 16384 // args.seqlen), heads, heads, args.seqlen, args.seqlen,
                          args.head_dim, args.mask == "causal")
    name, workers = resolve_schedule(problem, "auto", None, args.workers)
    schedule = build_schedule(name, problem, workers)
    print(f"{problem.describe()}: {name} on {workers} workers, r={args.r}")
    print("| acquire | unordered | ordered, turn after the first piece | ordered, turn first |")
    print("|---|---|---|---|")
    for acq in args.acquire:
        cost = PieceCost(r=args.r, acquire=acq)
        base = pieces_makespan(schedule, cost, ordered=False)
        after = pieces_makespan(schedule, cost)
        first = pieces_makespan(schedule, cost, turn_first=True)
        print(f"| {acq} | 1 | {base / after:.3f} | {base / first:.3f} |")


if __name__ == "__main__":
    main()
