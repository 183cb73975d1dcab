"""A model of the backward kernel as built, for calibrating against measurements.

The DASH paper's chain (simulate.py: compute, then wait and reduce, then the next task) is the
model its closed forms hold for. dashgen's Hopper kernel decouples the two: the MMA warpgroups
compute task after task while a writer warp adds each dQ partial in rank order, with `buffers`
dQ tiles in flight between them. A worker's MMA stalls only when all buffers wait on the writer.
`ordered=False` models the non-deterministic mode: adds land as they come, nobody waits.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .ir import Schedule


@dataclass(frozen=True)
class KernelCost:
    """Per-task times in one unit (microseconds when calibrated).

    c: one task's MMA work; r: the writer's add of one dQ tile; signal_latency: a counter
    release seen by another worker; overhead: fixed time per backward (launches, pre- and
    post-processing).
    """

    c: float = 1.0
    r: float = 0.2
    signal_latency: float = 0.0
    overhead: float = 0.0
    buffers: int = 2

    def __post_init__(self) -> None:
        for name in ("c", "r", "signal_latency", "overhead"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if not isinstance(self.buffers, int) or self.buffers < 1:
            raise ValueError(f"buffers must be a positive int, got {self.buffers!r}")


def kernel_makespan(schedule: Schedule, cost: KernelCost, ordered: bool = True) -> float:
    """Finish time of the last worker (plus the fixed overhead); raises RuntimeError on a
    deadlock (a schedule that verify() rejects)."""
    if schedule.problem.gqa:
        raise ValueError("kernel_makespan models the kernel without GQA (the Hopper backward)")
    programs = schedule.workers
    n = len(programs)
    c, r, lat, k = float(cost.c), float(cost.r), float(cost.signal_latency), cost.buffers
    computed = [0] * n                       # tasks whose MMA work is done
    written = [0] * n                        # tasks the writer has added
    mma_t = [0.0] * n                        # when the MMA warpgroups are free
    writer_t = [0.0] * n                     # when the writer is free
    compute_end: list[list[float]] = [[] for _ in range(n)]
    write_end: list[list[float]] = [[] for _ in range(n)]
    counters: dict[tuple, tuple[int, float, int]] = {}  # dQ tile -> (adds, last end, last worker)
    waiters: dict[tuple, int] = {}
    ready = deque(range(n))
    while ready:
        w = ready.popleft()
        prog = programs[w]
        while True:
            progressed = False
            # The MMA side runs ahead of the writer by at most `buffers` tasks: a task's MMAs
            # start at once, but it can only hand its dQ over once task p - buffers is written.
            while computed[w] < len(prog) and computed[w] - written[w] < k:
                p = computed[w]
                end = mma_t[w] + c
                if p >= k:
                    end = max(end, write_end[w][p - k])
                mma_t[w] = end
                compute_end[w].append(mma_t[w])
                computed[w] += 1
                progressed = True
            if written[w] < computed[w]:
                p = written[w]
                task = prog[p]
                key = task.dq_tile
                start = max(writer_t[w], compute_end[w][p])
                if ordered:
                    count, last_end, last_w = counters.get(key, (0, 0.0, -1))
                    if count != task.dq_rank:
                        waiters[(key, task.dq_rank)] = w
                        break
                    release = last_end + (lat if last_w != w and count else 0.0)
                    start = max(start, release)
                    counters[key] = (count + 1, start + r, w)
                    woken = waiters.pop((key, count + 1), None)
                    if woken is not None:
                        ready.append(woken)
                writer_t[w] = start + r
                write_end[w].append(writer_t[w])
                written[w] += 1
                progressed = True
            if not progressed:
                break
    stuck = [w for w in range(n) if written[w] < len(programs[w])]
    if stuck:
        raise RuntimeError(f"deadlock: workers {stuck[:10]} wait on dQ counters nobody releases")
    return max((max(mma_t[w], writer_t[w]) for w in range(n)), default=0.0) + cost.overhead


# When the Hopper backward converts dQ inside the main kernel (Sm90BwdConfig.fused_convert).
# Measured on the H200 (docs/perf-notes.md, v3.8): the converter warps cost the main kernel
# 1-4% (~3% at 1k tokens a sequence, ~2% at 4k), and save the convert kernel, which reads the
# fp32 dQ sum and writes the 16-bit dQ at ~4 TB/s.
FUSED_CONVERT_COST = 0.03          # fraction of the main kernel the converter costs
CONVERT_BYTES_PER_US = 4.0e6       # the convert kernel's bandwidth (4 TB/s)
TASK_US = {64: 3.00, 128: 2.54}    # main-kernel time per task (dashgen calibrate, per head_dim)


def fuses_convert(plan) -> bool:
    """Whether converting dQ in the main kernel saves time for a lowered plan (dashgen.lower):
    the convert kernel's estimated time against the converter's cost, a fraction of the main
    kernel estimated from the longest worker's task count. True for short sequences (at 16384
    tokens: 1k-2k, and 4k causal)."""
    p, offsets = plan.problem, plan.worker_offsets
    convert_us = p.batch * p.heads_q * p.seqlen_q * p.head_dim * 6 / CONVERT_BYTES_PER_US
    main_us = max(b - a for a, b in zip(offsets, offsets[1:])) * TASK_US[p.head_dim]
    return convert_us > FUSED_CONVERT_COST * main_us


# When the Hopper backward loads a KV segment's K/V right after the previous segment's last dQ
# MMA, its first Q/dO before them (Sm90BwdConfig.early_kv). Measured on the H200 (docs/perf-
# notes.md, v3.9): the main kernel 1.5-3.4% faster where segments hold ~4-8 tasks (1k causal,
# d64 full 1k), within +-1% at 8-16, and 1-2.5% slower with 16-32 (full masks at 2k-4k).
EARLY_KV_MAX_SEGMENT_TASKS = 10


def early_kv_pays(plan) -> bool:
    """Whether loading each KV segment's K/V early pays for a lowered plan: where its segments
    (runs of one worker's tasks on the same KV block) are short, so the boundaries are many."""
    import torch
    from .lower import plan_tensors
    words, offsets = plan_tensors(plan)
    block = words[:, 0] << 16 | words[:, 1] >> 16  # (batch, head, n_block) of each task
    starts = torch.ones(len(block), dtype=torch.bool)
    starts[1:] = block[1:] != block[:-1]
    firsts = offsets[:-1]
    starts[firsts[firsts < len(block)]] = True  # each worker's first task starts a segment
    return plan.num_tasks <= EARLY_KV_MAX_SEGMENT_TASKS * max(int(starts.sum()), 1)


# When the Hopper forward runs on persistent CTAs (Sm90FwdConfig.persistent). Measured on the
# H200 against one CTA a query tile, alternated in one call, same outputs (docs/perf-notes.md,
# v4.3 and v4.4). Full mask: at head_dim 64 +15 to +19% with 1k-16k keys; at head_dim 128
# +12 to +16% with 1k, +4% with 2k, then -1% with 4k and -4% with 16k. A query tile's fixed
# costs (its CTA's start, Q's load, the O/lse stores) overlap the next tile's loads; at
# head_dim 128 the longer tiles leave less to hide, and 128 CTAs of 2048 tiles lose to the
# hardware's dispatch on 132 SMs. Causal mask (whole heads a round, tiles rotated): at head_dim
# 64 +11% with 1k, then -3% with 2k, -8% with 4k, -14% with 16k, where rounds of unequal tiles
# leave the short ones' CTAs idle; at head_dim 128 +14% with 1k, +11% with 2k, +4% with 4k,
# +1% with 16k. The most KV tiles a query tile visits where persistent CTAs pay, per
# (head_dim, causal), measured through 16384 keys.
FWD_PERSISTENT_MAX_KV_TILES = {(64, False): 128, (128, False): 16,
                               (64, True): 8, (128, True): 128}


def forward_persistent_pays(seqlen_k: int, head_dim: int, causal: bool,
                            block_n: int = 128) -> bool:
    """Whether persistent CTAs pay for a forward with seqlen_k keys."""
    return -(-seqlen_k // block_n) <= FWD_PERSISTENT_MAX_KV_TILES.get((head_dim, causal), 0)
