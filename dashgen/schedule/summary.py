"""A named schedule in numbers: tasks per worker and the busiest worker against the bound
ceil(tasks / workers), from the unit sizes alone (no task is built: cheap at 1M tokens)."""
from __future__ import annotations

from dataclasses import dataclass

from .builders import Tiling, get_builder, schedule_loads
from .builders.base import pack_tilings
from .problem import Problem


def problem_tasks(problem: Problem) -> int:
    """The tasks of `problem` under any schedule: the tiles its mask keeps, in every sequence."""
    if problem.is_pack:
        return problem.heads_q * sum(sum(t.rows(n) for n in range(t.num_n))
                                     for t in pack_tilings(problem))
    tiling = Tiling(problem)  # closed forms under full and causal masks: no tile list
    return problem.batch * problem.heads_q * sum(tiling.rows(n) for n in range(tiling.num_n))


@dataclass(frozen=True)
class ScheduleSummary:
    """Per-worker task totals of one schedule on a launch of `num_workers` workers, of which it
    runs `workers_used` (shift and symmetric_shift: whole sequences' worth of units)."""

    name: str
    problem: Problem
    num_workers: int
    workers_used: int
    num_tasks: int
    min_load: int
    max_load: int
    busiest: int  # the first worker that carries max_load
    sequence_units: int  # units of one (batch, head) sequence (a pack: of its largest)
    total_units: int  # units of every (batch, head) sequence

    @property
    def mean_load(self) -> float:
        return self.num_tasks / self.workers_used

    @property
    def bound(self) -> int:
        """The fewest tasks the busiest worker can carry: over every worker of the launch, so
        the workers a schedule leaves idle count against it."""
        return -(-self.num_tasks // self.num_workers)

    @property
    def ratio(self) -> float:
        """The busiest worker's load over the bound (1.0: as balanced as the tasks allow)."""
        return self.max_load / self.bound if self.bound else 1.0


def summarize(name: str, problem: Problem, num_workers: int) -> ScheduleSummary:
    """The summary of schedule `name` on `num_workers` workers. Raises what build_schedule
    raises (UnsupportedProblem; ValueError for a worker count below the schedule's minimum)."""
    loads = schedule_loads(name, problem, num_workers)
    max_load = max(loads)
    policy = get_builder(name)
    tilings = pack_tilings(problem) if problem.is_pack else [Tiling(problem)] * problem.batch
    units = [policy.units(t) for t in tilings]
    return ScheduleSummary(name=name, problem=problem, num_workers=num_workers,
                           workers_used=len(loads), num_tasks=sum(loads), min_load=min(loads),
                           max_load=max_load, busiest=loads.index(max_load),
                           sequence_units=max(units), total_units=problem.heads_q * sum(units))


def format_summary(summary: ScheduleSummary) -> str:
    """What `dashgen show` prints for a problem too big to list task by task. The first line is
    the one the full view (show.format_schedule) starts with."""
    s = summary
    lines = [f"{s.name}: {s.problem.describe()}; {s.workers_used} workers",
             f"  {s.num_tasks:,} tasks; per worker min {s.min_load:,}, mean {s.mean_load:,.1f}, "
             f"max {s.max_load:,}",
             f"  busiest worker {s.busiest}: {s.max_load:,} tasks, {s.ratio:.3f}x the bound "
             f"ceil({s.num_tasks:,} / {s.num_workers}) = {s.bound:,}"]
    if s.workers_used < s.num_workers:
        units = s.total_units
        # else the schedule runs a head's units at once (Policy.heads_together): whole heads
        why = (f"there are {units:,} units" if s.workers_used == units else
               f"a head's {s.sequence_units} units run together, so a multiple of "
               f"{s.sequence_units}")
        lines.append(f"  {s.workers_used} of the {s.num_workers} workers run: {why}")
    return "\n".join(lines)
