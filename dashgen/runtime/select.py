"""The one place that chooses: for a problem, the forward and backward kernel variants, the
schedule and the worker count.

`select` is what every call, `dashgen emit` and the benchmark go through; `Overrides` replace a
per-problem policy for a measurement (never a module global). Each policy cites the entry of
docs/design.md that holds the measurement behind it. Pure Python: no torch, no driver.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..caches import memo
from ..codegen.variants import (FORWARD_BLOCK_M, FORWARD_BLOCK_N, BackwardVariant,
                                ForwardVariant, backward_tiles, check_dtype_head_dim)
from ..schedule.builders import balanced_workers, build_schedule, get_builder, unsupported_reason
from ..schedule.lower import KernelPlan, lower
from ..schedule.problem import Mask, Problem
from ..schedule.verify import verify

DEFAULT_SM_COUNT = 132  # H100 SXM and H200: the worker count `show`, `plan` and `emit` assume

# schedule="auto": the candidates per mask, the first that serves the problem wins
# (docs/design.md, `auto-schedule`).
AUTO_SCHEDULES: dict[str, tuple[str, ...]] = {
    "full": ("shift", "fa3"),
    "causal": ("symmetric_shift", "spt"),
}

# fused_convert pays where the convert kernel's time beats the converter warps' share of the
# main kernel (docs/design.md, `fused-convert`).
FUSED_CONVERT_COST = 0.03          # fraction of the main kernel the converter costs
CONVERT_BYTES_PER_US = 4.0e6       # the convert kernel's bandwidth (4 TB/s)
TASK_US = {64: 3.00, 128: 2.54}    # main-kernel time per task (dashgen calibrate, per head_dim)
# early_kv pays where KV segments are short (docs/design.md, `early-kv`).
EARLY_KV_MAX_SEGMENT_TASKS = 10
# The most KV tiles a query tile visits where the persistent forward pays, per (head_dim,
# causal), measured through 16384 keys (docs/design.md, `fwd-persistent`).
FWD_PERSISTENT_MAX_KV_TILES = {(64, False): 128, (128, False): 16,
                               (64, True): 8, (128, True): 128}


@dataclass(frozen=True)
class Overrides:
    """Explicit choices that replace a per-problem policy (None: the policy decides)."""

    fused_convert: bool | None = None
    early_kv: bool | None = None
    persistent_forward: bool | None = None


@dataclass(frozen=True)
class Selection:
    """What runs for a problem: the kernels, and the schedule the backward walks on how many
    workers."""

    problem: Problem
    forward: ForwardVariant
    backward: BackwardVariant
    schedule: str
    num_workers: int


@memo(max_entries=256)
def problem_for(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                head_dim: int, causal: bool) -> Problem:
    """The schedule problem in the tiles of the backward that serves it (memoized: a training
    loop asks for the same shapes every step)."""
    block_m, block_n = backward_tiles(head_dim)
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim,
                   mask=Mask.causal() if causal else Mask.full(), block_m=block_m,
                   block_n=block_n)


def problem_of_shapes(q_shape: tuple, k_shape: tuple, causal: bool) -> Problem:
    """problem_for from q's (batch, seqlen_q, heads_q, head_dim) and k's shapes."""
    batch, seqlen_q, heads_q, head_dim = q_shape
    return problem_for(batch, heads_q, k_shape[2], seqlen_q, k_shape[1], head_dim, causal)


def check_kernel_problem(problem: Problem) -> None:
    """Raise ValueError naming the field where the kernels cannot run `problem`: a head_dim
    without a kernel, a mask other than full or causal, or tiles other than the backward's."""
    block_m, block_n = backward_tiles(problem.head_dim)
    for name, value, need in (("block_m", problem.block_m, block_m),
                              ("block_n", problem.block_n, block_n)):
        if value != need:
            raise ValueError(f"{name} must be {need}, the backward's tile at head_dim "
                             f"{problem.head_dim} ({block_m}x{block_n}), got {value}")
    if problem.mask.kind not in ("full", "causal"):
        raise ValueError(f"mask must be full or causal for the kernels, got {problem.mask}")


def resolve_schedule(problem: Problem, schedule: str, num_workers: int | None,
                     sm_count: int) -> tuple[str, int]:
    """(schedule name, worker count) for the kernels; raises ValueError naming the argument."""
    if num_workers is not None and num_workers > sm_count:
        raise ValueError(f"num_workers={num_workers} exceeds this GPU's {sm_count} SMs: persistent "
                         f"workers that cannot all be resident at once would deadlock on the "
                         f"dQ order")
    if schedule == "auto":
        candidates = AUTO_SCHEDULES[problem.mask.kind]
        schedule = next(s for s in candidates if unsupported_reason(s, problem) is None)
        if num_workers is None:
            # The fewest workers as busy as the SM count's (docs/design.md, `balanced-workers`).
            return schedule, balanced_workers(schedule, problem, sm_count)
    elif get_builder(schedule).depends_on_workers and num_workers is None:
        raise ValueError(f"schedule={schedule!r} orders the dQ sums by the worker count, so the "
                         f"worker count decides the bits: pass num_workers explicitly (dashgen "
                         f"never reads it from the device silently)")
    reason = unsupported_reason(schedule, problem)
    if reason is not None:
        raise ValueError(f"schedule={schedule!r} cannot serve this problem: {reason}")
    return schedule, sm_count if num_workers is None else num_workers


def forward_persistent_pays(seqlen_k: int, head_dim: int, causal: bool) -> bool:
    """Whether persistent CTAs pay for a forward with seqlen_k keys."""
    kv_tiles = -(-seqlen_k // FORWARD_BLOCK_N)
    return kv_tiles <= FWD_PERSISTENT_MAX_KV_TILES.get((head_dim, causal), 0)


def select_forward(problem: Problem, dtype: str, sm_count: int = DEFAULT_SM_COUNT,
                   overrides: Overrides = Overrides()) -> ForwardVariant:
    """The forward variant for a problem (the forward alone, as inference runs it)."""
    check_dtype_head_dim(dtype, problem.head_dim)
    causal = problem.mask.kind == "causal"
    persistent = overrides.persistent_forward
    if persistent is None:
        persistent = forward_persistent_pays(problem.seqlen_k, problem.head_dim, causal)
    # Under a causal mask the persistent order takes whole heads a round; past the SM count the
    # hardware's one-CTA-a-tile dispatch balances the tiles.
    m_tiles = -(-problem.seqlen_q // FORWARD_BLOCK_M)
    persistent = persistent and (not causal or m_tiles <= sm_count)
    return ForwardVariant(dtype, problem.head_dim, causal, persistent=persistent)


def fuses_convert(problem: Problem, plan: KernelPlan) -> bool:
    """Whether converting dQ in the main kernel saves time: the convert kernel's estimated time
    against the converter's cost, a fraction of the main kernel estimated from the longest
    worker's task count. True for short sequences (at 16384 tokens: 1k-2k, and 4k causal)."""
    offsets = plan.worker_offsets
    convert_us = (problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim * 6
                  / CONVERT_BYTES_PER_US)
    longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
    return convert_us > FUSED_CONVERT_COST * longest * TASK_US[problem.head_dim]


def early_kv_pays(problem: Problem) -> bool:
    """Whether loading each KV segment's K/V early pays: where segments are short. A verified
    schedule runs each KV tile as one segment (contiguity), so the mean segment is the tasks
    per KV tile that has any."""
    per_head = [len(problem.m_blocks_of(n)) for n in range(problem.num_n_blocks)]
    tasks, segments = sum(per_head), sum(1 for count in per_head if count)
    return tasks <= EARLY_KV_MAX_SEGMENT_TASKS * max(segments, 1)


def verified_plan(problem: Problem, schedule: str, num_workers: int) -> KernelPlan:
    """Build, verify and lower a schedule (a schedule that could deadlock the kernel never
    reaches it)."""
    s = build_schedule(schedule, problem, num_workers)
    verify(s)
    return lower(s)


def select(problem: Problem, dtype: str, *, deterministic: bool = True, trace: bool = False,
           schedule: str = "auto", num_workers: int | None = None,
           sm_count: int = DEFAULT_SM_COUNT, overrides: Overrides = Overrides(),
           plan_of: Callable[[Problem, str, int], KernelPlan] = verified_plan) -> Selection:
    """Everything that runs for `problem` in `dtype`: raises ValueError naming the argument.

    `plan_of(problem, schedule, num_workers)` gives the lowered plan where a policy reads it
    (fused_convert: the longest worker); the runtime passes its cached plans."""
    check_dtype_head_dim(dtype, problem.head_dim)
    check_kernel_problem(problem)
    name, workers = resolve_schedule(problem, schedule, num_workers, sm_count)
    causal = problem.mask.kind == "causal"
    early_kv = overrides.early_kv
    if early_kv is None:
        early_kv = early_kv_pays(problem)
    fused = bool(overrides.fused_convert) and deterministic
    if overrides.fused_convert is None and deterministic:
        fused = fuses_convert(problem, plan_of(problem, name, workers))
    backward = BackwardVariant(dtype, problem.head_dim, causal, deterministic=deterministic,
                               gqa=problem.gqa, fused_convert=fused, early_kv=early_kv,
                               trace=trace)
    return Selection(problem, select_forward(problem, dtype, sm_count, overrides), backward,
                     name, workers)
