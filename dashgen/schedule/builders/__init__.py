"""The schedule builders, selectable by name: the DASH family and the upstream baselines."""
from __future__ import annotations

from ..ir import Schedule
from ..problem import Problem
from .base import Builder, UnsupportedProblem, Unit, assemble, fewest_workers
from .descending import descending_units
from .fa3 import fa3_units
from .shift import shift_supports, shift_units
from .spt import spt_units
from .symmetric_shift import symmetric_shift_supports, symmetric_shift_units


def _any_mask(problem: Problem) -> str | None:
    return None


BUILDERS: dict[str, Builder] = {b.name: b for b in [
    Builder("fa3", "FA3's deterministic order: Q tiles ascending, dQ adds in ascending KV order",
            fa3_units, "launch", False, _any_mask, fa3_units.__doc__ or ""),
    Builder("spt", "shortest KV tiles first (upstream causal order), highest KV tile adds first",
            spt_units, "launch", False, _any_mask, spt_units.__doc__ or ""),
    Builder("descending", "fa3 with each KV tile visiting its Q tiles last to first",
            descending_units, "launch", False, _any_mask, descending_units.__doc__ or ""),
    Builder("shift", "full mask: cyclic shift of Q tiles, adds in arrival order",
            shift_units, "arrival", True, shift_supports, shift_units.__doc__ or ""),
    Builder("symmetric_shift", "causal: KV tiles p and N-1-p paired, rectangle rotated, then triangle",
            symmetric_shift_units, "arrival", True, symmetric_shift_supports,
            symmetric_shift_units.__doc__ or ""),
]}


def list_schedules() -> list[str]:
    return list(BUILDERS)


def get_builder(name: str) -> Builder:
    if name not in BUILDERS:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[name]


def unsupported_reason(name: str, problem: Problem) -> str | None:
    """None when the builder serves the problem, else why not."""
    return get_builder(name).supports(problem)


def _longest_load(sizes: list[int], num_workers: int) -> int:
    """Tasks of the busiest worker when units of these sizes are dealt round-robin (base.deal)."""
    loads = [0] * num_workers
    for i, size in enumerate(sizes):
        loads[i % num_workers] += size
    return max(loads)


def _two_at_one_depth(problem: Problem, units: list[Unit], num_workers: int) -> bool:
    """Whether two workers, dealt these units, reach one dQ tile at the same depth (task index
    in their program): the only way an arrival-ranked order makes a writer wait when tasks cost
    alike and a dQ add takes less than a task. Plain Python: it runs while torch.compile traces
    the op, where tensors would be fake. One int a task (a 64k-token plan has 8M)."""
    depths = sum(len(seg.m_order) for unit in units for seg in unit) + 1
    depth = [0] * num_workers
    seen: set[int] = set()
    for i, unit in enumerate(units):
        w = i % num_workers
        d = depth[w]
        for seg in unit:
            tile = (seg.batch * problem.heads_q + seg.head) * problem.num_m_blocks
            for m in seg.m_order:
                key = (tile + m) * depths + d
                if key in seen:
                    return True
                seen.add(key)
                d += 1
        depth[w] = d
    return False


def balanced_workers(name: str, problem: Problem, num_workers: int) -> int:
    """The worker count schedule="auto" runs an arrival-ranked (DASH) schedule with on
    `num_workers` SMs: the fewest workers whose busiest one carries no more tasks than with
    `num_workers`, if no two of them reach one dQ tile at one depth; else `num_workers`, as for
    the other schedules.

    Why: with no such meeting an arrival-ranked order makes no worker wait when tasks cost alike
    (Lemma 1), so the kernel model's makespan is the busiest worker's load, never more with the
    fewer workers (tests/test_schedules_workers.py checks it against kernel_model). Measured on
    the H200 (docs/design.md, `balanced-workers`), 4096 units on 128 workers instead of 132 (32 units
    each either way) ran shift and symmetric_shift 0.3-4.8% faster at 1k-16k: no head split
    across two waves (shorter writer waits, measured with timed traces) and no 4-worker tail.
    fa3 and spt are not arrival-ranked: their fill costs depend on the worker count, and the
    kernel model predicts them slower with fewer (measured so too).
    """
    builder = get_builder(name)
    if builder.rank_policy != "arrival":
        return num_workers
    units = builder.units(problem, num_workers)
    sizes = [sum(len(seg.m_order) for seg in unit) for unit in units]
    if not sizes:
        return num_workers
    fewest = fewest_workers(len(sizes), num_workers)
    if fewest == num_workers or _longest_load(sizes, fewest) > _longest_load(sizes, num_workers):
        return num_workers
    # The units themselves may depend on the worker count (symmetric_shift's rotation).
    meet = _two_at_one_depth(problem, builder.units(problem, fewest), fewest)
    return num_workers if meet else fewest


def build_schedule(name: str, problem: Problem, num_workers: int) -> Schedule:
    """Build the named schedule. Raises UnsupportedProblem (never falls back to another one)."""
    builder = get_builder(name)
    if not isinstance(problem, Problem):
        raise ValueError(f"problem must be a dashgen.Problem, got {type(problem).__name__}")
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    reason = builder.supports(problem)
    if reason is not None:
        raise UnsupportedProblem(name, reason)
    units = builder.units(problem, num_workers)
    return assemble(name, problem, num_workers, units, builder.rank_policy,
                    builder.depends_on_workers)


__all__ = ["BUILDERS", "Builder", "UnsupportedProblem", "balanced_workers", "build_schedule",
           "get_builder", "list_schedules", "unsupported_reason"]
