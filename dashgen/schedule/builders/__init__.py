"""The named schedules, selectable by name: the DASH family and the upstream baselines, each a
scheduler policy (base.Policy) that the kernel computes from the same formulas."""
from __future__ import annotations

from ..ir import Schedule
from ..problem import Problem
from .base import (Policy, Step, Tiling, UnsupportedProblem, assemble, shift_rank,
                   worker_loads)
from .descending import descending_step, descending_tasks, descending_units
from .fa3 import fa3_step, fa3_tasks, fa3_units
from .hybrid import HYBRID_MAX_TILES, HybridOrder, hybrid_need, hybrid_supports
from .shift import shift_step, shift_supports, shift_tasks, shift_units
from .spt import spt_listed_units, spt_step, spt_tasks, spt_units
from .symmetric_shift import (symmetric_shift_step, symmetric_shift_supports,
                              symmetric_shift_tasks, symmetric_shift_units)


def _any_mask(problem: Problem) -> str | None:
    return None


# kernel_id: the policy's number in the kernel (the watchdog reports it; 0: a table).
BUILDERS: dict[str, Policy] = {b.name: b for b in [
    Policy("fa3", 1, "FA3's deterministic order: Q tiles ascending, dQ adds in ascending KV order",
           fa3_units, fa3_tasks, fa3_step, False, _any_mask, fa3_units.__doc__ or ""),
    Policy("spt", 2, "shortest KV tiles first (upstream causal order), highest KV tile adds first",
           spt_units, spt_tasks, spt_step, False, _any_mask, spt_units.__doc__ or "",
           deal_rising=True),
    Policy("descending", 3, "fa3 with each KV tile visiting its Q tiles last to first",
           descending_units, descending_tasks, descending_step, False, _any_mask,
           descending_units.__doc__ or ""),
    Policy("shift", 4, "full mask: cyclic shift of Q tiles, adds in a head's arrival order",
           shift_units, shift_tasks, shift_step, True, shift_supports, shift_units.__doc__ or ""),
    Policy("symmetric_shift", 5,
           "causal: KV tiles p and N-1-p paired, rectangle rotated, then triangle",
           symmetric_shift_units, symmetric_shift_tasks, symmetric_shift_step, True,
           symmetric_shift_supports, symmetric_shift_units.__doc__ or ""),
    Policy("spt_listed", 7, "spt dealt listed: each unit in launch order to the worker that "
           "frees first (long sequences)", spt_listed_units, spt_tasks, spt_step, False,
           _any_mask, spt_listed_units.__doc__ or "", deal_rising=True, listed=True),
]}


def hybrid_policy(max_tiles: int = HYBRID_MAX_TILES, kernel_id: int = 6) -> Policy:
    """The hybrid policy with its parameter (the registered one: HYBRID_MAX_TILES, id 6)."""
    order = HybridOrder(max_tiles)
    return Policy("hybrid", kernel_id,
                  "each sequence by its size: shift / symmetric_shift where it has at most "
                  f"{max_tiles} KV tiles, else fa3 / descending",
                  order.units, order.unit_tasks, order.step, False, hybrid_supports,
                  HybridOrder.units.__doc__ or "", together=order.together)


BUILDERS["hybrid"] = hybrid_policy()


def list_schedules() -> list[str]:
    return list(BUILDERS)


def get_builder(name: str) -> Policy:
    if name not in BUILDERS:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[name]


def unsupported_reason(name: str, problem: Problem) -> str | None:
    """None when the builder serves the problem, else why not."""
    return get_builder(name).supports(problem)


def min_workers(name: str, problem: Problem) -> int:
    """The fewest workers the named schedule is live on for this problem."""
    return get_builder(name).min_workers(problem)


def workers_used(name: str, problem: Problem, num_workers: int) -> int:
    """The workers a launch of the named schedule on `num_workers` SMs runs (raises ValueError
    naming the schedule and the count below its minimum)."""
    return get_builder(name).workers_used(problem, num_workers)


def _check(name: str, problem: Problem, num_workers: int) -> Policy:
    builder = get_builder(name)
    if not isinstance(problem, Problem):
        raise ValueError(f"problem must be a dashgen.Problem, got {type(problem).__name__}")
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    reason = builder.supports(problem)
    if reason is not None:
        raise UnsupportedProblem(name, reason)
    return builder


def build_schedule(name: str, problem: Problem, num_workers: int) -> Schedule:
    """The IR of the named schedule on `num_workers` workers (for heads_together schedules the
    multiple of a sequence's units it runs on). Raises UnsupportedProblem (never falls back)."""
    return assemble(_check(name, problem, num_workers), problem, num_workers)


def schedule_loads(name: str, problem: Problem, num_workers: int) -> list[int]:
    """Tasks per worker of the named schedule, without building its tasks."""
    return worker_loads(_check(name, problem, num_workers), problem, num_workers)


__all__ = ["BUILDERS", "HYBRID_MAX_TILES", "Policy", "Step", "Tiling", "UnsupportedProblem",
           "build_schedule", "get_builder", "hybrid_need", "hybrid_policy", "list_schedules",
           "min_workers",
           "schedule_loads", "shift_rank", "unsupported_reason", "workers_used"]
