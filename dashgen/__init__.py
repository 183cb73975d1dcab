"""dashgen: deterministic attention backward for Hopper, with the dQ order as a verified schedule."""
from __future__ import annotations

__version__ = "0.1.0"

from .ir import Schedule, ScheduleFormatError, Task
from .problem import Mask, Problem
from .schedules import UnsupportedProblem, build_schedule, list_schedules
from .simulate import Cost, SimResult, SimulationDeadlock, simulate
from .verify import VerificationError, VerificationReport, Violation, verify

__all__ = [
    "Cost", "Mask", "Problem", "Schedule", "ScheduleFormatError", "SimResult",
    "SimulationDeadlock", "Task", "UnsupportedProblem", "VerificationError",
    "VerificationReport", "Violation", "build_schedule", "list_schedules", "simulate", "verify",
]
