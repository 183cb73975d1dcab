"""dashgen: deterministic attention backward for Hopper, with the dQ order as a verified schedule."""
from __future__ import annotations

from .version import __version__

from .caches import clear_caches
from .schedule.ir import Schedule, ScheduleFormatError, Task
from .schedule.files import load_schedule
from .schedule.problem import Mask, Problem
from .schedule.builders import UnsupportedProblem, build_schedule, list_schedules
from .schedule.simulate import Cost, SimResult, SimulationDeadlock, simulate
from .schedule.verify import VerificationError, VerificationReport, Violation, verify

def __getattr__(name: str):
    # The torch op loads torch (and on first call the driver) only when asked for, so that
    # `import dashgen` stays light for the schedule tools.
    if name == "attention":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError("dashgen.attention needs PyTorch 2.11 or newer (pip install "
                              "'torch>=2.11'); the schedule and kernel tools work without "
                              "it") from None
        from .runtime.op import attention
        globals()["attention"] = attention  # later lookups skip this function: host time a call
        return attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Cost", "Mask", "attention", "Problem", "Schedule", "ScheduleFormatError", "SimResult",
    "SimulationDeadlock", "Task", "UnsupportedProblem", "VerificationError",
    "VerificationReport", "Violation", "build_schedule", "clear_caches", "list_schedules",
    "load_schedule", "simulate", "verify",
]
