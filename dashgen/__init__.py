"""dashgen: deterministic attention backward for Hopper, with the dQ order as a verified schedule."""
from __future__ import annotations

__version__ = "0.1.0"

from .ir import Schedule, ScheduleFormatError, Task
from .problem import Mask, Problem
from .schedules import UnsupportedProblem, build_schedule, list_schedules
from .simulate import Cost, SimResult, SimulationDeadlock, simulate
from .verify import VerificationError, VerificationReport, Violation, verify



def __getattr__(name: str):
    # The torch op loads torch (and on first call the driver) only when asked for, so that
    # `import dashgen` stays light for the schedule tools.
    if name == "attention":
        from .op import attention
        return attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Cost", "Mask", "attention", "Problem", "Schedule", "ScheduleFormatError", "SimResult",
    "SimulationDeadlock", "Task", "UnsupportedProblem", "VerificationError",
    "VerificationReport", "Violation", "build_schedule", "list_schedules", "simulate", "verify",
]
