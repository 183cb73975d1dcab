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

# The torch entry points, each loaded (with torch, and on first call the driver) only when asked
# for, so that `import dashgen` stays light for the schedule tools.
_TORCH_ENTRY_POINTS = {
    "attention": ("runtime.op", "attention"),
    "sdpa": ("interfaces.sdpa", "sdpa"),
    "flash_attn_func": ("interfaces.flash_attn", "flash_attn_func"),
    "attention_varlen": ("runtime.op_varlen", "attention_varlen"),
    "flash_attn_varlen_func": ("interfaces.flash_attn", "flash_attn_varlen_func"),
    "flash_attn_qkvpacked_func": ("interfaces.flash_attn", "flash_attn_qkvpacked_func"),
    "flash_attn_kvpacked_func": ("interfaces.flash_attn", "flash_attn_kvpacked_func"),
    "flash_attn_varlen_qkvpacked_func": ("interfaces.flash_attn",
                                         "flash_attn_varlen_qkvpacked_func"),
    "flash_attn_varlen_kvpacked_func": ("interfaces.flash_attn",
                                        "flash_attn_varlen_kvpacked_func"),
    "ulysses_attention": ("interfaces.ulysses", "ulysses_attention"),
    "ulysses_attention_varlen": ("interfaces.ulysses", "ulysses_attention_varlen"),
}


def __getattr__(name: str):
    if name in _TORCH_ENTRY_POINTS:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError(f"dashgen.{name} needs PyTorch 2.11 or newer (pip install "
                              f"'torch>=2.11'); the schedule and kernel tools work without "
                              f"it") from None
        import importlib
        module, attr = _TORCH_ENTRY_POINTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value  # later lookups skip this function: host time a call
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Cost", "Mask", "attention", "attention_varlen", "flash_attn_func",
    "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "sdpa", "Problem", "Schedule", "ScheduleFormatError", "SimResult",
    "SimulationDeadlock", "Task", "UnsupportedProblem", "VerificationError",
    "VerificationReport", "Violation", "build_schedule", "clear_caches", "list_schedules",
    "load_schedule", "simulate", "verify",
]
