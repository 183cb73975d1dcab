"""A model of the backward kernel as built, for calibrating against measurements.

The DASH paper's chain (simulate.py: compute, then wait and reduce, then the next task) is the
model its closed forms hold for. dashgen's Hopper kernel decouples the two: the MMA warpgroups
compute task after task while a writer warp adds each dQ partial in rank order, with `buffers`
dQ tiles in flight between them. A worker's MMA stalls only when all buffers wait on the writer.
With `writers` lanes (BackwardVariant.dq_writers) lane j adds tasks j, j + writers, ... of its
worker, each lane in its order, so one task's add overlaps the next one's wait and add.
`ordered=False` models the non-deterministic mode: adds land as they come, nobody waits.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..schedule.ir import Schedule


@dataclass(frozen=True)
class KernelCost:
    """Per-task times in one unit (microseconds when calibrated).

    c: one task's MMA work; r: a writer lane's add of one dQ tile; signal_latency: a counter
    release seen by another worker; overhead: fixed time per backward (launches, pre- and
    post-processing); writers: the writer lanes a worker (at most `buffers`).
    """

    c: float = 1.0
    r: float = 0.2
    signal_latency: float = 0.0
    overhead: float = 0.0
    buffers: int = 2
    writers: int = 1

    def __post_init__(self) -> None:
        for name in ("c", "r", "signal_latency", "overhead"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if not isinstance(self.buffers, int) or self.buffers < 1:
            raise ValueError(f"buffers must be a positive int, got {self.buffers!r}")
        if (not isinstance(self.writers, int) or isinstance(self.writers, bool)
                or not 1 <= self.writers <= self.buffers):
            raise ValueError(f"writers must be an int from 1 to buffers ({self.buffers}), "
                             f"got {self.writers!r}")


def kernel_makespan(schedule: Schedule, cost: KernelCost, ordered: bool = True) -> float:
    """Finish time of the last worker (plus the fixed overhead); raises RuntimeError on a
    deadlock (a schedule that verify() rejects)."""
    if schedule.problem.gqa:
        raise ValueError("kernel_makespan models the kernel without GQA (the Hopper backward)")
    programs = schedule.workers
    n = len(programs)
    c, r, lat, k = float(cost.c), float(cost.r), float(cost.signal_latency), cost.buffers
    lanes = cost.writers
    computed = [0] * n                       # tasks whose MMA work is done
    mma_t = [0.0] * n                        # when the MMA warpgroups are free
    # Per worker and lane: the lane's next task (p = lane + lanes * i) and when it is free.
    next_task = [list(range(lanes)) for _ in range(n)]
    writer_t = [[0.0] * lanes for _ in range(n)]
    compute_end: list[list[float]] = [[] for _ in range(n)]
    write_end: list[list[float | None]] = [[None] * len(p) for p in programs]
    counters: dict[tuple, tuple[int, float, int]] = {}  # dQ tile -> (adds, last end, last worker)
    waiters: dict[tuple, int] = {}
    ready = deque(range(n))
    while ready:
        w = ready.popleft()
        prog = programs[w]
        while True:
            progressed = False
            # The MMA side runs ahead of the writers by at most `buffers` tasks: a task's MMAs
            # start at once, but it can only hand its dQ over once task p - buffers is written.
            while computed[w] < len(prog):
                p = computed[w]
                end = mma_t[w] + c
                if p >= k:
                    freed = write_end[w][p - k]
                    if freed is None:
                        break
                    end = max(end, freed)
                mma_t[w] = end
                compute_end[w].append(mma_t[w])
                computed[w] += 1
                progressed = True
            for lane in range(lanes):
                p = next_task[w][lane]
                if p >= computed[w]:
                    continue
                task = prog[p]
                key = task.dq_tile
                start = max(writer_t[w][lane], compute_end[w][p])
                if ordered:
                    count, last_end, last_w = counters.get(key, (0, 0.0, -1))
                    if count != task.dq_rank:
                        waiters[(key, task.dq_rank)] = w
                        continue
                    release = last_end + (lat if last_w != w and count else 0.0)
                    start = max(start, release)
                    counters[key] = (count + 1, start + r, w)
                    woken = waiters.pop((key, count + 1), None)
                    if woken is not None:
                        ready.append(woken)
                writer_t[w][lane] = start + r
                write_end[w][p] = writer_t[w][lane]
                next_task[w][lane] = p + lanes
                progressed = True
            if not progressed:
                break
    stuck = [w for w in range(n) if any(t < len(programs[w]) for t in next_task[w])]
    if stuck:
        raise RuntimeError(f"deadlock: workers {stuck[:10]} wait on dQ counters nobody releases")
    return max((max(mma_t[w], *writer_t[w]) for w in range(n)), default=0.0) + cost.overhead
