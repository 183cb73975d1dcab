"""Verified, lowered plans (the task tables the backward walks): a disk cache beside the cubins,
the tables on the GPU, and what the fused dQ convert reads from a plan.

Building and verifying a schedule costs seconds per new shape at 16k tokens a sequence and
half a minute at 64k; a restarted training job asks for the same shapes again. An entry is
written only after its schedule passed the verifier, and it is keyed by everything that decides
the table: the problem, the schedule, the worker count, and the source of the code that builds,
verifies and lowers schedules, read when this module is imported (after that code), so an edit
there misses. A torn, foreign or malformed entry is rebuilt; an unreadable or unwritable cache
folder only costs the build. The folder is trusted as the cubins in it are: a hit is checked
for indices the kernel could not address, not verified again.
"""
from __future__ import annotations

import hashlib
import sys
import time
from array import array
from pathlib import Path
from typing import Callable

import torch

from ..version import __version__
from ..caches import DiskCache, digest, memo
from ..schedule import builders, ir, verify  # noqa: F401  (loaded before the digest is read)
from ..schedule.lower import TASK_WORDS, KernelPlan
from ..schedule.problem import Problem
from .device import allocation_stream
from .select import verified_plan

_PLANS = DiskCache(subfolder="plans", suffix=".bin", format_version=1)
_SCHEDULE_PACKAGE = Path(__file__).resolve().parents[1] / "schedule"
# The modules whose code decides a plan's table.
_PLANNING_SOURCES = ("problem.py", "ir.py", "verify.py", "lower.py", "builders")


def _planning_files(package: Path) -> list[Path]:
    files = []
    for name in _PLANNING_SOURCES:
        path = package / name
        found = sorted(path.glob("*.py")) if path.is_dir() else [path]
        files += [f for f in found if not f.name.startswith(".")]  # editors' lock files
    return files


def source_digest(package: Path = _SCHEDULE_PACKAGE) -> str | None:
    """Digest of the planning code, or None where it cannot be read (then nothing is cached)."""
    h = hashlib.sha256()
    try:
        for file in _planning_files(package):
            h.update(file.relative_to(package).as_posix().encode() + b"\0")
            h.update(file.read_bytes() + b"\0")
    except OSError:
        return None
    return h.hexdigest()


# Read once the planning modules are loaded (imported above), so the digest names the code
# this process runs, not a later edit of its files.
CODE_DIGEST = source_digest()


def plan_key(problem: Problem, schedule: str, num_workers: int) -> str:
    return digest({"format": _PLANS.format, "problem": problem.to_dict(), "schedule": schedule,
                   "num_workers": num_workers, "dashgen": __version__, "code": CODE_DIGEST,
                   "byteorder": sys.byteorder})


def plan_tensors(plan: KernelPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(words, offsets): the task table as an int64 tensor of shape (num_tasks, TASK_WORDS) and
    the worker offsets as int64, read through the arrays' buffers (torch.tensor walks them
    element by element, a second at 4M tasks). CPU tensors."""
    words = (torch.frombuffer(plan.tasks, dtype=torch.int32) if len(plan.tasks)
             else torch.empty(0, dtype=torch.int32))
    offsets = torch.frombuffer(plan.worker_offsets, dtype=torch.int32)
    return (words.to(torch.int64).view(-1, TASK_WORDS),  # .to copies: nothing aliases the arrays
            offsets.to(torch.int64))


def _from_cache(data: bytes, meta: dict, problem: Problem, schedule: str,
                num_workers: int) -> KernelPlan | None:
    num_tasks = meta.get("num_tasks")
    if (type(num_tasks) is not int or num_tasks < 0
            or len(data) != 4 * (num_tasks * TASK_WORDS + num_workers + 1)):
        return None
    words = array("i")
    words.frombytes(data)
    split = num_tasks * TASK_WORDS
    plan = KernelPlan(schedule, problem, num_workers, words[:split], words[split:])
    return plan if addressable(plan) else None


def addressable(plan: KernelPlan) -> bool:
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
    if CODE_DIGEST is None:
        return build(), False
    key = plan_key(problem, schedule, num_workers)
    found = _PLANS.get(key, directory)
    if found is not None:
        plan = _from_cache(*found, problem, schedule, num_workers)
        if plan is not None:
            return plan, True
    plan = build()
    data = plan.tasks.tobytes() + plan.worker_offsets.tobytes()
    try:
        _PLANS.put(key, data, {"schedule": schedule, "problem": problem.to_dict(),
                               "num_workers": num_workers, "num_tasks": plan.num_tasks},
                   directory)
    except OSError:
        pass  # a read-only or full cache folder: the plan is still good, just not kept
    return plan, False


_clock = time.perf_counter


@memo(max_entries=4)  # a 64k-token causal plan holds ~67 MB of table
def cached_plan(problem: Problem, schedule: str, num_workers: int) -> KernelPlan:
    """The verified plan, from memory, the disk cache, or built (saying so when that is slow)."""
    start = _clock()
    plan, hit = get_or_build(problem, schedule, num_workers,
                             lambda: verified_plan(problem, schedule, num_workers))
    seconds = _clock() - start
    if not hit and seconds >= 1:  # long sequences: say why the first backward waits
        p = problem
        print(f"dashgen: built and verified the {schedule} schedule for batch {p.batch}, "
              f"{p.heads_q} heads, seqlen {p.seqlen_q}x{p.seqlen_k} ({plan.num_tasks} tasks, "
              f"{num_workers} workers) in {seconds:.1f} s", file=sys.stderr)
    return plan


def int32_tensor(words) -> torch.Tensor:
    """An int32 array as a CPU tensor that owns its memory: read as a buffer, then cloned."""
    if not len(words):
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(words, dtype=torch.int32).clone()


@memo(max_entries=4)  # the prepared launches keep theirs; this serves their construction
def device_tables(problem: Problem, schedule: str, num_workers: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The plan's task table and worker offsets on `device`, and the stream they were
    allocated on: a call on another stream must record its use of them (several prepared
    launches may share these tensors, whatever stream each was built on)."""
    plan = cached_plan(problem, schedule, num_workers)
    return (int32_tensor(plan.tasks).to(device), int32_tensor(plan.worker_offsets).to(device),
            allocation_stream(device))


def conversion_plan(plan: KernelPlan) -> tuple[list[int], list[int], list[int]]:
    """What the fused convert needs from a lowered plan: (counts, tiles, offsets).

    counts[m]: contributions to the dQ sum of a query tile in m_block m, one past its highest
    dq_rank (the tiles a task set covers are the same for every batch and head, so are the
    counts; checked). tiles/offsets: the dQ tiles, (batch * heads_q + head) * num_m_blocks +
    m_block, dealt round-robin to the workers in the order the schedule finishes them (the
    position of a tile's last add in its worker's task list), worker w's at
    tiles[offsets[w]:offsets[w + 1]]. Dealt, not left to the worker that adds last: the shift
    orders give some workers the last add of most of their tasks."""
    p = plan.problem
    words, offsets = plan_tensors(plan)
    tile = ((words[:, 0] >> 16) * p.heads_q + (words[:, 0] & 0xFFFF)) * p.num_m_blocks + (
        words[:, 1] & 0xFFFF)
    per_tile = torch.zeros(p.batch * p.heads_q * p.num_m_blocks, dtype=torch.int64)
    per_tile.scatter_reduce_(0, tile, words[:, 2] + 1, reduce="amax")
    per_m = per_tile.view(-1, p.num_m_blocks)
    if not torch.equal(per_m, per_m[:1].expand_as(per_m)):
        raise AssertionError("the schedule gives the query tiles of one m_block different counts")
    workers = len(offsets) - 1
    position = torch.arange(len(words)) - torch.repeat_interleave(offsets[:-1], offsets.diff())
    last = words[:, 2] + 1 == per_tile[tile]
    finished = torch.full_like(per_tile, -1)
    finished[tile[last]] = position[last]
    order = torch.argsort(finished, stable=True)  # ties: by tile
    order = order[finished[order] >= 0]  # tiles no task reaches: the convert kernel's
    dealt = torch.arange(len(order)) % workers
    by_worker = order[torch.argsort(dealt, stable=True)]
    bounds = torch.zeros(workers + 1, dtype=torch.int64)
    bounds[1:] = torch.bincount(dealt, minlength=workers).cumsum(0)
    return per_m[0].tolist(), by_worker.tolist(), bounds.tolist()
