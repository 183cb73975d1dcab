"""Schedule files read back: the schedule file `dashgen show --json` writes (dashgen.schedule/1)
and the task table `dashgen emit` writes (dashgen.tasks/1), as a Schedule, verified."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .ir import FORMAT, Schedule, ScheduleFormatError, Task
from .lower import TASK_WORDS
from .problem import Problem
from .verify import verify

# The task table `dashgen emit` writes for a schedule file (dashgen.tools.emit.tasks_json).
TASKS_FORMAT = "dashgen.tasks/1"
FORMATS = (FORMAT, TASKS_FORMAT)
_INT32_MAX = (1 << 31) - 1


def load_schedule(path: str | os.PathLike, *, verified: bool = True) -> Schedule:
    """The schedule in the file at `path`: a schedule file (dashgen.schedule/1) or an emitted
    task table (dashgen.tasks/1), verified (dashgen.schedule.verify).

    Raises OSError when the file cannot be read, ScheduleFormatError (naming the path) when it
    is not one of the two formats or is malformed, and verify's VerificationError as it is.
    ``verified=False`` skips the verification: for tests that load broken schedules on purpose,
    never for a schedule that is to run.
    """
    schedule = read_schedule(path)
    if verified:
        verify(schedule)
    return schedule


def read_schedule(path: str | os.PathLike) -> Schedule:
    """The schedule in the file at `path`, unverified (load_schedule verifies)."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ScheduleFormatError(f"{path}: not valid JSON: {exc}") from None
    try:
        return schedule_from_dict(data)
    except ScheduleFormatError as exc:
        raise ScheduleFormatError(f"{path}: {exc}") from None


def schedule_from_dict(data: object) -> Schedule:
    """A parsed file of either format as a Schedule, by its "format" field."""
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == FORMAT:
        return Schedule.from_dict(data)
    if fmt == TASKS_FORMAT:
        return _from_tasks(data)
    expected = " or ".join(f'"format": "{f}"' for f in FORMATS)
    got = (f"a JSON {type(data).__name__}" if not isinstance(data, dict) else
           f'"format": {json.dumps(fmt)}' if "format" in data else "no format field")
    raise ScheduleFormatError(f"expected a dashgen schedule file ({expected}, as dashgen show "
                              f"--json and dashgen emit write them), got {got}")


def _int(value: object, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _INT32_MAX:
        raise ScheduleFormatError(f"{what} must be an int in {low}..{_INT32_MAX}, got {value!r}")
    return value


def _from_tasks(data: dict) -> Schedule:
    """The task table of dashgen.schedule.lower (four int32 words a task, workers back to back)
    decoded, checking what a hand edit can break on the way."""
    for key in ("schedule", "problem", "num_workers", "worker_offsets", "tasks"):
        if key not in data:
            raise ScheduleFormatError(f"missing field {key!r}")
    try:
        problem = Problem.from_dict(data["problem"])
    except (TypeError, ValueError) as exc:
        raise ScheduleFormatError(f"problem: {exc}") from None
    num_workers = _int(data["num_workers"], "num_workers", 1)
    offsets, rows = data["worker_offsets"], data["tasks"]
    if not isinstance(rows, list):
        raise ScheduleFormatError("tasks must be a list of task rows")
    if (not isinstance(offsets, list) or len(offsets) != num_workers + 1
            or [_int(o, "worker_offsets entry") for o in offsets] != sorted(offsets)
            or offsets[0] != 0 or offsets[-1] != len(rows)):
        raise ScheduleFormatError(f"worker_offsets must be {num_workers + 1} ascending ints from "
                                  f"0 to the {len(rows)} tasks, got {offsets!r}")
    if "num_tasks" in data and data["num_tasks"] != len(rows):
        raise ScheduleFormatError(f"num_tasks is {data['num_tasks']!r} but the file holds "
                                  f"{len(rows)} tasks")
    tasks = []
    for i, row in enumerate(rows):
        where = f"tasks[{i}]"
        if not isinstance(row, list) or len(row) != TASK_WORDS:
            raise ScheduleFormatError(f"{where}: a task is {TASK_WORDS} ints (batch << 16 | head, "
                                      f"n_block << 16 | m_block, dq_rank, dkv_rank), got {row!r}")
        bh = _int(row[0], f"{where} word 0 (batch << 16 | head)")
        nm = _int(row[1], f"{where} word 1 (n_block << 16 | m_block)")
        dq_rank = _int(row[2], f"{where} word 2 (dq_rank)")
        dkv_rank = _int(row[3], f"{where} word 3 (dkv_rank, -1: none)", -1)
        tasks.append(Task(bh >> 16, bh & 0xFFFF, nm >> 16, nm & 0xFFFF, dq_rank,
                          None if dkv_rank < 0 else dkv_rank))
    workers = [tasks[offsets[w]:offsets[w + 1]] for w in range(num_workers)]
    return Schedule(name=str(data["schedule"]), problem=problem, num_workers=num_workers,
                    workers=workers)
