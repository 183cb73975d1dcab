"""The one schedule that travels as data: a verified schedule file's task table on the GPU
(dashgen.runtime.tables names it), and the trace's per-worker row offsets. Named schedules need
neither (their policy is compiled in), but a listed one's deal of units (4 bytes a unit). A
table costs 16 bytes a task in device memory (dashgen.schedule.lower), the only schedule memory
that grows with the number of tasks."""
from __future__ import annotations

from array import array
from itertools import accumulate

import torch

from ..caches import memo
from ..schedule.builders import get_builder, schedule_loads
from ..schedule.builders.base import deal_words, list_deal
from ..schedule.lower import lower
from ..schedule.problem import Problem
from .device import allocation_stream
from .tables import is_table, table_of


def int32_tensor(words) -> torch.Tensor:
    """An int32 array as a CPU tensor that owns its memory: read as a buffer, then cloned."""
    if not len(words):
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(words, dtype=torch.int32).clone()


@memo(max_entries=8)
def device_tables(key: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The schedule file's task table and worker offsets on `device`, and the stream they were
    allocated on: a call on another stream must record its use of them."""
    plan = lower(table_of(key))
    return (int32_tensor(plan.tasks).to(device), int32_tensor(plan.worker_offsets).to(device),
            allocation_stream(device))


@memo(max_entries=8)
def device_deal(problem: Problem, schedule: str, num_workers: int,
                device: torch.device) -> tuple[torch.Tensor, int]:
    """A listed schedule's deal on `device` (BwdParams::unit_deal: the workers + 1 offsets into
    the array, then each worker's global units), and the stream it was allocated on. 4 bytes a
    unit: 128 KiB for one 262,144-token sequence of 16 heads at head_dim 128."""
    words = array("i", deal_words(list_deal(get_builder(schedule), problem, num_workers)))
    return int32_tensor(words).to(device), allocation_stream(device)


def trace_offsets(problem: Problem, schedule: str, num_workers: int) -> list[int]:
    """Where each worker's rows start in a traced backward's rows (the IR's order, worker 0
    first), and the total: from the unit sizes, no tasks built."""
    if is_table(schedule):
        return list(lower(table_of(schedule)).worker_offsets)
    return [0, *accumulate(schedule_loads(schedule, problem, num_workers))]
