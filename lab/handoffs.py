"""The dQ hand-offs of a traced backward, in time: how long each writer waited for its rank, how
fast its worker went, and how late a release reached the next writer.

A traced backward (runtime.backward(..., trace=True)) stamps each task's row with the SM clock
and the GPU's nanosecond timer at three points of the dQ writer's hand-off (kernels.TRACE_COLUMNS):
ready (the writer has the partial), acquired (the counter reached the task's rank) and landed
(its add is in global memory). This module turns those rows into the numbers the kernel model
(dashgen.tools.kernel_model) needs and cannot get from identical task times. A module, not a
script: `import handoffs` with lab/ on the path, then summarize(handoffs(trace, worker_offsets)).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

READY, ACQUIRED, LANDED = 6, 7, 8  # SM clock columns; the timer's are 3 further on
TIMER = 3


def _unwrap(column: torch.Tensor, origin: int) -> torch.Tensor:
    """Low 32 bits of a clock -> int64 offsets from `origin` (the clocks wrap; a kernel is much
    shorter than one turn)."""
    return (column.long() - origin) % 2**32


@dataclass(frozen=True)
class Handoffs:
    """Per task, in the trace's (the plan's) order, int64: ns from the kernel's first ready."""

    ready: torch.Tensor
    acquired: torch.Tensor
    landed: torch.Tensor
    worker: torch.Tensor       # the worker that ran the task
    first: torch.Tensor        # True at each worker's first task
    previous: torch.Tensor     # index of the task one dq_rank earlier on the same tile, or -1


def handoffs(trace: torch.Tensor, worker_offsets: list[int]) -> Handoffs:
    """The timer stamps of a trace (rows in plan order, worker w's rows at
    worker_offsets[w]:worker_offsets[w + 1])."""
    trace = trace.cpu()
    if trace.ndim != 2 or trace.shape[1] < LANDED + TIMER + 1:
        raise ValueError(f"trace must be a (tasks, {LANDED + TIMER + 1}) tensor of a timed "
                         f"trace, got shape {tuple(trace.shape)}")
    n = trace.shape[0]
    if worker_offsets[0] != 0 or worker_offsets[-1] != n:
        raise ValueError(f"worker_offsets must run from 0 to the trace's {n} rows, got "
                         f"{worker_offsets[0]}..{worker_offsets[-1]}")
    # The earliest ready, found by going back from the first row's (the timer may wrap in the
    # kernel, so its smallest raw value need not be the earliest).
    origin = 0
    if n:
        first = int(trace[0, READY + TIMER])
        ahead = (trace[:, READY + TIMER].long() - first).remainder(2**32)
        origin = first + int(torch.where(ahead >= 2**31, ahead - 2**32, ahead).min())
    ready, acquired, landed = (_unwrap(trace[:, c + TIMER], origin)
                               for c in (READY, ACQUIRED, LANDED))
    counts = torch.tensor([b - a for a, b in zip(worker_offsets, worker_offsets[1:])])
    worker = torch.repeat_interleave(torch.arange(len(counts)), counts)
    first_mask = torch.zeros(n, dtype=torch.bool)
    starts = torch.tensor([a for a, b in zip(worker_offsets, worker_offsets[1:]) if b > a],
                          dtype=torch.long)
    first_mask[starts] = True
    # The task one rank earlier on the same dQ tile: sort by (tile, rank) and step back one.
    b, h, m, rank = (trace[:, c].long() for c in (0, 1, 3, 4))
    tile = (b * (int(h.max()) + 1 if n else 1) + h) * (int(m.max()) + 1 if n else 1) + m
    order = torch.argsort(tile * (int(rank.max()) + 1 if n else 1) + rank)
    previous = torch.full((n,), -1, dtype=torch.long)
    same = tile[order[1:]] == tile[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    return Handoffs(ready, acquired, landed, worker, first_mask, previous)


def _quantiles(x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    x = x.double().sort().values
    at = lambda q: float(x[min(int(q * len(x)), len(x) - 1)])
    return {"mean": float(x.mean()), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


@dataclass(frozen=True)
class Summary:
    """What a timed trace says, in ns (dicts: mean, p50, p90, p99 over tasks)."""

    span_ns: float            # first ready to last landed
    cadence: dict             # ready - the worker's previous ready: a task's time at the writer
    wait: dict                # acquired - ready: the writer waiting for the task's rank
    add: dict                 # landed - acquired: the bulk add, to global memory
    waited_share: float       # tasks that waited over 200 ns for their rank
    release_to_acquire: dict  # acquired - landed of rank - 1, over tasks that waited
    worker_rate_spread: float  # slowest / fastest worker's mean cadence (workers of >= 8 tasks)
    finish_spread_ns: float   # last worker's last landed - first worker's last landed

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(h: Handoffs) -> Summary:
    cadence_all = h.ready[1:] - h.ready[:-1]
    cadence = cadence_all[~h.first[1:]]
    wait = h.acquired - h.ready
    waited = wait > 200
    prev = h.previous
    has_prev = waited & (prev >= 0)
    release = h.acquired[has_prev] - h.landed[prev[has_prev]]
    # Per worker: mean cadence over its tasks (first one excluded), and its finish.
    ends, rates = [], []
    for w in torch.unique(h.worker).tolist():
        idx = (h.worker == w).nonzero().flatten()
        ends.append(int(h.landed[idx[-1]]))
        if len(idx) >= 8:
            rates.append((int(h.ready[idx[-1]]) - int(h.ready[idx[0]])) / (len(idx) - 1))
    return Summary(
        span_ns=float(h.landed.max() - h.ready.min()) if h.ready.numel() else 0.0,
        cadence=_quantiles(cadence), wait=_quantiles(wait), add=_quantiles(h.landed - h.acquired),
        waited_share=float(waited.double().mean()) if wait.numel() else 0.0,
        release_to_acquire=_quantiles(release),
        worker_rate_spread=max(rates) / min(rates) if rates and min(rates) > 0 else 1.0,
        finish_spread_ns=float(max(ends) - min(ends)) if ends else 0.0)
