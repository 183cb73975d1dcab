"""Disk cache of verified, lowered plans (the task tables the backward walks), beside the cubins.

Building and verifying a schedule costs seconds per new shape at 16k tokens a sequence and
half a minute at 64k; a restarted training job asks for the same shapes again. An entry is
written only after its schedule passed the verifier, and it is keyed by everything that
decides the table: the problem, the schedule, the worker count, and the source of the code
that builds, verifies and lowers schedules (an edit there misses). A torn or foreign entry
fails its checksum and is rebuilt; an unwritable cache folder only costs the rebuild.
"""
from __future__ import annotations

import hashlib
import json
import sys
from array import array
from functools import lru_cache
from pathlib import Path
from typing import Callable

from . import __version__
from .cache import _atomic_write, cache_dir
from .lower import TASK_WORDS, KernelPlan
from .problem import Problem

_FORMAT = 1  # bump when the file layout changes
_PACKAGE = Path(__file__).resolve().parent
# The modules whose code decides a plan's table.
_PLANNING_SOURCES = ("problem.py", "ir.py", "verify.py", "lower.py", "schedules")


@lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256()
    for name in _PLANNING_SOURCES:
        path = _PACKAGE / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(file.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            h.update(file.read_bytes() + b"\0")
    return h.hexdigest()


def plan_key(problem: Problem, schedule: str, num_workers: int) -> str:
    payload = {"format": _FORMAT, "problem": problem.to_dict(), "schedule": schedule,
               "num_workers": num_workers, "dashgen": __version__, "code": _code_digest(),
               "byteorder": sys.byteorder}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _paths(key: str, directory: Path | None) -> tuple[Path, Path]:
    folder = (Path(directory) if directory is not None else cache_dir()) / "plans" / key[:2]
    return folder / f"{key}.bin", folder / f"{key}.json"


def _load(data_path: Path, meta_path: Path, problem: Problem, schedule: str,
          num_workers: int) -> KernelPlan | None:
    try:
        meta = json.loads(meta_path.read_text())
        data = data_path.read_bytes()
    except (OSError, ValueError):
        return None
    if (meta.get("format") != _FORMAT or meta.get("sha256") != hashlib.sha256(data).hexdigest()
            or meta.get("num_tasks", -1) * TASK_WORDS + num_workers + 1 != len(data) // 4):
        return None
    words = array("i")
    words.frombytes(data)
    split = len(words) - (num_workers + 1)
    return KernelPlan(schedule, problem, num_workers, words[:split], words[split:])


def get_or_build(problem: Problem, schedule: str, num_workers: int,
                 build: Callable[[], KernelPlan],
                 directory: Path | None = None) -> tuple[KernelPlan, bool]:
    """The plan for (problem, schedule, num_workers), and whether it came from the cache.
    `build` makes it on a miss: it must verify the schedule before lowering it."""
    key = plan_key(problem, schedule, num_workers)
    data_path, meta_path = _paths(key, directory)
    if meta_path.exists():
        cached = _load(data_path, meta_path, problem, schedule, num_workers)
        if cached is not None:
            return cached, True
    plan = build()
    data = plan.tasks.tobytes() + plan.worker_offsets.tobytes()
    meta = {"format": _FORMAT, "schedule": schedule, "problem": problem.to_dict(),
            "num_workers": num_workers, "num_tasks": plan.num_tasks,
            "sha256": hashlib.sha256(data).hexdigest()}
    try:
        data_path.parent.mkdir(parents=True, exist_ok=True)
        # The sidecar goes last: it marks the entry complete and names the table's hash.
        _atomic_write(data_path, data)
        _atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
    except OSError:
        pass  # a read-only or full cache folder: the plan is still good, just not kept
    return plan, False
