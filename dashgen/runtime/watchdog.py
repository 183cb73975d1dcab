"""The backward's watchdog, host side: where a stalled rank wait is recorded, and the error
that reports it.

A rank wait that lasts longer than the timeout means the schedule is not live (a schedule file
whose verification was bypassed; never a named schedule). The kernel then fills its row of a
pinned host buffer (params.cuh, kStallWords words per worker and role) and aborts the launch
with a trap, so the CUDA context reports an error at the next synchronization and no gradient
of a broken order is returned. The next dashgen call, or `check()`, raises ScheduleStallError
with what the record says. The buffer is host memory: reading it needs no synchronization.
"""
from __future__ import annotations

import ctypes
import os

import torch

from ..codegen.variants import STALL_MAGIC, STALL_ROLES, STALL_WORDS
from ..schedule.builders import BUILDERS
from .device import host_record

DEFAULT_TIMEOUT_MS = 4000  # the clock's low 32 bits wrap after 4.29 s (ptx/counter.cuh)
MAX_WORKERS = 1024
_records: dict[int, torch.Tensor] = {}


class ScheduleStallError(RuntimeError):
    """A backward kernel's rank wait outlived the watchdog: its schedule is not live."""


def timeout_ms() -> int:
    """DASHGEN_WATCHDOG_MS, or 4000: how long one rank wait may last (1 ms .. 4000 ms)."""
    text = os.environ.get("DASHGEN_WATCHDOG_MS")
    if text is None:
        return DEFAULT_TIMEOUT_MS
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"DASHGEN_WATCHDOG_MS must be an int (milliseconds), got {text!r}") from None
    if not 1 <= value <= DEFAULT_TIMEOUT_MS:
        raise ValueError(f"DASHGEN_WATCHDOG_MS must be 1 .. {DEFAULT_TIMEOUT_MS}, got {value}")
    return value


def record(device: torch.device, num_workers: int) -> int:
    """The address of the stall record the kernels on `device` write (pinned, zeroed once)."""
    if num_workers > MAX_WORKERS:
        raise ValueError(f"num_workers={num_workers} exceeds the watchdog's {MAX_WORKERS}")
    return host_record(_records, device, MAX_WORKERS * 4 * STALL_WORDS)


def _decode(row: list[int]) -> str:
    names = {policy.kernel_id: name for name, policy in BUILDERS.items()} | {0: "table"}
    schedule, role, tile, rank, seen, worker = row[1:7]
    return (f"the {STALL_ROLES.get(role, f'role {role}')} of worker {worker} waited longer than "
            f"{timeout_ms()} ms for the counter of tile {tile} (index into the (batch, head, "
            f"tile) counters; for a pack, each sequence's (head, tile) block, params.cuh "
            f"PackedRows) to reach {rank}; it stayed at {seen}. Schedule "
            f"{names.get(schedule, schedule)!r} is not live (a schedule file whose verification "
            f"was bypassed?). The launch was aborted: this CUDA context cannot run more work")


def check() -> None:
    """Raise ScheduleStallError if any backward kernel recorded a stall (reads host memory)."""
    for buf in _records.values():
        if ctypes.c_uint32.from_address(buf.data_ptr()).value != STALL_MAGIC:
            continue
        rows = buf.view(-1, STALL_WORDS)
        for row in rows[1:].tolist():
            if row[0] & 0xFFFFFFFF == STALL_MAGIC:
                raise ScheduleStallError(_decode(row))
        raise ScheduleStallError("a backward kernel's watchdog fired (record incomplete)")
