"""The schedule builders, selectable by name: the DASH family and the upstream baselines."""
from __future__ import annotations

from ..ir import Schedule
from ..problem import Problem
from .base import Builder, UnsupportedProblem, assemble
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


__all__ = ["BUILDERS", "Builder", "UnsupportedProblem", "build_schedule", "get_builder",
           "list_schedules", "unsupported_reason"]
