"""What every named schedule shares: the tiling formulas, the policy interface, the persistent
deal, and the one rank count the DASH shift orders use.

A named schedule is a scheduler policy: for one (batch, head) sequence it splits the work into
units (one or two KV segments that run back to back on one worker) and says, for step i of unit
u, which tile runs and its dq_rank, from integer formulas over the sequence's shape. The kernel
runs the same formulas from templates/include/dashgen/sched/ (the C++ definition); this module
and its siblings read them in Python for show, plan, verify and simulate, and
tests/test_policy_header.py compiles the header on the host and proves both enumerate the same
tasks, rank for rank. Ranks never read the worker count, the batch or the other heads: the
worker count only decides who runs which unit when (docs/design.md, `ranks-by-tiles`).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..ir import Schedule, Task
from ..problem import Problem


class UnsupportedProblem(ValueError):
    """A builder cannot serve this problem; the message says why and what to use instead."""

    def __init__(self, schedule: str, reason: str):
        super().__init__(f"schedule {schedule!r} cannot serve this problem: {reason}")
        self.schedule = schedule
        self.reason = reason


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Tiling:
    """One sequence's tiles as the policies see them (dashgen/sched/tiling.cuh): which Q tiles
    a KV tile contributes to and which KV tiles a Q tile receives, as intervals. Full and causal
    masks in closed form (the kernels' two); other masks from the Problem's tile lists. In a
    pack, `batch` names the sequence."""

    __slots__ = ("problem", "batch", "seqlen_q", "seqlen_k", "num_m", "num_n", "kind", "_rows")

    def __init__(self, problem: Problem, batch: int | None = None):
        self.problem, self.batch = problem, batch if problem.is_pack else None
        self.seqlen_q, self.seqlen_k = problem.lengths(self.batch)
        self.num_m, self.num_n = problem.num_m_blocks_of(self.batch), problem.num_n_blocks_of(self.batch)
        self.kind = problem.mask.kind
        self._rows = None if self.kind in ("full", "causal") else [
            problem.m_blocks_of(n, self.batch) for n in range(self.num_n)]

    def first_m(self, n: int) -> int:
        """The first Q tile KV tile n contributes to (its rows are first_m .. last_m)."""
        p = self.problem
        if self.kind == "full":
            return 0
        if self.kind == "causal":
            if self.num_m == 0:  # a sequence without queries (a pack's): no tile has rows
                return 0
            # Q tile m sees keys up to min(seqlen_q, (m + 1) block_m) - 1 + seqlen_k - seqlen_q.
            return min(max((n * p.block_n - (self.seqlen_k - self.seqlen_q)) // p.block_m, 0),
                       self.num_m - 1)
        rows = self._rows[n]
        return rows[0] if rows else 0

    def last_m(self, n: int) -> int:
        if self._rows is None:
            return self.num_m - 1
        rows = self._rows[n]
        return rows[-1] if rows else -1

    def rows(self, n: int) -> int:
        """Tasks of KV tile n."""
        return self.last_m(n) - self.first_m(n) + 1

    def first_n(self, m: int) -> int:
        """The first KV tile that contributes to Q tile m (0 under full and causal masks)."""
        if self._rows is None:
            return 0
        keys = self.problem._key_range(m, self.batch)
        return 0 if keys is None else keys[0] // self.problem.block_n

    def count(self, m: int) -> int:
        """Contributions the dQ sum of Q tile m receives (KV tiles first_n .. first_n+count-1)."""
        p = self.problem
        if self.kind == "full":
            return self.num_n
        if self.kind == "causal":
            last_key = (min(self.seqlen_q, (m + 1) * p.block_m) - 1 + self.seqlen_k
                        - self.seqlen_q)
            return 0 if last_key < 0 else min(self.num_n - 1, last_key // p.block_n) + 1
        keys = p._key_range(m, self.batch)
        return 0 if keys is None else keys[1] // p.block_n - keys[0] // p.block_n + 1


class Step(NamedTuple):
    """Step i of a unit: the tile, its dq_rank, and whether it starts or ends a segment."""

    n_block: int
    m_block: int
    dq_rank: int
    seg_start: bool
    seg_end: bool


@dataclass(frozen=True)
class Policy:
    """A named schedule: its units per sequence and its steps, as the kernel computes them.

    heads_together: a sequence's units wait on each other both ways (arrival-ordered ranks), so
    all of one sequence's units must run at once: the worker count is rounded down to a
    multiple of `units` (never fewer than one sequence's worth: min_workers). `together`, where
    given, decides it per sequence instead (hybrid: by the sequence's size); runs_together reads
    whichever the policy has.
    """

    name: str
    kernel_id: int  # the policy's number in the kernel (its trace and watchdog report it)
    summary: str
    units: Callable[[Tiling], int]
    unit_tasks: Callable[[Tiling, int], int]
    step: Callable[[Tiling, int, int], Step]
    heads_together: bool
    supports: Callable[[Problem], str | None]  # None when served, else the reason it is not
    doc: str = ""
    # A pack deals units that run independently sorted by cost, in the direction their costs
    # run along the unit order under a causal mask: falling (fa3, descending: the first KV tile
    # has the most Q tiles) or rising (spt: the last first, the fewest). pack_units.
    deal_rising: bool = False
    together: Callable[[Tiling], bool] | None = None
    # A fixed-length launch's deal: False, unit g (sequence-major) on worker g mod W; True, the
    # same units listed (list_deal): each, in g order, to the worker whose dealt tasks end
    # first, so a later unit never starts before an earlier one (a table the kernel reads).
    listed: bool = False

    def runs_together(self, tiling: Tiling) -> bool:
        """Whether this sequence's units must all run at once."""
        return self.heads_together if self.together is None else self.together(tiling)

    def min_workers(self, problem: Problem) -> int:
        """The fewest workers the schedule is live on: one sequence's units if they must run
        together (in a pack the largest such sequence's), else one."""
        if problem.is_pack:
            return max([1] + [self.units(t) for t in pack_tilings(problem)
                              if self.runs_together(t) and _tasks(self, t)])
        tiling = Tiling(problem)
        return max(1, self.units(tiling)) if self.runs_together(tiling) else 1

    def workers_used(self, problem: Problem, num_workers: int) -> int:
        """The workers a launch on `num_workers` runs: all, or for heads_together a multiple of
        one sequence's units (whole sequences a wave), never more than there are units. A pack
        runs up to `num_workers` (pack_deal places each sequence's units in one wave)."""
        if problem.is_pack:
            need = self.min_workers(problem)
            if num_workers < need:
                raise ValueError(
                    f"schedule {self.name!r} needs at least {need} workers for this pack (the "
                    f"{need} units of its largest sequence wait on each other and must all run "
                    f"at once), got num_workers={num_workers}")
            # The units pack_deal places: every unit of a sequence that runs together (one
            # wave holds them all), the units with tasks of the others (pack_units).
            total = sum(self.units(t) if self.runs_together(t) and _tasks(self, t) else
                        sum(1 for u in range(self.units(t)) if self.unit_tasks(t, u))
                        for t in pack_tilings(problem))
            return max(1, min(num_workers, problem.heads_q * total))
        tiling = Tiling(problem)
        per_seq = max(1, self.units(tiling))
        total = problem.batch * problem.heads_q * per_seq
        if self.runs_together(tiling):
            if num_workers < per_seq:
                raise ValueError(
                    f"schedule {self.name!r} needs at least {per_seq} workers for this problem "
                    f"(the {per_seq} units of one sequence wait on each other and must all run at "
                    f"once), got num_workers={num_workers}")
            num_workers -= num_workers % per_seq
        return max(1, min(num_workers, total))


def pack_tilings(problem: Problem) -> list[Tiling]:
    """Each sequence's Tiling, in batch order."""
    return [Tiling(problem, b) for b in range(problem.batch)]


def _tasks(policy: Policy, tiling: Tiling) -> int:
    """One (batch, head) sequence's tasks under the policy."""
    return sum(policy.unit_tasks(tiling, u) for u in range(policy.units(tiling)))


def pack_order(policy: Policy, tilings: list[Tiling]) -> list[int]:
    """The order a pack's sequences are dealt in: most tasks first (the long sequences, whose
    units cost most, before the short ones fill in behind them), ties in batch order; sequences
    without tasks are left out."""
    tasks = [_tasks(policy, t) for t in tilings]
    return sorted((b for b, n in enumerate(tasks) if n), key=lambda b: (-tasks[b], b))


def _deals_rising(policy: Policy, problem: Problem) -> bool:
    """Whether a pack deals this policy's units cheapest first: where its unit costs rise along
    the unit order (spt under a causal mask). Under a full mask a sequence's units cost the
    same, and costliest first balances best for every policy."""
    return policy.deal_rising and problem.mask.kind != "full"


def _deal_keys(policy: Policy, tiling: Tiling, rising: bool) -> list[int]:
    """Each unit's cost as the pack deal sorts it: its tasks, made monotone along the unit order
    (the running maximum when dealing rising, else the running minimum), so that the sort keeps
    every sequence's units in their order, the order its ranks assume, whatever the costs."""
    keys, best = [], None
    for u in range(policy.units(tiling)):
        cost = policy.unit_tasks(tiling, u)
        best = cost if best is None else (max(best, cost) if rising else min(best, cost))
        keys.append(best)
    return keys


def pack_units(policy: Policy, problem: Problem) -> list[tuple[int, int]]:
    """(batch, unit) of a pack's units with tasks that run independently (of the sequences that
    do not run together), in the order they are dealt: by _deal_keys (costliest first, or for a
    rising policy cheapest first), ties by the sequence's place in pack_order, then the unit."""
    tilings = pack_tilings(problem)
    place = {b: k for k, b in enumerate(pack_order(policy, tilings))}
    rising = _deals_rising(policy, problem)
    items = []
    for b in place:
        if policy.runs_together(tilings[b]):
            continue
        for u, key in enumerate(_deal_keys(policy, tilings[b], rising)):
            if policy.unit_tasks(tilings[b], u):
                items.append((key if rising else -key, place[b], u, b))
    return [(b, u) for _, _, u, b in sorted(items)]


def snake_worker(j: int, workers: int) -> int:
    """The worker of item j in a snake deal: rounds of `workers` items, every second reversed."""
    r, c = divmod(j, workers)
    return c if r % 2 == 0 else workers - 1 - c


def pack_deal(policy: Policy, problem: Problem, num_workers: int) -> list[list[tuple[int, int, int]]]:
    """Each worker's units (batch, head, unit) of a pack, in the order it runs them.

    Units that run independently (fa3, spt, descending): the (unit, head) pairs of pack_units,
    heads innermost, dealt in a snake (pair j to worker j mod W, every second round of W
    reversed), so the costly units spread one a worker and each worker gets about as many
    tasks. Each sequence's units keep their order, and every wait of these schedules is on a
    sequence's earlier unit, dealt before, so the deal is live (by induction over j).

    Units that wait on each other (runs_together): sequences in pack_order, each sequence's
    heads in order, each (batch, head)'s units on consecutive workers of one wave, next fit:
    where they do not fit in what is left of the wave, the next wave starts (its first workers
    may still be in the previous one). Every wait is then between units of one wave on distinct
    workers, and a worker's earlier waves wait on nothing later, so the deal is live.

    A policy with both kinds (hybrid) deals the independent units first, then the waves from
    worker 0: the independent units wait only on their own sequences' units dealt before them,
    never on a wave, so they all finish, and then the waves are live as above.
    docs/design.md, `pack-deal`."""
    workers = policy.workers_used(problem, num_workers)
    programs: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
    heads = problem.heads_q
    for j, (b, u) in enumerate(bu for bu in pack_units(policy, problem) for _ in range(heads)):
        programs[snake_worker(j, workers)].append((b, j % heads, u))
    tilings = pack_tilings(problem)
    cursor = 0
    for b in pack_order(policy, tilings):
        if not policy.runs_together(tilings[b]):
            continue
        units = policy.units(tilings[b])
        for h in range(problem.heads_q):
            if cursor + units > workers:
                cursor = 0
            for u in range(units):
                programs[cursor + u].append((b, h, u))
            cursor += units
    return programs


def list_deal(policy: Policy, problem: Problem, num_workers: int) -> list[list[int]]:
    """Each worker's global units (g = sequence * units + unit, sequence = batch * heads_q +
    head), in rising g: list scheduling in launch order, unit g to the worker whose dealt tasks
    sum least (ties: the lowest worker), units without tasks left out. Counted in tasks, a
    unit then starts no sooner than any unit before it, on whichever worker: the deal that
    round-robin gives inside one sequence of rising units, kept across the boundaries between
    sequences (docs/design.md, `listed-deal`). Every wait of a launch-ordered policy is on a
    lower g and each worker runs its units in rising g, so the deal is live on any count."""
    tiling = Tiling(problem)
    workers = policy.workers_used(problem, num_workers)
    per_seq = policy.units(tiling)
    sizes = [policy.unit_tasks(tiling, u) for u in range(per_seq)]
    free = [(0, w) for w in range(workers)]  # (tasks dealt, worker): a heap
    deal: list[list[int]] = [[] for _ in range(workers)]
    for s in range(problem.batch * problem.heads_q):
        for u, size in enumerate(sizes):
            if size:
                load, w = heapq.heappop(free)
                deal[w].append(s * per_seq + u)
                heapq.heappush(free, (load + size, w))
    return deal


def deal_words(deal: list[list[int]]) -> list[int]:
    """A listed deal as the kernel reads it (BwdParams::unit_deal, sched::DealtWalk): the
    workers + 1 offsets into these words, then each worker's units."""
    offsets = [len(deal) + 1]
    for units in deal:
        offsets.append(offsets[-1] + len(units))
    return offsets + [g for units in deal for g in units]


def fewest_workers(units: int, num_workers: int) -> int:
    """The fewest workers that deal `units` in as many rounds as `num_workers` do."""
    if units <= 0:
        return num_workers
    return -(-units // -(-units // num_workers))


def shift_rank(units: int, rows: int, slot: int, step: int) -> int:
    """Arrival rank under a cyclic shift: `units` workers start together, unit a visiting row
    (a + t) mod rows at step t; the adds into a row are ranked by (step, unit). The rank of
    unit `slot` at its step `step`: the adds at steps before it, plus those of lower units at
    the same step (when units > rows two units meet on one row). O(1)."""
    per_row, extra = divmod(units, rows)  # units with a residue below `extra`: one more
    # Units that reach this row at steps 0..step-1 are those with residues slot+1 .. slot+step
    # (mod rows); each residue r has per_row units, plus one if r < extra.
    lo = (slot + 1) % rows
    if lo + step <= rows:
        below = max(0, min(lo + step, extra) - min(lo, extra))
    else:
        below = (extra - min(lo, extra)) + min(lo + step - rows, extra)
    return per_row * step + below + slot // rows


def assemble(policy: Policy, problem: Problem, num_workers: int) -> Schedule:
    """The IR of a policy on `num_workers` workers (the kernel's deal): the units of every
    (batch, head), in that order, unit g on worker g mod W; dkv_rank under GQA is the query
    head's place in its group (the heads of a group add their dK/dV in head order)."""
    if problem.is_pack:
        return _assemble_pack(policy, problem, num_workers)
    tiling = Tiling(problem)
    workers_used = policy.workers_used(problem, num_workers)
    per_seq = policy.units(tiling)
    sizes = [policy.unit_tasks(tiling, u) for u in range(per_seq)]
    steps = [[policy.step(tiling, u, i) for i in range(size)] for u, size in enumerate(sizes)]
    group = problem.group_size
    programs: list[list[Task]] = [[] for _ in range(workers_used)]

    def extend(program: list[Task], g: int) -> None:
        seq, u = divmod(g, per_seq)
        b, h = divmod(seq, problem.heads_q)
        dkv_rank = h % group if problem.gqa else None
        program.extend(Task(b, h, s.n_block, s.m_block, s.dq_rank, dkv_rank) for s in steps[u])
    if policy.listed:
        for program, units in zip(programs, list_deal(policy, problem, num_workers)):
            for g in units:
                extend(program, g)
    else:
        for g in range(problem.batch * problem.heads_q * per_seq):
            extend(programs[g % workers_used], g)
    return Schedule(name=policy.name, problem=problem, num_workers=workers_used,
                    workers=programs, depends_on_workers=False)


def _assemble_pack(policy: Policy, problem: Problem, num_workers: int) -> Schedule:
    """assemble for a pack: pack_deal's units, each sequence's steps from its own Tiling."""
    tilings = pack_tilings(problem)
    steps: dict[tuple[int, int], list[Step]] = {}
    group = problem.group_size
    programs: list[list[Task]] = []
    for units in pack_deal(policy, problem, num_workers):
        program: list[Task] = []
        for b, h, u in units:
            key = (b, u)
            if key not in steps:
                t = tilings[b]
                steps[key] = [policy.step(t, u, i) for i in range(policy.unit_tasks(t, u))]
            dkv_rank = h % group if problem.gqa else None
            program.extend(Task(b, h, s.n_block, s.m_block, s.dq_rank, dkv_rank)
                           for s in steps[key])
        programs.append(program)
    return Schedule(name=policy.name, problem=problem, num_workers=len(programs),
                    workers=programs, depends_on_workers=False)


def worker_loads(policy: Policy, problem: Problem, num_workers: int) -> list[int]:
    """Tasks per worker, from the unit sizes alone (no tasks built: a summary at 1M tokens)."""
    if problem.is_pack:
        tilings = pack_tilings(problem)
        return [sum(policy.unit_tasks(tilings[b], u) for b, _, u in units)
                for units in pack_deal(policy, problem, num_workers)]
    tiling = Tiling(problem)
    workers_used = policy.workers_used(problem, num_workers)
    sizes = [policy.unit_tasks(tiling, u) for u in range(policy.units(tiling))]
    if policy.listed:
        return [sum(sizes[g % len(sizes)] for g in units)
                for units in list_deal(policy, problem, num_workers)]
    loads = [0] * workers_used
    per_seq = len(sizes)
    seqs = problem.batch * problem.heads_q
    # Unit g = s * per_seq + u goes to worker g mod W.
    for u, size in enumerate(sizes):
        if not size:
            continue
        for s in range(seqs):
            loads[(s * per_seq + u) % workers_used] += size
    return loads
