"""Disk cache of verified, lowered plans (the task tables the backward walks), beside the cubins.

Building and verifying a schedule costs seconds per new shape at 16k tokens a sequence and
half a minute at 64k; a restarted training job asks for the same shapes again. An entry is
written only after its schedule passed the verifier, and it is keyed by everything that
decides the table: the problem, the schedule, the worker count, and the source of the code
that builds, verifies and lowers schedules, read when this module is imported (after that
code), so an edit there misses. A torn, foreign or malformed entry is rebuilt; an unreadable or
unwritable cache folder only costs the build. The folder is trusted as the cubins in it are: a
hit is checked for indices the kernel could not address, not verified again.
"""
from __future__ import annotations

import hashlib
import json
import sys
from array import array
from pathlib import Path
from typing import Callable


from . import __version__, ir, schedules, verify
from .cache import _atomic_write, cache_dir
from .lower import TASK_WORDS, KernelPlan, plan_tensors
from .problem import Problem

_FORMAT = 1  # bump when the file layout changes
_PACKAGE = Path(__file__).resolve().parent
# The modules whose code decides a plan's table.
_PLANNING_SOURCES = ("problem.py", "ir.py", "verify.py", "lower.py", "schedules")


def _planning_files() -> list[Path]:
    files = []
    for name in _PLANNING_SOURCES:
        path = _PACKAGE / name
        found = sorted(path.glob("*.py")) if path.is_dir() else [path]
        files += [f for f in found if not f.name.startswith(".")]  # editors' lock files
    return files


def _source_digest() -> str | None:
    """Digest of the planning code, or None where it cannot be read (then nothing is cached)."""
    h = hashlib.sha256()
    try:
        for file in _planning_files():
            h.update(file.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            h.update(file.read_bytes() + b"\0")
    except OSError:
        return None
    return h.hexdigest()


# Read once the planning modules are loaded (imported above), so the digest names the code
# this process runs, not a later edit of its files.
_PLANNING_MODULES = (ir, schedules, verify)
_CODE_DIGEST = _source_digest()


def _code_digest() -> str | None:
    return _CODE_DIGEST


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
    num_tasks = meta.get("num_tasks") if isinstance(meta, dict) else None
    if (type(num_tasks) is not int or num_tasks < 0 or meta.get("format") != _FORMAT
            or meta.get("sha256") != hashlib.sha256(data).hexdigest()
            or len(data) != 4 * (num_tasks * TASK_WORDS + num_workers + 1)):
        return None
    words = array("i")
    words.frombytes(data)
    split = num_tasks * TASK_WORDS
    plan = KernelPlan(schedule, problem, num_workers, words[:split], words[split:])
    return plan if _addressable(plan) else None


def _addressable(plan: KernelPlan) -> bool:
    """Whether every index in the table is one the kernel can address for this problem: worker
    ranges in order and covering the table, tiles inside the problem, dq ranks below the KV tile
    count (a dQ tile's most contributions), dkv ranks below the GQA group size and only under
    GQA."""
    p, count = plan.problem, plan.num_tasks
    if len(plan.worker_offsets) != plan.num_workers + 1 or len(plan.tasks) % TASK_WORDS:
        return False
    words, offsets = plan_tensors(plan)
    if offsets[0] != 0 or offsets[-1] != count or bool((offsets.diff() < 0).any()):
        return False
    bh, nm, dq_rank, dkv_rank = words.unbind(1)
    inside = ((bh >= 0) & (bh >> 16 < p.batch) & (bh & 0xFFFF < p.heads_q) & (nm >= 0)
              & (nm >> 16 < p.num_n_blocks) & (nm & 0xFFFF < p.num_m_blocks)
              & (dq_rank >= 0) & (dq_rank < p.num_n_blocks))
    inside &= (dkv_rank >= 0) & (dkv_rank < p.group_size) if p.gqa else dkv_rank == -1
    return bool(inside.all())


def get_or_build(problem: Problem, schedule: str, num_workers: int,
                 build: Callable[[], KernelPlan],
                 directory: Path | None = None) -> tuple[KernelPlan, bool]:
    """The plan for (problem, schedule, num_workers), and whether it came from the cache.
    `build` makes it on a miss: it must verify the schedule before lowering it."""
    if _code_digest() is None:
        return build(), False
    key = plan_key(problem, schedule, num_workers)
    data_path, meta_path = _paths(key, directory)
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
