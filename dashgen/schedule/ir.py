"""Schedule IR: per-worker ordered task lists with their reduction ranks, and its JSON form.

Each task implies two signal points on its worker: before adding its dQ partial it waits until
the dQ tile's counter equals ``dq_rank``; after the add has landed it increments the counter.
The last task of a segment does the same for the dK/dV tile with ``dkv_rank`` under GQA.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .problem import Problem

FORMAT = "dashgen.schedule/1"
TASK_FIELDS = ("batch", "head", "n_block", "m_block", "dq_rank", "dkv_rank")


class ScheduleFormatError(ValueError):
    """A schedule file that is not valid JSON or not shaped like a dashgen schedule."""


@dataclass(frozen=True, slots=True)
class Task:
    """One (batch, head, n_block, m_block) tile, head being the query head. Slotted: a plan at
    64k tokens a sequence holds millions of them."""

    batch: int
    head: int
    n_block: int
    m_block: int
    dq_rank: int
    dkv_rank: int | None = None

    @property
    def kv_tile(self) -> tuple[int, int, int]:
        """Key of the segment this task belongs to (dK/dV of one query head, in registers)."""
        return (self.batch, self.head, self.n_block)

    @property
    def dq_tile(self) -> tuple[int, int, int]:
        return (self.batch, self.head, self.m_block)

    @property
    def tile(self) -> tuple[int, int, int, int]:
        return (self.batch, self.head, self.n_block, self.m_block)

    def label(self) -> str:
        return f"b{self.batch} h{self.head} n{self.n_block} m{self.m_block}"


@dataclass
class Schedule:
    """A complete worker program for one problem and worker count.

    ``depends_on_workers`` records whether the order changes with ``num_workers`` (then the worker
    count is part of what fixes the bits of dQ). It is False for every named schedule, whose
    ranks are functions of the tiles alone; a schedule file may set it for an order of its own.
    """

    name: str
    problem: Problem
    num_workers: int
    workers: list[list[Task]]
    depends_on_workers: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def num_tasks(self) -> int:
        return sum(len(w) for w in self.workers)

    def segments(self, worker: int) -> list[list[Task]]:
        """The worker's program split into runs of one KV tile."""
        runs: list[list[Task]] = []
        for task in self.workers[worker]:
            if runs and runs[-1][-1].kv_tile == task.kv_tile:
                runs[-1].append(task)
            else:
                runs.append([task])
        return runs

    # -- JSON ---------------------------------------------------------------------------------

    def to_json(self) -> str:
        """Readable JSON: one line per task so a person can edit a schedule file by hand."""
        head = {
            "format": FORMAT,
            "name": self.name,
            "num_workers": self.num_workers,
            "depends_on_workers": self.depends_on_workers,
            "problem": self.problem.to_dict(),
            "task_fields": list(TASK_FIELDS),
        }
        lines = ["{"]
        for key, value in head.items():
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)},")
        lines.append('  "workers": [')
        for w, tasks in enumerate(self.workers):
            rows = [json.dumps([t.batch, t.head, t.n_block, t.m_block, t.dq_rank, t.dkv_rank])
                    for t in tasks]
            body = ",\n      ".join(rows)
            close = "," if w + 1 < len(self.workers) else ""
            lines.append(f"    [\n      {body}\n    ]{close}" if rows else f"    []{close}")
        lines.append("  ]")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleFormatError(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> "Schedule":
        if not isinstance(data, dict):
            raise ScheduleFormatError("a schedule file must hold a JSON object")
        if data.get("format") != FORMAT:
            raise ScheduleFormatError(f"format must be {FORMAT!r}, got {data.get('format')!r}")
        for key in ("name", "num_workers", "problem", "workers"):
            if key not in data:
                raise ScheduleFormatError(f"missing field {key!r}")
        fields = tuple(data.get("task_fields", TASK_FIELDS))
        if fields != TASK_FIELDS:
            raise ScheduleFormatError(f"task_fields must be {list(TASK_FIELDS)}, got {list(fields)}")
        try:
            problem = Problem.from_dict(data["problem"])
        except (TypeError, ValueError) as exc:
            raise ScheduleFormatError(f"problem: {exc}") from None
        num_workers = data["num_workers"]
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ScheduleFormatError(f"num_workers must be a positive int, got {num_workers!r}")
        if not isinstance(data["workers"], list):
            raise ScheduleFormatError("workers must be a list of task lists")
        workers = []
        for w, rows in enumerate(data["workers"]):
            if not isinstance(rows, list):
                raise ScheduleFormatError(f"worker {w}: expected a list of tasks")
            workers.append([_task_from_row(w, i, row) for i, row in enumerate(rows)])
        return cls(name=str(data["name"]), problem=problem, num_workers=num_workers,
                   workers=workers, depends_on_workers=bool(data.get("depends_on_workers", False)))


def _task_from_row(worker: int, position: int, row: object) -> Task:
    where = f"worker {worker} position {position}"
    if not isinstance(row, list) or len(row) != len(TASK_FIELDS):
        raise ScheduleFormatError(f"{where}: a task is a list of {len(TASK_FIELDS)} values "
                                  f"{list(TASK_FIELDS)}, got {row!r}")
    for name, value in zip(TASK_FIELDS, row):
        if name == "dkv_rank" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScheduleFormatError(f"{where}: {name} must be a non-negative int, got {value!r}")
    return Task(*row)
