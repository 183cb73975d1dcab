"""Lowering: a verified Schedule becomes the task table the backward kernel walks.

The table is the IR packed four int32 per task, workers back to back, so decoding it gives the
schedule back exactly (tests/test_lower.py proves the round trip on every builder).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

from .ir import Schedule, Task
from .problem import Problem

TASK_WORDS = 4  # batch << 16 | head, n_block << 16 | m_block, dq_rank, dkv_rank (-1: none)
_LIMIT = 1 << 15  # fields share an int32 in pairs; keep both halves non-negative


@dataclass(frozen=True)
class KernelPlan:
    """What the backward kernel needs from a schedule: the task table and each worker's range."""

    schedule_name: str
    problem: Problem
    num_workers: int
    tasks: array          # int32, TASK_WORDS per task, worker 0's tasks first
    worker_offsets: array  # int32, num_workers + 1 entries

    @property
    def num_tasks(self) -> int:
        return len(self.tasks) // TASK_WORDS


def _check_range(problem: Problem) -> None:
    for name, value in (("batch", problem.batch), ("heads_q", problem.heads_q),
                        ("num_n_blocks", problem.num_n_blocks),
                        ("num_m_blocks", problem.num_m_blocks)):
        if value >= _LIMIT:
            raise ValueError(f"{name} = {value} does not fit the task table (limit {_LIMIT - 1})")


def lower(schedule: Schedule) -> KernelPlan:
    _check_range(schedule.problem)
    tasks = array("i")
    offsets = array("i", [0])
    for program in schedule.workers:
        for t in program:
            tasks.extend((t.batch << 16 | t.head, t.n_block << 16 | t.m_block, t.dq_rank,
                          -1 if t.dkv_rank is None else t.dkv_rank))
        offsets.append(len(tasks) // TASK_WORDS)
    return KernelPlan(schedule.name, schedule.problem, schedule.num_workers, tasks, offsets)


def decode(plan: KernelPlan) -> list[list[Task]]:
    """The per-worker task lists a kernel walking `plan` executes (the inverse of lower)."""
    workers = []
    for w in range(plan.num_workers):
        program = []
        for i in range(plan.worker_offsets[w], plan.worker_offsets[w + 1]):
            bh, nm, dq_rank, dkv_rank = plan.tasks[TASK_WORDS * i: TASK_WORDS * (i + 1)]
            program.append(Task(bh >> 16, bh & 0xFFFF, nm >> 16, nm & 0xFFFF, dq_rank,
                                None if dkv_rank < 0 else dkv_rank))
        workers.append(program)
    return workers
