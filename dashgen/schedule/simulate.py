"""Simulate a schedule under the DASH paper's cost model: when each task computes and reduces.

The result is the longest path through program order plus rank edges, so schedules can be
compared (and their deadlocks found) before any kernel runs.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Union

from ..caches import memo
from .ir import Schedule, Task
from .problem import Problem

CostFn = Callable[[Task, Problem], float]
CostValue = Union[float, CostFn]


def _check_number(name: str, value: object) -> None:
    # `not value >= 0` also rejects NaN, which would silently poison every max() downstream.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"cost.{name} must be a non-negative number"
                         f"{' or a callable(task, problem)' if name != 'signal_latency' else ''}"
                         f", got {value!r}")


def _resolve(name: str, value: CostValue, task: Task, problem: Problem) -> float:
    if not callable(value):
        return float(value)
    result = value(task, problem)
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not result >= 0:
        raise ValueError(f"cost.{name} returned {result!r} for task {task.label()}: "
                         f"costs must be non-negative numbers")
    return float(result)


@memo(max_entries=1 << 16)
def _kept_fraction(problem: Problem, n_block: int, m_block: int, batch: int | None) -> float:
    # Problem.kept_fraction loops over rows; large schedules ask for the same few tiles per head.
    return problem.kept_fraction(n_block, m_block, batch)


@dataclass(frozen=True)
class _MaskedCompute:
    """c scaled by the fraction of the tile the mask keeps (a named callable, so Cost has a repr)."""

    c: float

    def __call__(self, task: Task, problem: Problem) -> float:
        # A pack's tiles differ per sequence, the others' only per tile.
        batch = task.batch if problem.is_pack else None
        return self.c * _kept_fraction(problem, task.n_block, task.m_block, batch)


@dataclass(frozen=True)
class Cost:
    """Costs of the model, in any consistent unit; c, r and dkv_r may be callables(task, problem).

    signal_latency is added when a wait is released by another worker (same worker: none).
    dkv_r is the dK/dV add at the end of a segment under GQA (None: same as r); without GQA the
    dK/dV write is private to its worker and not modelled.
    """

    c: CostValue = 1.0
    r: CostValue = 0.2
    signal_latency: float = 0.0
    dkv_r: CostValue | None = None

    def __post_init__(self) -> None:
        for name in ("c", "r", "dkv_r"):
            value = getattr(self, name)
            if not (callable(value) or (name == "dkv_r" and value is None)):
                _check_number(name, value)
        _check_number("signal_latency", self.signal_latency)

    @classmethod
    def masked(cls, c: float = 1.0, r: CostValue = 0.2, signal_latency: float = 0.0,
               dkv_r: CostValue | None = None) -> "Cost":
        """Compute cost proportional to the kept part of the tile (causal diagonal tiles ~ c/2)."""
        _check_number("c", c)
        return cls(_MaskedCompute(float(c)), r, signal_latency, dkv_r)

    def compute(self, task: Task, problem: Problem) -> float:
        return _resolve("c", self.c, task, problem)

    def reduce(self, task: Task, problem: Problem) -> float:
        return _resolve("r", self.r, task, problem)

    def dkv_reduce(self, task: Task, problem: Problem) -> float:
        if not problem.gqa:
            return 0.0
        return _resolve("dkv_r", self.r if self.dkv_r is None else self.dkv_r, task, problem)


class SimulationDeadlock(RuntimeError):
    """No worker can advance but tasks remain: a rank cycle or a rank nobody writes."""


@dataclass(frozen=True, slots=True)
class Event:
    """One executed task; dkv_start/dkv_end are set on the last task of a segment under GQA.

    reduce_start - compute_end is the time the worker waited for the dQ counter.
    """

    worker: int
    position: int
    task: Task
    compute_start: float
    reduce_start: float
    reduce_end: float
    compute_end: float
    dkv_start: float | None = None
    dkv_end: float | None = None


@dataclass(frozen=True)
class SimResult:
    makespan: float
    lower_bound: float  # total work / num_workers
    busy: list[float]   # per worker: compute + reductions
    idle: list[float]   # per worker: makespan - busy
    wait: list[float]   # per worker: time blocked on counters (part of idle)
    events: list[Event]  # the executed order, sorted by (compute_start, worker)

    @property
    def efficiency(self) -> float:
        return 1.0 if self.makespan == 0 else self.lower_bound / self.makespan

    @property
    def num_workers(self) -> int:
        return len(self.busy)


def _tile_name(key: tuple) -> str:
    kind, batch, head, block = key
    return (f"dQ tile (b{batch} h{head} m{block})" if kind == "dQ"
            else f"dK/dV tile (b{batch} kvh{head} n{block})")


def simulate(schedule: Schedule, cost: Cost = Cost()) -> SimResult:
    """Run every worker program under ``cost``; raise SimulationDeadlock if they cannot finish.

    Each task computes (c), waits until its dQ tile's counter equals its dq_rank, reduces (r) and
    increments the counter; the next task starts when the reduction ends. Under GQA the last task
    of a segment then does the same on its dK/dV tile's counter with dkv_rank (dkv_r).
    """
    problem = schedule.problem
    programs = schedule.workers
    if len(programs) != schedule.num_workers:
        raise ValueError(f"schedule has {len(programs)} worker programs but num_workers is "
                         f"{schedule.num_workers}")
    gqa = problem.gqa
    # Two tasks with one rank would race for the same counter value: the order is undefined,
    # not merely slow, so refuse it instead of simulating whichever happens to win.
    seen: dict[tuple, tuple[int, int]] = {}
    for w, prog in enumerate(programs):
        for p, t in enumerate(prog):
            keys = [("dQ", t.batch, t.head, t.m_block, t.dq_rank)]
            if gqa and (p + 1 == len(prog) or prog[p + 1].kv_tile != t.kv_tile):
                if t.dkv_rank is None:
                    raise ValueError(f"worker {w} position {p} ({t.label()}): GQA problem but "
                                     f"dkv_rank is None")
                keys.append(("dK/dV", t.batch, problem.kv_head(t.head), t.n_block, t.dkv_rank))
            for key in keys:
                if key in seen:
                    raise ValueError(f"{_tile_name(key[:4])} has two tasks with rank {key[4]}: "
                                     f"worker {seen[key][0]} position {seen[key][1]} and worker "
                                     f"{w} position {p}")
                seen[key] = (w, p)
    del seen

    c_const = None if callable(cost.c) else float(cost.c)
    r_const = None if callable(cost.r) else float(cost.r)
    lat = float(cost.signal_latency)
    n_workers = len(programs)
    # Counter state per tile: increments so far, when the last one landed and who made it.
    # Distinct ranks mean increments happen in rank order, so "count == rank" is the rank edge.
    state: dict[tuple, tuple[int, float, int]] = {}
    waiters: dict[tuple, int] = {}  # (tile key, count awaited) -> the worker blocked on it
    ready = deque(range(n_workers))

    def add(key: tuple, rank: int, w: int, t: float, duration: float) -> float | None:
        """Start time of an add that waits for counter == rank, or None (w is now a waiter)."""
        count, last_end, last_w = state.get(key, (0, 0.0, -1))
        if count != rank:
            waiters[(key, rank)] = w
            return None
        release = last_end + (lat if last_w != w and count else 0.0)
        start = release if release > t else t
        state[key] = (count + 1, start + duration, w)
        woken = waiters.pop((key, count + 1), None)
        if woken is not None:
            ready.append(woken)
        return start

    pos = [0] * n_workers
    now = [0.0] * n_workers
    # 0: compute next; 1: computed, awaiting the dQ counter; 2: awaiting the dK/dV counter; 3: done
    phase = [0] * n_workers
    pending: list[tuple[float, ...]] = [()] * n_workers  # (compute start, end, reduce start)
    busy = [0.0] * n_workers
    wait = [0.0] * n_workers
    events: list[Event] = []
    while ready:
        w = ready.popleft()
        prog, p, t, ph = programs[w], pos[w], now[w], phase[w]
        while p < len(prog):
            task = prog[p]
            if ph == 0:
                c = c_const if c_const is not None else cost.compute(task, problem)
                pending[w] = (t, t + c)
                t += c
                busy[w] += c
                ph = 1
            if ph == 1:
                r = r_const if r_const is not None else cost.reduce(task, problem)
                rs = add(("dQ", task.batch, task.head, task.m_block), task.dq_rank, w, t, r)
                if rs is None:
                    break
                wait[w] += rs - t
                t = rs + r
                busy[w] += r
                pending[w] += (rs,)
                ph = 2 if gqa and (p + 1 == len(prog) or prog[p + 1].kv_tile != task.kv_tile) else 3
            if ph == 2:
                d = cost.dkv_reduce(task, problem)
                kv = ("dK/dV", task.batch, problem.kv_head(task.head), task.n_block)
                ds = add(kv, task.dkv_rank, w, t, d)
                if ds is None:
                    break
                cs, ce, rs = pending[w]
                events.append(Event(w, p, task, cs, rs, t, ce, ds, ds + d))
                wait[w] += ds - t
                t = ds + d
                busy[w] += d
            else:  # ph == 3
                cs, ce, rs = pending[w]
                events.append(Event(w, p, task, cs, rs, t, ce))
            p += 1
            ph = 0
        pos[w], now[w], phase[w] = p, t, ph

    blocked = []
    for w, prog in enumerate(programs):
        if pos[w] < len(prog):
            task = prog[pos[w]]
            if phase[w] == 1:
                key, rank = ("dQ", task.batch, task.head, task.m_block), task.dq_rank
            else:
                key, rank = ("dK/dV", task.batch, problem.kv_head(task.head), task.n_block), task.dkv_rank
            blocked.append(f"worker {w} position {pos[w]} ({task.label()}): waits for {_tile_name(key)} "
                           f"counter == {rank}, counter is {state.get(key, (0,))[0]}")
    if blocked:
        more = f"\n  ... and {len(blocked) - 10} more blocked workers" if len(blocked) > 10 else ""
        raise SimulationDeadlock(f"deadlock: {len(blocked)} workers blocked with tasks left (a rank "
                                 f"cycle, or a rank nobody writes):\n  " + "\n  ".join(blocked[:10])
                                 + more)

    makespan = max(now, default=0.0)
    events.sort(key=lambda e: (e.compute_start, e.worker))
    return SimResult(makespan=makespan, lower_bound=sum(busy) / schedule.num_workers, busy=busy,
                     idle=[makespan - b for b in busy], wait=wait, events=events)
