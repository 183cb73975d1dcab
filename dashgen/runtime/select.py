"""The one place that chooses: for a problem, the forward and backward kernel variants, the
schedule and the worker count.

`select` is what every call, `dashgen emit` and the benchmark go through; the calls reach it
through `plan`, once per call signature (a packed call reaches `select_pack` through
`pack_selection`). `Overrides` replace a per-problem policy for a measurement (never a module
global). Each policy cites the entry of docs/design.md that holds the measurement behind it.
Pure Python: no torch, no driver.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from ..caches import memo
from ..codegen.variants import (DQ_LAST_HEAD_DIMS, FORWARD_BLOCK_M, FORWARD_BLOCK_N,
                                BackwardVariant, ForwardVariant, backward_tiles,
                                check_dtype_head_dim, kernel_head_dim, runs_swapped)
from ..schedule.builders import (HYBRID_MAX_TILES, hybrid_need, Tiling, get_builder, schedule_loads,
                                 unsupported_reason)
from ..schedule.builders.base import fewest_workers
from ..schedule.ir import Schedule
from ..schedule.problem import Mask, Problem
from .tables import is_table, register, table_of

DEFAULT_SM_COUNT = 132  # H100 SXM and H200: the worker count `show`, `plan` and `emit` assume

# schedule="auto": the candidates per mask, the first that serves the problem on the SMs wins
# (docs/design.md, `auto-schedule`): a DASH order where one sequence's units fit on them at once,
# else the launch-ordered fallback, live on any worker count.
AUTO_SCHEDULES: dict[str, tuple[str, ...]] = {
    "full": ("shift", "fa3"),
    "causal": ("symmetric_shift", "spt_listed"),
    # A sliding window: no shift order serves a band (lab/notes/tried-and-dropped.md,
    # `band-shift`); spt on the listed deal had the shortest simulated makespans there.
    "window": ("spt_listed",),
}
# deterministic=False promises no bits, only speed: past symmetric_shift the unordered kernel
# runs spt's round-robin deal, which measured faster without the order than the listed one
# (1.23x at 262,144 tokens, d128; docs/design.md, `listed-deal`).
AUTO_UNORDERED_SCHEDULES: dict[str, tuple[str, ...]] = {
    "full": ("shift", "fa3"),
    "causal": ("symmetric_shift", "spt"),
    "window": ("spt",),
}
# The least share of the workers a schedule whose units run together may leave busy under
# auto; below it the next candidate runs (`uses_the_workers`).
AUTO_MIN_WORKER_USE = 0.85
# No sliding window: FlashAttention's window_size of a full or a causal mask.
NO_WINDOW = (-1, -1)
# Head dims whose full masks take fa3 where one sequence's KV tiles exceed half the workers
# (shift then runs one head a wave; fa3 on every worker measured 2-3% faster at d64 16k, the
# same at d128: docs/design.md, `auto-fa3-long-full`).
AUTO_FA3_LONG_FULL_HEAD_DIMS = (64,)

# fused_convert pays where the convert kernel's time beats the converter warps' share of the
# main kernel (docs/design.md, `fused-convert`). Per head_dim: at 64 the kernels without the
# converter keep two dS tiles (`ds64-two-tiles`), which the converter's share must also pay for.
FUSED_CONVERT_COST = {64: 0.05, 128: 0.03}  # fraction of the main kernel the converter costs
CONVERT_BYTES_PER_US = 4.0e6       # the convert kernel's bandwidth (4 TB/s)
TASK_US = {64: 3.00, 128: 2.54}    # main-kernel time per task (lab/calibrate.py, per head_dim)
# early_kv pays where a sequence has at most this many KV tiles (docs/design.md, `early-kv`).
EARLY_KV_MAX_KV_TILES = 32
# dq_last (a task's dQ wgmmas after dK's, Q/dO freed before the dQ hand-off) in the ordered
# causal backward from this many KV tiles a sequence on, per head_dim: at 128 measured 1.04-1.34x
# from 64k tokens, neutral at 32k; at 64 (where it spills 56 bytes) 0.92x at 64k, 1.14x at 128k,
# 1.26x at 256k; under full masks 0.97-0.99x (docs/design.md, `dq-last-long`).
DQ_LAST_FROM_KV_TILES = {64: 1024, 128: 512}
# Two dQ writer lanes, a staging buffer each, in place of the fused converter (its warps are
# the second writer's), in the ordered backward of these head dims' kernels from this many KV
# tiles a sequence on, under full and causal masks: at 128 the main kernel measured 0.92-0.93x
# one writer's time at 16,384 tokens and 0.95-0.96x at 131,072-262,144 (docs/design.md,
# `dq-writers`). Shorter rows, the unordered kernel, windows, soft-capping and packs keep one.
DQ_WRITERS_FROM_KV_TILES = {128: 128}
# The most KV tiles a query tile visits where the persistent forward pays, per (head_dim,
# causal), measured through 16384 keys (docs/design.md, `fwd-persistent`).
FWD_PERSISTENT_MAX_KV_TILES = {(64, False): 8, (128, False): 64,
                               (64, True): 128, (128, True): 128}


@dataclass(frozen=True)
class Overrides:
    """Explicit choices that replace a per-problem policy (None: the policy decides)."""

    fused_convert: bool | None = None
    early_kv: bool | None = None
    persistent_forward: bool | None = None
    dq_last: bool | None = None
    # dQ writer lanes (BackwardVariant.dq_writers): 2 runs without fused_convert.
    dq_writers: int | None = None


@dataclass(frozen=True)
class Selection:
    """What runs for a problem: the kernels, and the schedule the backward walks on how many
    workers (`table`: the key of a verified schedule file, dashgen.runtime.tables, which runs
    from its task table)."""

    problem: Problem
    forward: ForwardVariant
    backward: BackwardVariant
    schedule: str
    num_workers: int
    table: str | None = None

    def soft_capped(self, softcap: bool, two_writers_asked: bool = False) -> Selection:
        """This selection with soft-capped kernels where `softcap` (attn/softcap.cuh): the cap
        changes the scores, never the tiles, the schedule or the workers, so a plan stays the
        same with or without it and only the kernels differ. Two dQ writers under a cap have
        not been timed: the policy's pick falls back to one writer (the converter stays off,
        as select leaves it at those lengths) unless Overrides asked for two
        (`two_writers_asked`; a bool, which torch.compile traces through)."""
        if not softcap:
            return self
        backward = replace(self.backward, softcap=True)
        if backward.dq_writers == 2 and not two_writers_asked:
            backward = replace(backward, dq_writers=1)
        return replace(self, forward=replace(self.forward, softcap=True), backward=backward)

    def with_head_dim_v(self, head_dim_v: int) -> Selection:
        """This selection with V, O and dO `head_dim_v` wide (HEAD_DIM_V_PAIRS: 128 under 192,
        MLA): V's width changes neither the tiles nor the schedule, only the kernels' loads of
        V and dO and the dV they store. ValueError naming head_dim_v where no kernel has it."""
        if head_dim_v == self.problem.head_dim:
            return self
        return replace(self, forward=replace(self.forward, head_dim_v=head_dim_v),
                       backward=replace(self.backward, head_dim_v=head_dim_v))


def v_width(q, v) -> int | None:
    """V's head_dim where it differs from q's (MLA's 128 under 192), else None: the argument
    forward_call takes, so that a signature has one memo entry."""
    return None if v.shape[-1] == q.shape[-1] else v.shape[-1]


def mask_of(causal: bool, window: tuple[int, int] = NO_WINDOW) -> Mask:
    """The mask of a call's resolved causal and window (checks.window: FlashAttention's
    (left, right), -1 an open side; (-1, -1) none, and then causal decides)."""
    if tuple(window) == NO_WINDOW:
        return Mask.causal() if causal else Mask.full()
    left, right = window
    return Mask.window(None if left < 0 else left, None if right < 0 else right)


@memo(max_entries=256)
def problem_for(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                head_dim: int, causal: bool, window: tuple[int, int] = NO_WINDOW) -> Problem:
    """The schedule problem in the tiles of the backward that serves it (memoized: a training
    loop asks for the same shapes every step)."""
    block_m, block_n = backward_tiles(head_dim)
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, mask=mask_of(causal, window),
                   block_m=block_m, block_n=block_n)


def problem_of_shapes(q_shape: tuple, k_shape: tuple, causal: bool,
                      window: tuple[int, int] = NO_WINDOW) -> Problem:
    """problem_for from q's (batch, seqlen_q, heads_q, head_dim) and k's shapes."""
    batch, seqlen_q, heads_q, head_dim = q_shape
    return problem_for(batch, heads_q, k_shape[2], seqlen_q, k_shape[1], head_dim, causal,
                       tuple(window))


def check_kernel_problem(problem: Problem) -> None:
    """Raise ValueError naming the field where the kernels cannot run `problem`: a head_dim
    without a kernel, or tiles other than the backward's."""
    block_m, block_n = backward_tiles(problem.head_dim)
    for name, value, need in (("block_m", problem.block_m, block_m),
                              ("block_n", problem.block_n, block_n)):
        if value != need:
            raise ValueError(f"{name} must be {need}, the backward's tile at head_dim "
                             f"{problem.head_dim} ({block_m}x{block_n}), got {value}")
    if problem.is_pack:
        raise ValueError("a pack has no per-shape kernel selection: the varlen kernels read "
                         "its lengths at run time (dashgen.attention_varlen)")


def resolve_schedule(problem: Problem, schedule: str, num_workers: int | None,
                     sm_count: int, deterministic: bool = True) -> tuple[str, int]:
    """(schedule name, workers the launch runs); raises ValueError naming the argument. The
    worker count decides only who runs what when: the ranks, so the bits, are the tiles'.
    `deterministic`: whether the backward orders its dQ sums (auto's candidates differ)."""
    if num_workers is not None and num_workers > sm_count:
        raise ValueError(f"num_workers={num_workers} exceeds this GPU's {sm_count} SMs: persistent "
                         f"workers that cannot all be resident at once would deadlock on the "
                         f"dQ order")
    workers = sm_count if num_workers is None else num_workers
    auto = schedule == "auto"
    if auto:
        candidates = (AUTO_SCHEDULES if deterministic
                      else AUTO_UNORDERED_SCHEDULES)[problem.mask.kind]
        if (problem.mask.kind == "full" and problem.head_dim in AUTO_FA3_LONG_FULL_HEAD_DIMS
                and problem.num_n_blocks > workers // 2):
            candidates = ("fa3",)
        schedule = next(s for s in candidates if unsupported_reason(s, problem) is None
                        and get_builder(s).min_workers(problem) <= workers
                        and (s == candidates[-1] or uses_the_workers(problem, s, workers)))
    reason = unsupported_reason(schedule, problem)
    if reason is not None:
        raise ValueError(f"schedule={schedule!r} cannot serve this problem: {reason}")
    policy = get_builder(schedule)
    try:
        used = policy.workers_used(problem, workers)
    except ValueError as exc:
        raise ValueError(f"num_workers: {exc}") from None
    if auto and num_workers is None:
        tiling = Tiling(problem)
        if policy.runs_together(tiling):
            used = balanced_workers(problem, policy.units(tiling), used)
    return schedule, used


def uses_the_workers(problem: Problem, schedule: str, workers: int) -> bool:
    """Whether `schedule` keeps at least AUTO_MIN_WORKER_USE of `workers` busy. A schedule whose
    sequence's units run together holds whole sequences a wave: where they fill the SMs badly
    (one sequence of 86 units on 132 SMs) the launch-ordered fallback, live on every worker,
    is faster despite its rank waits (docs/design.md, `auto-worker-use`)."""
    policy = get_builder(schedule)
    tiling = Tiling(problem)
    if not policy.runs_together(tiling):
        return True
    units = problem.batch * problem.heads_q * policy.units(tiling)  # one a worker at most
    return policy.workers_used(problem, workers) >= AUTO_MIN_WORKER_USE * min(workers, units)


def balanced_workers(problem: Problem, per_seq: int, workers: int) -> int:
    """The fewest workers, a multiple of one sequence's `per_seq` units, that deal the units in
    as many rounds as `workers` do (docs/design.md, `balanced-workers`): a shift schedule's units
    of one sequence are alike, so no worker gets more work, and fewer workers hold fewer
    partial rounds (measured 0.3-4.8% faster: 128 rather than 132 workers at 1k-16k)."""
    fewest = fewest_workers(problem.batch * problem.heads_q * per_seq, workers)
    return min(workers, -(-fewest // per_seq) * per_seq)


def forward_persistent_pays(seqlen_k: int, head_dim: int, causal: bool) -> bool:
    """Whether persistent CTAs pay for a forward with seqlen_k keys."""
    kv_tiles = -(-seqlen_k // FORWARD_BLOCK_N)
    return kv_tiles <= FWD_PERSISTENT_MAX_KV_TILES.get((kernel_head_dim(head_dim), causal), 0)


def select_forward(problem: Problem, dtype: str, sm_count: int = DEFAULT_SM_COUNT,
                   overrides: Overrides = Overrides()) -> ForwardVariant:
    """The forward variant for a problem (the forward alone, as inference runs it)."""
    check_dtype_head_dim(dtype, problem.head_dim)
    causal = problem.mask.kind == "causal"
    if problem.mask.kind == "window":
        # One CTA a query tile: a window's tiles cost alike, which the hardware's dispatch
        # balances; the persistent kernels order a causal mask's tiles.
        if overrides.persistent_forward:
            raise ValueError("persistent_forward: a window's forward runs one CTA a query tile")
        return ForwardVariant(dtype, problem.head_dim, False, window=True)
    persistent = overrides.persistent_forward
    if persistent is None:
        # Under a causal mask the persistent kernel was measured up to the SM count's tiles a
        # head; past it the hardware's one-CTA-a-tile dispatch balances the tiles.
        m_tiles = -(-problem.seqlen_q // FORWARD_BLOCK_M)
        persistent = (forward_persistent_pays(problem.seqlen_k, problem.head_dim, causal)
                      and (not causal or m_tiles <= sm_count))
    return ForwardVariant(dtype, problem.head_dim, causal, persistent=persistent)


def fuses_convert(problem: Problem, longest: int) -> bool:
    """Whether converting dQ in the main kernel saves time: the convert kernel's estimated time
    against the converter's cost, a fraction of the main kernel estimated from the longest
    worker's task count. True for short sequences (at 16384 tokens: head_dim 64 full 1k and
    causal 1k-2k; head_dim 128 1k-2k and causal 4k)."""
    convert_us = (problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim * 6
                  / CONVERT_BYTES_PER_US)
    kernel = kernel_head_dim(problem.head_dim)  # the per-task costs are the kernel's
    return convert_us > FUSED_CONVERT_COST[kernel] * longest * TASK_US[kernel]


def two_writers_pay(problem: Problem) -> bool:
    """Whether the ordered backward runs two dQ writer lanes (DQ_WRITERS_FROM_KV_TILES), unless
    an explicit fused_convert=True keeps the converter's warps."""
    bound = DQ_WRITERS_FROM_KV_TILES.get(kernel_head_dim(problem.head_dim))
    return (bound is not None and problem.mask.kind in ("full", "causal")
            and problem.num_n_blocks >= bound)


def early_kv_pays(problem: Problem) -> bool:
    """Whether loading each KV segment's K/V early pays: where the sequence has at most
    EARLY_KV_MAX_KV_TILES KV tiles. Measured on the H200 up to that bound and from twice it
    on, under both masks at both head dims; segment length alone does not separate the two."""
    return problem.num_n_blocks <= EARLY_KV_MAX_KV_TILES


def resolve_table(problem: Problem, table: Schedule, num_workers: int | None,
                   sm_count: int) -> int:
    if table.problem != problem:
        raise ValueError(f"schedule: the file's problem ({table.problem.describe()}) is not this "
                         f"call's ({problem.describe()})")
    if num_workers is not None and num_workers != table.num_workers:
        raise ValueError(f"num_workers={num_workers}: the schedule file runs on "
                         f"{table.num_workers} workers")
    if table.num_workers > sm_count:
        raise ValueError(f"schedule: the file's {table.num_workers} workers exceed this GPU's "
                         f"{sm_count} SMs (they must all be resident at once)")
    return table.num_workers


class Plan:
    """What runs for a problem (`select` is Plan(...).selection), decided in two steps. On
    construction the checks and the schedule: its name and the workers the launch runs
    (ValueError naming the argument, before any kernel is launched). `selection`, the kernels
    and every per-problem policy, is made on first use: a forward under no_grad never needs it,
    and at long sequences it costs milliseconds (the fused-convert estimate walks every KV
    tile's rows)."""

    def __init__(self, problem: Problem, dtype: str, *, deterministic: bool = True,
                 trace: bool = False, schedule: str | Schedule = "auto",
                 num_workers: int | None = None, sm_count: int = DEFAULT_SM_COUNT,
                 overrides: Overrides = Overrides()):
        check_dtype_head_dim(dtype, problem.head_dim)
        check_kernel_problem(problem)
        table = schedule if isinstance(schedule, Schedule) else None
        if table is not None:
            name, workers = "table", resolve_table(problem, table, num_workers, sm_count)
        else:
            name, workers = resolve_schedule(problem, schedule, num_workers, sm_count,
                                             deterministic)
        self.problem, self.dtype, self.overrides = problem, dtype, overrides
        self.deterministic, self.trace, self.sm_count = deterministic, trace, sm_count
        self.schedule, self.num_workers, self.table = name, workers, table
        # The schedule as a call carries it: its name, or the schedule file's key.
        self.schedule_key = name if table is None else register(table)

    @cached_property
    def selection(self) -> Selection:
        problem, overrides, workers, table = (self.problem, self.overrides, self.num_workers,
                                              self.table)
        causal = problem.mask.kind == "causal"
        window = problem.mask.kind == "window"
        early_kv = overrides.early_kv
        if early_kv is None:
            early_kv = early_kv_pays(problem)
        fused = overrides.fused_convert
        if runs_swapped(problem.head_dim, causal):
            # The swapped mainloop's dQ is converted by the convert kernel.
            if fused:
                raise ValueError(f"fused_convert: head_dim {problem.head_dim} runs the swapped "
                                 f"mainloop, whose dQ the convert kernel converts")
            fused = False
        writers = overrides.dq_writers
        if writers is None:
            writers = 2 if self.deterministic and two_writers_pay(problem) and not fused else 1
        if writers == 2 and fused is None:
            fused = False  # the converter's warps would be the second writer's
        elif window and fused is None and not self.deterministic:
            # Under a window the converter was timed in the deterministic backward only (its
            # ordered spt_listed kernel); deterministic=False keeps the unordered one.
            fused = False
        if fused is None:
            # The busiest worker carries at least the mean: where even that rules the converter
            # out (long sequences), the per-worker loads, O(units), are never counted.
            tiling = Tiling(problem)
            total = problem.batch * problem.heads_q * sum(map(tiling.rows, range(tiling.num_n)))
            fused = fuses_convert(problem, -(-total // workers))
            if fused:
                loads = ([len(program) for program in table.workers] if table is not None
                         else schedule_loads(self.schedule, problem, workers))
                fused = fuses_convert(problem, max(loads, default=0))
        # deterministic=False asks for the fastest backward, not for unordered adds: where dQ is
        # converted in the main kernel, which only the ordered kernel can do (it alone knows when
        # a tile's sum is final), the unordered one would add the accumulator's zeroing and the
        # convert kernel's pass, so the ordered kernel runs (docs/design.md, `unordered-unfused`).
        ordered = self.deterministic or fused
        dq_last = overrides.dq_last
        if dq_last is None:
            # The ordered causal kernel only: unordered or under a full mask it measured slower.
            kernel = kernel_head_dim(problem.head_dim)
            dq_last = (ordered and causal and kernel in DQ_LAST_HEAD_DIMS
                       and problem.num_n_blocks >= DQ_LAST_FROM_KV_TILES[kernel])
        backward = BackwardVariant(self.dtype, problem.head_dim, causal, self.schedule,
                                   deterministic=ordered, gqa=problem.gqa, fused_convert=fused,
                                   early_kv=early_kv, dq_last=dq_last, trace=self.trace,
                                   window=window, dq_writers=writers)
        forward = select_forward(problem, self.dtype, self.sm_count, overrides)
        return Selection(problem, forward, backward, self.schedule, workers,
                         None if table is None else self.schedule_key)


def select(problem: Problem, dtype: str, *, deterministic: bool = True, trace: bool = False,
           schedule: str | Schedule = "auto", num_workers: int | None = None,
           sm_count: int = DEFAULT_SM_COUNT, overrides: Overrides = Overrides()) -> Selection:
    """Everything that runs for `problem` in `dtype`: raises ValueError naming the argument.
    `schedule` is a name, "auto", or a verified Schedule (dashgen.load_schedule), which runs
    from its task table. No schedule is built here: O(units) integer work at most."""
    return Plan(problem, dtype, deterministic=deterministic, trace=trace, schedule=schedule,
                num_workers=num_workers, sm_count=sm_count, overrides=overrides).selection


@memo(max_entries=512)
def plan(q_shape: tuple, k_shape: tuple, dtype: str, causal: bool, deterministic: bool,
         trace: bool, schedule: str, num_workers: int | None, sm_count: int,
         overrides: Overrides, window: tuple[int, int] = NO_WINDOW) -> Plan:
    """The Plan of a call's signature, made once: q's (batch, seqlen_q, heads_q, head_dim) and
    k's shapes, `schedule` a name, "auto" or a schedule file's key (dashgen.runtime.tables). The
    one door from the calls to `select`: dashgen.attention's checks resolve their options
    through it and the backward's launches take its selection. A plan is also filed under the
    arguments it resolves to (its schedule's name or key, its worker count), which select the
    same: a named schedule on its own worker count resolves to itself (workers_used keeps a
    count it returned, balanced_workers returns one of its multiples). So a launch handed the
    resolved options (runtime.backward, the custom ops) finds the plan the checks made."""
    made = Plan(problem_of_shapes(q_shape, k_shape, causal, window), dtype,
                deterministic=deterministic, trace=trace,
                schedule=table_of(schedule) if is_table(schedule) else schedule,
                num_workers=num_workers, sm_count=sm_count, overrides=overrides)
    resolved = (q_shape, k_shape, dtype, causal, deterministic, trace, made.schedule_key,
                made.num_workers, sm_count, overrides, *window_arg(window))
    plan.get(resolved, lambda: made)
    return made


def window_arg(window: tuple[int, int]) -> tuple:
    """plan's window argument as every caller passes it: none without a window, so that a call
    with and one without the default file one plan (the memo keys on the arguments as passed)."""
    return () if tuple(window) == NO_WINDOW else (tuple(window),)


def selection(q_shape: tuple, k_shape: tuple, dtype: str, causal: bool, deterministic: bool,
              trace: bool, schedule: str, num_workers: int | None, sm_count: int,
              overrides: Overrides, window: tuple[int, int] = NO_WINDOW) -> Selection:
    """`select` for a call's signature, through its plan."""
    return plan(q_shape, k_shape, dtype, causal, deterministic, trace, schedule, num_workers,
                sm_count, overrides, *window_arg(window)).selection


# A pack's "auto" per mask (causal: name): one schedule whatever the lengths, live on any
# Hopper's SM count, so a sequence's bits never follow the rest of the pack or the GPU
# (docs/design.md, `pack-auto`). The schedules a pack's kernels walk.
PACK_AUTO_SCHEDULES = {False: "hybrid", True: "hybrid"}
PACK_SCHEDULES = ("fa3", "spt", "descending", "shift", "symmetric_shift", "hybrid")
# A pack under a sliding window: the launch-ordered policies over each sequence's
# WindowTiling, spt by default (its deal spreads the bands' units as the fixed-length one does).
PACK_WINDOW_SCHEDULES = ("spt", "fa3", "descending")


def select_pack(dtype: str, head_dim: int, causal: bool, schedule: str, *,
                deterministic: bool = True, gqa: bool = False,
                window: bool = False) -> Selection:
    """The varlen kernels that run a packed batch (dashgen.attention_varlen): one pair per
    (dtype, head_dim, mask, schedule, mode), whatever the lengths, which they read at run time.
    early_kv always: a pack's documents (median ~1k tokens) have few KV tiles
    (`early-kv`). The Selection's problem is a one-token placeholder and num_workers 0: the
    launch decides the workers (pack_workers)."""
    check_dtype_head_dim(dtype, head_dim)
    if window:
        name = PACK_WINDOW_SCHEDULES[0] if schedule == "auto" else schedule
        if name not in PACK_WINDOW_SCHEDULES:
            raise ValueError(f"schedule must be 'auto' or one of {PACK_WINDOW_SCHEDULES} for a "
                             f"pack under a sliding window, got {schedule!r}")
        forward = ForwardVariant(dtype, head_dim, False, varlen=True, window=True)
        backward = BackwardVariant(dtype, head_dim, False, name, deterministic=deterministic,
                                   gqa=gqa, early_kv=True, varlen=True, window=True)
        return Selection(problem_for(1, 2 if gqa else 1, 1, 1, 1, head_dim, False), forward,
                         backward, name, 0)
    name = PACK_AUTO_SCHEDULES[causal] if schedule == "auto" else schedule
    if name not in PACK_SCHEDULES:
        raise ValueError(f"schedule must be 'auto' or one of {PACK_SCHEDULES} for a pack, got "
                         f"{schedule!r} (schedule files describe one fixed shape)")
    if name == "shift" and causal:
        raise ValueError("schedule='shift' serves the full mask; use 'symmetric_shift' with "
                         "causal=True")
    if name == "symmetric_shift" and not causal:
        raise ValueError("schedule='symmetric_shift' serves the causal mask; use 'shift' with "
                         "causal=False")
    forward = ForwardVariant(dtype, head_dim, causal, varlen=True)
    backward = BackwardVariant(dtype, head_dim, causal, name, deterministic=deterministic,
                               gqa=gqa, early_kv=True, varlen=True)
    problem = problem_for(1, 2 if gqa else 1, 1, 1, 1, head_dim, causal)
    return Selection(problem, forward, backward, name, 0)


@memo(max_entries=256)
def pack_selection(dtype: str, head_dim: int, causal: bool, schedule: str, deterministic: bool,
                   gqa: bool, window: bool = False) -> Selection:
    """select_pack for a packed call, made once: the door from the packed calls to it."""
    return select_pack(dtype, head_dim, causal, schedule, deterministic=deterministic, gqa=gqa,
                       window=window)


def pack_workers(schedule: str, max_seqlen_k: int, block_n: int, workers: int,
                 causal: bool) -> int:
    """The workers a packed backward runs on: all of them; a schedule whose units run together
    needs the longest sequence's units (its KV tiles; half of them, symmetric_shift; hybrid
    those of a sequence of at most HYBRID_MAX_TILES tiles, the longest that runs at once)."""
    tiles = -(-max_seqlen_k // block_n)
    need = {"shift": tiles, "symmetric_shift": -(-tiles // 2),
            "hybrid": hybrid_need(min(HYBRID_MAX_TILES, tiles), causal)}.get(schedule, 1)
    if need > workers:
        raise ValueError(f"schedule={schedule!r} needs {need} workers for a sequence of "
                         f"{max_seqlen_k} keys (its units run together), more than the "
                         f"{workers} this launch has")
    return workers
