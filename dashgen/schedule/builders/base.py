"""What every schedule builder shares: launch units, the persistent deal, and rank policies.

A builder only decides two things: the launch order of its units (a unit is one or more KV
segments that run back to back on one worker) with each segment's Q-tile order, and how ranks
follow from that. Dealing units to workers and numbering ranks is common code, so every
builder gets the same guarantees (coverage by construction, acyclic rank edges).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from ..ir import Schedule, Task
from ..problem import Problem


class UnsupportedProblem(ValueError):
    """A builder cannot serve this problem; the message says why and what to use instead."""

    def __init__(self, schedule: str, reason: str):
        super().__init__(f"schedule {schedule!r} cannot serve this problem: {reason}")
        self.schedule = schedule
        self.reason = reason


@dataclass(frozen=True)
class Segment:
    """One KV tile of one query head and the order in which it visits its Q tiles."""

    batch: int
    head: int
    n_block: int
    m_order: tuple[int, ...]


Unit = list[Segment]
# launch: a contribution's rank is its segment's position in the launch order (never waits on a
#   later launch, so the rank edges follow program order and cannot deadlock).
# arrival: ranks follow (depth in the worker program, worker): the order the adds arrive in when
#   all tasks cost the same, which is what Lemma 1 asks for.
RankPolicy = Literal["launch", "arrival"]


@dataclass(frozen=True)
class Builder:
    name: str
    summary: str
    units: Callable[[Problem, int], list[Unit]]
    rank_policy: RankPolicy
    depends_on_workers: bool
    supports: Callable[[Problem], str | None]  # None when served, else the reason it is not
    doc: str = ""


def deal(units: list[Unit], num_workers: int) -> list[list[tuple[int, Segment]]]:
    """Static persistent scheduling: unit i goes to worker i mod W, in launch order.

    Returns per worker its (segment launch index, segment) list.
    """
    programs: list[list[tuple[int, Segment]]] = [[] for _ in range(num_workers)]
    index = 0
    for i, unit in enumerate(units):
        for seg in unit:
            programs[i % num_workers].append((index, seg))
            index += 1
    return programs


def fewest_workers(units: int, num_workers: int) -> int:
    """The fewest workers that deal `units` in as many rounds as `num_workers` do."""
    if units <= 0:
        return num_workers
    return -(-units // -(-units // num_workers))


def wave_of(unit_index: int, num_workers: int) -> tuple[int, int]:
    """(wave, worker) of a unit under :func:`deal`."""
    return divmod(unit_index, num_workers)


def assemble(name: str, problem: Problem, num_workers: int, units: list[Unit],
             policy: RankPolicy, depends_on_workers: bool) -> Schedule:
    """Deal the units, number dq/dkv ranks by the policy, and produce the Schedule."""
    programs = deal(units, num_workers)
    launch = policy == "launch"
    # Contributions per dQ / dK-dV tile as (order key, worker, depth or segment): sorted, their
    # positions are the ranks. The key is the segment's launch index, or (depth, worker), flat.
    dq: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    dkv: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for w, program in enumerate(programs):
        depth = 0
        for seg_index, (launch_index, segment) in enumerate(program):
            b, h = segment.batch, segment.head
            for m in segment.m_order:
                dq.setdefault((b, h, m), []).append((launch_index if launch else depth, w, depth))
                depth += 1
            kv = (b, problem.kv_head(h), segment.n_block)
            dkv.setdefault(kv, []).append((launch_index if launch else depth - 1, w, seg_index))
    dq_rank = [[0] * sum(len(seg.m_order) for _, seg in program) for program in programs]
    for items in dq.values():
        for r, (_, w, d) in enumerate(sorted(items)):
            dq_rank[w][d] = r
    dkv_rank = [[0] * len(program) for program in programs]
    for items in dkv.values():
        for r, (_, w, s) in enumerate(sorted(items)):
            dkv_rank[w][s] = r
    workers: list[list[Task]] = []
    for w, program in enumerate(programs):
        tasks: list[Task] = []
        ranks = dq_rank[w]
        for seg_index, (_, seg) in enumerate(program):
            rank_kv = dkv_rank[w][seg_index] if problem.gqa else None
            for m in seg.m_order:
                tasks.append(Task(seg.batch, seg.head, seg.n_block, m, ranks[len(tasks)], rank_kv))
        workers.append(tasks)
    return Schedule(name=name, problem=problem, num_workers=num_workers, workers=workers,
                    depends_on_workers=depends_on_workers)
