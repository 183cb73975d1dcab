"""Text views of a schedule: the per-worker programs and the order each dQ tile is summed in.

`dashgen show` prints exactly this, and every builder's docstring example is its output.
"""
from __future__ import annotations

from .ir import Schedule, Task


def _prefix(schedule: Schedule, batch: int, head: int) -> str:
    p = schedule.problem
    return (f"b{batch}." if p.batch > 1 else "") + (f"h{head}." if p.heads_q > 1 else "")


def format_schedule(schedule: Schedule) -> str:
    p = schedule.problem
    lines = [f"{schedule.name}: {p.describe()}; {schedule.num_workers} workers"]
    width = len(str(schedule.num_workers - 1))
    for w in range(schedule.num_workers):
        parts = []
        for seg in schedule.segments(w):
            first = seg[0]
            label = f"{_prefix(schedule, first.batch, first.head)}n{first.n_block}"
            parts.append(f"{label}: " + " ".join(f"m{t.m_block}" for t in seg))
        lines.append(f"worker {w:>{width}} | " + " | ".join(parts) if parts else
                     f"worker {w:>{width}} | (idle)")

    lines.append("dQ reduction order (KV tiles, first to last):")
    dq: dict[tuple[int, int, int], list[Task]] = {}
    for tasks in schedule.workers:
        for t in tasks:
            dq.setdefault(t.dq_tile, []).append(t)
    for (b, h, m) in sorted(dq):
        order = sorted(dq[(b, h, m)], key=lambda t: t.dq_rank)
        lines.append(f"  {_prefix(schedule, b, h)}m{m}: " + " ".join(f"n{t.n_block}" for t in order))

    if p.gqa:
        lines.append("dK/dV reduction order (query heads, first to last):")
        dkv: dict[tuple[int, int, int], dict[int, int]] = {}
        for tasks in schedule.workers:
            for t in tasks:
                dkv.setdefault((t.batch, p.kv_head(t.head), t.n_block), {})[t.head] = t.dkv_rank
        for (b, kvh, n) in sorted(dkv):
            heads = sorted(dkv[(b, kvh, n)].items(), key=lambda item: item[1])
            batch = f"b{b}." if p.batch > 1 else ""
            lines.append(f"  {batch}kv{kvh}.n{n}: " + " ".join(f"h{h}" for h, _ in heads))
    return "\n".join(lines)
