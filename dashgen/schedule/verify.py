"""Prove a schedule's invariants (coverage, contiguity, total rank order, liveness) and count
the rank edges that break DASH Lemma 1 (conflicts). Every violation is collected, not just the first.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Schedule, Task

KINDS = ("workers", "coverage-extra", "coverage-duplicate", "coverage-missing", "contiguity",
         "dq-order", "dkv-order", "liveness")
# A deadlock cycle can run through thousands of tasks; name the hops where it changes worker
# (each program-order run once) and stop after this many runs so the message stays readable.
_MAX_CYCLE_RUNS = 40


def _tile_label(tile: tuple) -> str:
    # Tiles are (batch, head, n_block, m_block); None marks a part that does not apply (a dQ tile
    # has no n_block), so one format serves tasks, KV tiles and dQ tiles.
    return " ".join(f"{p}{v}" for p, v in zip("bhnm", tile) if v is not None)


def _where(worker: int, position: int, task: Task) -> str:
    return f"worker {worker} position {position} tile {task.label()}"


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    worker: int | None = None
    position: int | None = None
    tile: tuple | None = None

    def __str__(self) -> str:
        parts = []
        if self.worker is not None:
            parts.append(f"worker {self.worker}")
        if self.position is not None:
            parts.append(f"position {self.position}")
        if self.tile is not None:
            parts.append(f"tile {_tile_label(self.tile)}")
        where = " ".join(parts)
        return f"{self.kind}: {where}: {self.message}" if where else f"{self.kind}: {self.message}"


class VerificationError(ValueError):
    """A schedule broke one or more invariants; ``violations`` holds all of them."""

    def __init__(self, violations: list[Violation], name: str = "schedule"):
        self.violations = list(violations)
        count = len(self.violations)
        head = f"{name}: {count} violation{'s' if count != 1 else ''}"
        super().__init__("\n".join([head] + [f"  {v}" for v in self.violations]))


@dataclass(frozen=True)
class Conflict:
    """A rank edge u -> v of one dQ tile where u sits deeper in its worker program than v."""

    worker_u: int
    position_u: int
    worker_v: int
    position_v: int
    dq_tile: tuple[int, int, int]


@dataclass(frozen=True)
class VerificationReport:
    num_tasks: int
    num_workers: int
    conflicts: tuple[Conflict, ...] = ()

    @property
    def num_conflicts(self) -> int:
        return len(self.conflicts)


def _in_range(value: object, bound: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < bound


def verify(schedule: Schedule) -> VerificationReport:
    """Check every invariant; raise VerificationError listing all violations, else report."""
    problem = schedule.problem
    out: list[Violation] = []
    if schedule.num_workers < 1 or len(schedule.workers) != schedule.num_workers:
        out.append(Violation("workers", f"num_workers is {schedule.num_workers} but the schedule "
                                        f"has {len(schedule.workers)} worker programs"))

    # Flat node numbering for the whole schedule: node i is tasks[i] at (worker_of[i], pos_of[i]).
    tasks: list[Task] = []
    worker_of: list[int] = []
    pos_of: list[int] = []
    for w, program in enumerate(schedule.workers):
        tasks.extend(program)
        worker_of.extend([w] * len(program))
        pos_of.extend(range(len(program)))
    num = len(tasks)

    # -- coverage ------------------------------------------------------------------------------
    # The kept (n_block, m_block) pairs of each sequence: one set for all outside a pack.
    seq_ids = range(problem.batch) if problem.is_pack else (None,)
    kept_m = {b: {n: problem.m_blocks_of(n, b) for n in range(problem.num_n_blocks_of(b))}
              for b in seq_ids}
    kept_nm = {b: {(n, m) for n, ms in per.items() for m in ms} for b, per in kept_m.items()}
    # Sequence b's kept pairs at kept_of[b] (outside a pack one set, shared).
    kept_of = ([kept_nm[b] for b in range(problem.batch)] if problem.is_pack
               else [kept_nm[None]] * problem.batch)
    bounds = (("batch", problem.batch), ("head", problem.heads_q),
              ("n_block", problem.num_n_blocks), ("m_block", problem.num_m_blocks))
    seen: dict[tuple, int] = {}
    extra = False
    for i, t in enumerate(tasks):
        tile = b, h, n, m = t.tile
        # The common case first, in one test (exact ints, in range, kept); the field-by-field
        # report only for a task that fails it.
        if not (type(b) is int and type(h) is int and type(n) is int and type(m) is int
                and 0 <= b < problem.batch and 0 <= h < problem.heads_q
                and (n, m) in kept_of[b]):
            bad = [f"{name} {value} is outside 0..{bound - 1}"
                   for (name, bound), value in zip(bounds, tile) if not _in_range(value, bound)]
            if not bad and (n, m) not in kept_of[b]:
                bad.append(f"the {problem.mask} mask drops this tile"
                           + (f" of sequence {b} ({problem.lengths(b)[0]} queries, "
                              f"{problem.lengths(b)[1]} keys)" if problem.is_pack else ""))
            if bad:
                extra = True
                out.append(Violation("coverage-extra", "; ".join(bad), worker_of[i], pos_of[i],
                                     tile))
        first = seen.setdefault(tile, i)
        if first != i:
            out.append(Violation("coverage-duplicate", f"tile already at worker {worker_of[first]} "
                                 f"position {pos_of[first]}", worker_of[i], pos_of[i], tile))
    # Every tile seen is a distinct kept one unless reported above: then as many as the mask
    # keeps means none is missing, and the search below can be skipped.
    kept_total = problem.heads_q * (sum(map(len, kept_nm.values())) if problem.is_pack
                                    else problem.batch * len(kept_nm[None]))
    if extra or len(seen) != kept_total:
        for b in range(problem.batch):
            for h in range(problem.heads_q):
                for n, ms in kept_m[b if problem.is_pack else None].items():
                    for m in ms:
                        if (b, h, n, m) not in seen:
                            out.append(Violation("coverage-missing", "the mask keeps this tile "
                                                 "but no worker computes it", tile=(b, h, n, m)))

    # -- contiguity: segments are maximal runs of one KV tile on one worker ---------------------
    seg_of = [0] * num          # segment index of each node
    seg_nodes: list[list[int]] = []
    for i, t in enumerate(tasks):
        if i and worker_of[i - 1] == worker_of[i] and tasks[i - 1].kv_tile == t.kv_tile:
            seg_nodes[-1].append(i)
        else:
            seg_nodes.append([i])
        seg_of[i] = len(seg_nodes) - 1
    runs: dict[tuple, list[int]] = {}
    for s, nodes in enumerate(seg_nodes):
        runs.setdefault(tasks[nodes[0]].kv_tile, []).append(s)
    for kv, segs in runs.items():
        if len(segs) > 1:
            places = ", ".join(f"worker {worker_of[seg_nodes[s][0]]} position "
                               f"{pos_of[seg_nodes[s][0]]}" for s in segs)
            for s in segs[1:]:
                i = seg_nodes[s][0]
                out.append(Violation("contiguity", f"KV tile {_tile_label(kv + (None,))} is split "
                                     f"into {len(segs)} runs (at {places})",
                                     worker_of[i], pos_of[i], tasks[i].tile))

    # -- total orders: nxt/prv hold rank edges (-1 = none); rank edges only for valid tiles ----
    dq_next = [-1] * num
    dq_prev = [-1] * num
    dq_groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        dq_groups.setdefault(t.dq_tile, []).append(i)
    valid_dq: list[list[int]] = []
    for dq, nodes in dq_groups.items():
        chain = _check_order(nodes, [tasks[i].dq_rank for i in nodes], "dq", dq[:2] + (None, dq[2]),
                             tasks, worker_of, pos_of, out)
        if chain is not None:
            valid_dq.append(chain)
            for u, v in zip(chain, chain[1:]):
                dq_next[u], dq_prev[v] = v, u

    dkv_next = [-1] * num
    dkv_prev = [-1] * num
    if problem.gqa:
        dkv_groups: dict[tuple, list[int]] = {}
        seg_rank: dict[int, int] = {}  # segment -> its dkv_rank, where uniform
        broken: set[tuple] = set()
        for s, nodes in enumerate(seg_nodes):
            t = tasks[nodes[-1]]
            key = (t.batch, problem.kv_head(t.head), t.n_block)
            dkv_groups.setdefault(key, []).append(s)
            ranks = {tasks[i].dkv_rank for i in nodes}
            if None in ranks or len(ranks) > 1:
                i = nodes[0]
                what = "is missing" if None in ranks else f"differs within the segment {sorted(ranks)}"
                out.append(Violation("dkv-order", f"dkv_rank {what} (GQA needs one dkv_rank per "
                                     "segment)", worker_of[i], pos_of[i], tasks[i].tile))
                broken.add(key)
            else:
                seg_rank[s] = t.dkv_rank
        for key, segs in dkv_groups.items():
            if key in broken:
                continue
            last = [seg_nodes[s][-1] for s in segs]  # the last task of a segment signals dK/dV
            chain = _check_order(last, [seg_rank[s] for s in segs], "dkv",
                                 (key[0], None, key[2], None), tasks, worker_of, pos_of, out,
                                 f"dKV tile b{key[0]} kv-head {key[1]} n{key[2]}")
            if chain is not None:
                for u, v in zip(chain, chain[1:]):
                    dkv_next[u], dkv_prev[v] = v, u
    else:
        for i, t in enumerate(tasks):
            if t.dkv_rank is not None:
                out.append(Violation("dkv-order", f"dkv_rank must be None without GQA, got "
                                     f"{t.dkv_rank}", worker_of[i], pos_of[i], t.tile))

    out.extend(_liveness(tasks, worker_of, pos_of, dq_next, dq_prev, dkv_next, dkv_prev))
    if out:
        raise VerificationError(out, f"schedule {schedule.name!r}")

    conflicts = [Conflict(worker_of[u], pos_of[u], worker_of[v], pos_of[v], tasks[u].dq_tile)
                 for chain in valid_dq for u, v in zip(chain, chain[1:]) if pos_of[u] > pos_of[v]]
    return VerificationReport(num, schedule.num_workers, tuple(conflicts))


def _check_order(nodes: list[int], ranks: list, which: str, tile: tuple, tasks: list[Task],
                 worker_of: list[int], pos_of: list[int], out: list[Violation],
                 name: str | None = None) -> list[int] | None:
    """Nodes sorted by rank if ``ranks`` is exactly 0..k-1, else None after reporting why."""
    k = len(nodes)
    name = name or f"dQ tile {_tile_label(tile)}"
    kind = f"{which}-order"
    by_rank: list[int | None] = [None] * k
    ok = True
    for i, r in zip(nodes, ranks):
        if not _in_range(r, k):
            out.append(Violation(kind, f"{which}_rank {r} is outside 0..{k - 1} ({name} has {k} "
                                 f"contributions)", worker_of[i], pos_of[i], tasks[i].tile))
            ok = False
        elif by_rank[r] is not None:
            j = by_rank[r]
            out.append(Violation(kind, f"{which}_rank {r} of {name} is also held by "
                                 f"{_where(worker_of[j], pos_of[j], tasks[j])}",
                                 worker_of[i], pos_of[i], tasks[i].tile))
            ok = False
        else:
            by_rank[r] = i
    if ok:
        return by_rank  # type: ignore[return-value]  # every slot filled: k distinct in-range ranks
    gaps = [r for r, i in enumerate(by_rank) if i is None]
    if gaps:
        out.append(Violation(kind, f"{name} has no contribution with {which}_rank "
                             f"{', '.join(map(str, gaps))}", tile=tile))
    return None


def _liveness(tasks: list[Task], worker_of: list[int], pos_of: list[int], dq_next: list[int],
              dq_prev: list[int], dkv_next: list[int], dkv_prev: list[int]) -> list[Violation]:
    """Kahn's sort of program order + rank edges; one violation per disjoint cycle left over."""
    num = len(tasks)
    # Program order: node i -> i + 1 when both sit on the same worker.
    same = [i + 1 < num and worker_of[i + 1] == worker_of[i] for i in range(num)]
    indeg = [0] * num
    for i in range(num):
        indeg[i] = ((i > 0 and same[i - 1]) + (dq_prev[i] >= 0) + (dkv_prev[i] >= 0))
    stack = [i for i in range(num) if indeg[i] == 0]
    done = 0
    while stack:
        u = stack.pop()
        done += 1
        for v in (u + 1 if same[u] else -1, dq_next[u], dkv_next[u]):
            if v >= 0:
                indeg[v] -= 1
                if indeg[v] == 0:
                    stack.append(v)
    if done == num:
        return []

    # Every node left has a predecessor that is also left: walking predecessors must close a
    # cycle. Nodes touched by an earlier walk end a walk, so each cycle is reported once.
    def preds(x: int):
        return (dq_prev[x], dkv_prev[x], x - 1 if x > 0 and same[x - 1] else -1)

    used = [False] * num
    found: list[Violation] = []
    for start in range(num):
        if indeg[start] == 0 or used[start]:
            continue
        path: list[int] = []
        index: dict[int, int] = {}
        x = start
        while not used[x]:
            used[x] = True
            index[x] = len(path)
            path.append(x)
            x = next(p for p in preds(x) if p >= 0 and indeg[p] > 0)
        if x not in index:
            continue  # reached a cycle already reported
        cycle = path[index[x]:][::-1]  # the walk went backwards; forward, cycle[-1] -> cycle[0]
        found.append(_cycle_violation(cycle, tasks, worker_of, pos_of))
    return found


def _cycle_violation(cycle: list[int], tasks: list[Task], worker_of: list[int],
                     pos_of: list[int]) -> Violation:
    # Rotate so the cycle starts where it enters a worker, then group program-order runs.
    k = len(cycle)
    start = next((j for j in range(k) if worker_of[cycle[j - 1]] != worker_of[cycle[j]]
                  or pos_of[cycle[j - 1]] + 1 != pos_of[cycle[j]]), 0)
    cycle = cycle[start:] + cycle[:start]
    runs: list[list[int]] = []
    for x in cycle:
        if runs and worker_of[runs[-1][-1]] == worker_of[x] and pos_of[runs[-1][-1]] + 1 == pos_of[x]:
            runs[-1].append(x)
        else:
            runs.append([x])
    parts = []
    for run in runs[:_MAX_CYCLE_RUNS]:
        a, b = run[0], run[-1]
        text = _where(worker_of[a], pos_of[a], tasks[a])
        if b != a:
            text += f" .. position {pos_of[b]} tile {tasks[b].label()}"
        parts.append(text)
    more = f" -> ... ({len(runs) - _MAX_CYCLE_RUNS} more runs)" if len(runs) > _MAX_CYCLE_RUNS else ""
    first = cycle[0]
    return Violation("liveness", f"deadlock: a cycle of {k} tasks (a -> b: b waits for a): "
                     f"{' -> '.join(parts)}{more} -> back to the first",
                     worker_of[first], pos_of[first], tasks[first].tile)
