"""verify(): every builder's output passes, and each kind of broken schedule is caught by name."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dashgen import Mask, Problem, Schedule, Task, UnsupportedProblem, VerificationError, VerificationReport, Violation, build_schedule, list_schedules
from dashgen import verify
from dashgen.schedule.builders import min_workers
from dashgen.schedule.verify import KINDS

FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# -- helpers ----------------------------------------------------------------------------------

@st.composite
def problems(draw, masks=("full", "causal", "window")):
    heads_kv = draw(st.integers(1, 3))
    seqlen_q = draw(st.integers(1, 700))
    seqlen_k = draw(st.one_of(st.just(seqlen_q), st.integers(1, 700)))
    kind = draw(st.sampled_from(masks))
    mask = {"full": Mask.full(), "causal": Mask.causal()}.get(kind) or Mask.window(
        draw(st.integers(0, 300)), draw(st.integers(0, 300)))
    return Problem(batch=draw(st.integers(1, 2)), heads_q=heads_kv * draw(st.integers(1, 3)),
                   heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k, mask=mask,
                   block_m=draw(st.sampled_from([64, 128])),
                   block_n=draw(st.sampled_from([64, 128, 192])))


@st.composite
def schedules(draw, names=None):
    """A valid schedule from some builder that serves the drawn problem."""
    name = draw(st.sampled_from(names or list_schedules()))
    masks = {"shift": ("full",), "symmetric_shift": ("causal",),
             "hybrid": ("full", "causal")}.get(name, ("full", "causal", "window"))
    problem = draw(problems(masks))
    try:
        # from the fewest workers the schedule runs on (a whole head for shift, symmetric_shift)
        return build_schedule(name, problem, min_workers(name, problem) + draw(st.integers(0, 131)))
    except UnsupportedProblem:
        assume(False)


def with_workers(schedule: Schedule, workers, num_workers: int | None = None) -> Schedule:
    return Schedule(schedule.name, schedule.problem,
                    schedule.num_workers if num_workers is None else num_workers,
                    [list(w) for w in workers], schedule.depends_on_workers)


def kinds_of(schedule: Schedule) -> set[str]:
    try:
        verify(schedule)
    except VerificationError as err:
        assert err.violations, "a VerificationError must carry its violations"
        assert {v.kind for v in err.violations} <= set(KINDS)
        return {v.kind for v in err.violations}
    return set()


def violations_of(schedule: Schedule) -> list[Violation]:
    with pytest.raises(VerificationError) as info:
        verify(schedule)
    return info.value.violations


def placed(schedule: Schedule) -> list[tuple[int, int, Task]]:
    return [(w, p, t) for w, tasks in enumerate(schedule.workers) for p, t in enumerate(tasks)]


def set_rank(schedule: Schedule, where: dict[tuple[int, int], int]) -> Schedule:
    """Copy with dq_rank of the task at (worker, position) replaced."""
    workers = [list(w) for w in schedule.workers]
    for (w, p), r in where.items():
        workers[w][p] = replace(workers[w][p], dq_rank=r)
    return with_workers(schedule, workers)


def task_at(schedule: Schedule, tile: tuple[int, int, int, int]) -> tuple[int, int]:
    return next((w, p) for w, p, t in placed(schedule) if t.tile == tile)


# -- every builder passes -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list_schedules())
@FAST
@given(data=st.data())
def test_every_builder_output_verifies(name, data):
    schedule = data.draw(schedules([name]))
    report = verify(schedule)
    assert isinstance(report, VerificationReport)
    kept = sum(len(schedule.problem.m_blocks_of(n)) for n in range(schedule.problem.num_n_blocks))
    assert report.num_tasks == schedule.num_tasks == kept * schedule.problem.batch * schedule.problem.heads_q
    assert report.num_workers == schedule.num_workers
    assert report.num_conflicts == len(report.conflicts) >= 0
    assert verify(schedule) == report  # deterministic


@FAST
@given(schedule=schedules(["shift"]))
def test_shift_has_no_conflicts(schedule):
    # Ranks are a head's arrival order, (step, unit), when its units start together; under a
    # full mask every unit is one KV tile of as many tasks, so every head's units start at one
    # depth on any worker count, and no rank edge steps from a deeper task to a shallower one.
    assert verify(schedule).num_conflicts == 0


@FAST
@given(problem=problems(("causal",)), extra=st.integers(0, 20))
def test_symmetric_shift_has_no_conflicts_on_one_sequence(problem, extra):
    # One sequence: each unit on a worker of its own, all from depth 0. (Later heads can start
    # at different depths where the units differ in size: an odd KV tile count leaves the
    # middle tile alone. Then a conflict costs waiting, never correctness.)
    one = replace(problem, batch=1, heads_q=1, heads_kv=1)
    schedule = build_schedule("symmetric_shift", one, min_workers("symmetric_shift", one) + extra)
    assert all(len(schedule.segments(w)) <= 2 for w in range(schedule.num_workers))
    assert verify(schedule).num_conflicts == 0


# -- mutations ------------------------------------------------------------------------------

@FAST
@given(schedule=schedules(), data=st.data())
def test_swapping_ranks_across_dq_tiles_is_dq_order(schedule, data):
    tasks = placed(schedule)
    i = data.draw(st.integers(0, len(tasks) - 1))
    wi, pi, ti = tasks[i]
    others = [(w, p, t) for w, p, t in tasks if t.dq_tile != ti.dq_tile and t.dq_rank != ti.dq_rank]
    assume(others)
    wj, pj, tj = data.draw(st.sampled_from(others))
    mutated = set_rank(schedule, {(wi, pi): tj.dq_rank, (wj, pj): ti.dq_rank})
    assert "dq-order" in kinds_of(mutated)


@FAST
@given(schedule=schedules(), data=st.data())
def test_swapping_ranks_within_a_dq_tile_is_still_a_total_order(schedule, data):
    tasks = placed(schedule)
    wi, pi, ti = data.draw(st.sampled_from(tasks))
    same = [(w, p, t) for w, p, t in tasks if t.dq_tile == ti.dq_tile and (w, p) != (wi, pi)]
    assume(same)
    wj, pj, tj = data.draw(st.sampled_from(same))
    mutated = set_rank(schedule, {(wi, pi): tj.dq_rank, (wj, pj): ti.dq_rank})
    assert kinds_of(mutated) <= {"liveness"}


def crossed_schedule() -> Schedule:
    """2 workers, full mask, 2x2 tiles; worker 0 runs n0: m0 m1, worker 1 runs n1: m1 m0."""
    problem = Problem(seqlen_q=256, block_m=128, block_n=128)
    workers = [[Task(0, 0, 0, 0, 0), Task(0, 0, 0, 1, 1)],
               [Task(0, 0, 1, 1, 0), Task(0, 0, 1, 0, 1)]]
    return Schedule("crossed", problem, 2, workers)


def test_crossed_schedule_in_arrival_order_is_valid():
    assert verify(crossed_schedule()).num_conflicts == 0


def test_one_swap_within_a_dq_tile_can_stay_live():
    # m0: n1 first. n1 m0 sits at depth 1, n0 m0 at depth 0: slower (a conflict), no cycle.
    s = crossed_schedule()
    report = verify(set_rank(s, {(0, 0): 1, (1, 1): 0}))
    assert report.num_conflicts == 1


def test_swaps_within_dq_tiles_can_deadlock():
    # m0 needs n1 first (last task of worker 1) and m1 needs n0 first (last task of worker 0):
    # w0p0 -> w0p1 -> (m1 rank) w1p0 -> w1p1 -> (m0 rank) w0p0.
    s = set_rank(crossed_schedule(), {(0, 0): 1, (1, 1): 0, (0, 1): 0, (1, 0): 1})
    violations = violations_of(s)
    assert [v.kind for v in violations] == ["liveness"]
    text = str(violations[0])
    for where in ("worker 0 position 0 tile b0 h0 n0 m0", "position 1 tile b0 h0 n0 m1",
                  "worker 1 position 0 tile b0 h0 n1 m1", "position 1 tile b0 h0 n1 m0"):
        assert where in text
    assert "cycle of 4 tasks" in text
    assert (violations[0].worker, violations[0].position) in {(0, 0), (1, 0)}


@FAST
@given(schedule=schedules(), data=st.data())
def test_splitting_a_segment_is_contiguity(schedule, data):
    spots = [(w, s) for w in range(schedule.num_workers)
             for s, seg in enumerate(schedule.segments(w)) if len(seg) >= 2]
    assume(spots)
    w, s = data.draw(st.sampled_from(spots))
    segs = schedule.segments(w)
    start = sum(len(seg) for seg in segs[:s])
    pos = start + data.draw(st.integers(0, len(segs[s]) - 1))
    targets = [x for x in range(schedule.num_workers) if x != w]
    if s + 1 < len(segs):
        targets.append(w)  # its own worker, after another segment
    assume(targets)
    target = data.draw(st.sampled_from(targets))
    workers = [list(t) for t in schedule.workers]
    workers[target].append(workers[w].pop(pos))
    assert "contiguity" in kinds_of(with_workers(schedule, workers))


@FAST
@given(schedule=schedules(), data=st.data())
def test_dropping_a_task_is_coverage_missing(schedule, data):
    w, p, t = data.draw(st.sampled_from(placed(schedule)))
    workers = [list(x) for x in schedule.workers]
    del workers[w][p]
    violations = violations_of(with_workers(schedule, workers))
    missing = [v for v in violations if v.kind == "coverage-missing"]
    assert [(v.worker, v.position, v.tile) for v in missing] == [(None, None, t.tile)]


@FAST
@given(schedule=schedules(), data=st.data())
def test_duplicating_a_task_is_coverage_duplicate(schedule, data):
    w, p, t = data.draw(st.sampled_from(placed(schedule)))
    target = data.draw(st.integers(0, schedule.num_workers - 1))
    workers = [list(x) for x in schedule.workers]
    workers[target].append(t)
    violations = violations_of(with_workers(schedule, workers))
    dup = [v for v in violations if v.kind == "coverage-duplicate"]
    # Whichever copy comes later in (worker, position) order is the extra one; it names the other.
    copy = (target, len(workers[target]) - 1)
    later, earlier = max((w, p), copy), min((w, p), copy)
    assert [(v.worker, v.position, v.tile) for v in dup] == [later + (t.tile,)]
    assert f"worker {earlier[0]} position {earlier[1]}" in dup[0].message


@FAST
@given(schedule=schedules(), data=st.data())
def test_a_tile_the_mask_drops_is_coverage_extra(schedule, data):
    problem = schedule.problem
    dropped = [(n, m) for n in range(problem.num_n_blocks) for m in range(problem.num_m_blocks)
               if not problem.tile_kept(n, m)]
    assume(dropped)
    n, m = data.draw(st.sampled_from(dropped))
    extra = Task(0, 0, n, m, 0, 0 if problem.gqa else None)
    workers = [list(x) for x in schedule.workers]
    workers[0].append(extra)
    extras = [v for v in violations_of(with_workers(schedule, workers)) if v.kind == "coverage-extra"]
    assert [(v.worker, v.position, v.tile) for v in extras] == [(0, len(workers[0]) - 1, extra.tile)]
    assert "mask drops" in extras[0].message


def test_causal_lower_tile_and_out_of_range_tiles_are_coverage_extra():
    s = build_schedule("fa3", Problem(seqlen_q=512, mask="causal"), 4)
    workers = [list(x) for x in s.workers]
    workers[3] += [Task(0, 0, 1, 0, 0), Task(0, 1, 0, 0, 0), Task(0, 0, 0, 4, 0), Task(-1, 0, 0, 0, 0)]
    extras = [v for v in violations_of(with_workers(s, workers)) if v.kind == "coverage-extra"]
    assert [(v.worker, v.position) for v in extras] == [(3, 1), (3, 2), (3, 3), (3, 4)]
    assert "causal mask drops this tile" in extras[0].message
    assert "head 1 is outside 0..0" in extras[1].message
    assert "m_block 4 is outside 0..3" in extras[2].message
    assert "batch -1 is outside 0..0" in extras[3].message


@FAST
@given(schedule=schedules(), data=st.data())
def test_equal_dkv_ranks_under_gqa_are_dkv_order(schedule, data):
    problem = schedule.problem
    assume(problem.gqa)
    groups = defaultdict(list)  # dKV tile -> [(worker, first position, length, dkv_rank)]
    for w in range(schedule.num_workers):
        pos = 0
        for seg in schedule.segments(w):
            t = seg[0]
            groups[(t.batch, problem.kv_head(t.head), t.n_block)].append((w, pos, len(seg), t.dkv_rank))
            pos += len(seg)
    shared = [segs for segs in groups.values() if len(segs) >= 2]
    assume(shared)
    segs = data.draw(st.sampled_from(shared))
    a, b = data.draw(st.lists(st.sampled_from(segs), min_size=2, max_size=2, unique=True))
    workers = [list(x) for x in schedule.workers]
    for p in range(b[1], b[1] + b[2]):
        workers[b[0]][p] = replace(workers[b[0]][p], dkv_rank=a[3])
    assert "dkv-order" in kinds_of(with_workers(schedule, workers))


def test_dkv_rank_must_match_gqa():
    gqa = build_schedule("fa3", Problem(heads_q=4, heads_kv=2, seqlen_q=256), 4)
    assert verify(gqa)
    workers = [list(x) for x in gqa.workers]
    workers[0][0] = replace(workers[0][0], dkv_rank=None)     # missing
    workers[1][0] = replace(workers[1][0], dkv_rank=workers[1][0].dkv_rank + 1)  # not uniform
    found = violations_of(with_workers(gqa, workers))
    assert {v.kind for v in found} == {"dkv-order"}
    assert {(v.worker, v.position) for v in found} >= {(0, 0), (1, 0)}
    plain = build_schedule("fa3", Problem(heads_q=2, seqlen_q=256), 2)
    workers = [list(x) for x in plain.workers]
    workers[1][1] = replace(workers[1][1], dkv_rank=0)
    found = violations_of(with_workers(plain, workers))
    assert [(v.kind, v.worker, v.position) for v in found] == [("dkv-order", 1, 1)]
    assert "must be None without GQA" in found[0].message


@FAST
@given(schedule=schedules())
def test_wrong_worker_count_is_workers(schedule):
    assert kinds_of(with_workers(schedule, schedule.workers + [[]])) == {"workers"}
    assert kinds_of(with_workers(schedule, schedule.workers, schedule.num_workers + 1)) == {"workers"}


def test_zero_workers_is_workers():
    s = build_schedule("fa3", Problem(seqlen_q=128), 1)
    assert kinds_of(with_workers(s, [], 0)) == {"workers", "coverage-missing"}


# -- messages ---------------------------------------------------------------------------------

def test_dq_order_messages_name_worker_position_and_tile():
    s = build_schedule("fa3", Problem(seqlen_q=512), 4)
    # n1 m2 takes rank 0 of dQ tile m2 (held by n0 m2): a duplicate 0 and a gap at 1.
    found = violations_of(set_rank(s, {(1, 2): 0}))
    lines = [str(v) for v in found]
    assert ("dq-order: worker 1 position 2 tile b0 h0 n1 m2: dq_rank 0 of dQ tile b0 h0 m2 is also "
            "held by worker 0 position 2 tile b0 h0 n0 m2") in lines
    assert "dq-order: tile b0 h0 m2: dQ tile b0 h0 m2 has no contribution with dq_rank 1" in lines
    found = violations_of(set_rank(s, {(3, 0): 7}))
    assert [str(v) for v in found] == [
        "dq-order: worker 3 position 0 tile b0 h0 n3 m0: dq_rank 7 is outside 0..3 "
        "(dQ tile b0 h0 m0 has 4 contributions)",
        "dq-order: tile b0 h0 m0: dQ tile b0 h0 m0 has no contribution with dq_rank 3"]


def test_error_lists_every_violation():
    s = build_schedule("fa3", Problem(seqlen_q=512), 4)
    workers = [list(x) for x in s.workers]
    del workers[2][3]                       # n2 m3 missing (and a gap in dQ tile m3)
    workers.append([])                      # five programs for four workers
    with pytest.raises(VerificationError) as info:
        verify(with_workers(s, workers))
    err = info.value
    text = str(err)
    assert {v.kind for v in err.violations} == {"workers", "coverage-missing", "dq-order"}
    assert text.splitlines()[0] == f"schedule 'fa3': {len(err.violations)} violations"
    assert len(text.splitlines()) == 1 + len(err.violations)
    for v in err.violations:
        assert str(v) in text
    assert "workers: num_workers is 4 but the schedule has 5 worker programs" in text
    assert "coverage-missing: tile b0 h0 n2 m3:" in text
    assert isinstance(err, ValueError)


def test_every_duplicate_occurrence_is_reported():
    s = build_schedule("fa3", Problem(seqlen_q=256), 2)
    workers = [list(x) for x in s.workers]
    workers[0] += [workers[0][0], workers[0][0]]
    dup = [v for v in violations_of(with_workers(s, workers)) if v.kind == "coverage-duplicate"]
    assert [(v.worker, v.position) for v in dup] == [(0, 2), (0, 3)]


# -- conflicts (DASH Lemma 1) ------------------------------------------------------------------

def test_fa3_full_mask_one_kv_tile_per_worker_has_no_conflicts():
    # Worker n runs KV tile n over m0..m7: every task of dQ tile m sits at depth m, so each rank
    # edge n -> n+1 joins equal depths.
    assert verify(build_schedule("fa3", Problem(seqlen_q=1024), 8)).num_conflicts == 0


@pytest.mark.parametrize("n", [2, 4, 5, 8])
def test_fa3_causal_conflicts_are_counted(n):
    # Worker j runs KV tile j over m_j..m_{n-1}, so task (j, i) sits at depth i - j. dQ tile i
    # adds n0, n1, .., n_i: every edge (j, i) -> (j+1, i) goes from depth i-j to i-j-1, a conflict.
    # Tile i has i edges: sum over i of i = n(n-1)/2.
    report = verify(build_schedule("fa3", Problem(seqlen_q=128 * n, mask="causal"), n))
    assert report.num_conflicts == n * (n - 1) // 2
    assert all(c.position_u == c.position_v + 1 for c in report.conflicts)
    # spt and descending remove them (the point of both): equal depths along every edge.
    for name in ("spt", "descending"):
        assert verify(build_schedule(name, Problem(seqlen_q=128 * n, mask="causal"), n)).num_conflicts == 0


# -- scale --------------------------------------------------------------------------------------

def big_fa3() -> Schedule:
    return build_schedule("fa3", Problem(heads_q=16, seqlen_q=4096, block_m=128, block_n=128), 132)


def test_large_schedule_verifies():
    report = verify(big_fa3())
    assert report.num_tasks == 16 * 32 * 32
    assert report.num_conflicts == 0


def test_large_schedule_deadlock_is_found_and_conflicts_are_exact():
    s = big_fa3()
    assert s.workers[0][0].tile == (0, 0, 0, 0) and s.workers[1][0].tile == (0, 0, 1, 0)
    workers = [list(x) for x in s.workers]
    workers[1][:32] = workers[1][:32][::-1]   # worker 1 visits n1: m31 .. m0
    reversed_only = with_workers(s, workers)
    # dQ tile m_i: n0 at depth i, n1 at depth 31-i, n2 at depth i. n0 -> n1 is a conflict for
    # i >= 16, n1 -> n2 for i <= 15: 32 conflicts, all other edges join equal depths.
    assert verify(reversed_only).num_conflicts == 32
    # Now m0 wants n1 (last of worker 1's segment) before n0 (first of worker 0's), while every
    # other m_i still wants n0 before n1 (first of worker 1's): every cycle takes the m0 edge, so
    # exactly one is reported.
    dead = set_rank(reversed_only, {(0, 0): 1, (1, 31): 0})
    found = violations_of(dead)
    assert [v.kind for v in found] == ["liveness"]
    assert "position 31 tile b0 h0 n1 m0 -> worker 0 position 0 tile b0 h0 n0 m0" in found[0].message


def test_ring_deadlock_across_all_workers():
    # shift with 50 KV tiles, 50 Q tiles, 50 workers: worker j visits m_j, m_j+1, ..; dQ tile
    # m_i gets worker i (depth 0) first, then worker i-1 (depth 1). Swapping those two ranks in
    # every tile makes each worker's first task wait on its left neighbour's second: one ring of
    # 100 tasks in 50 program-order runs, the message names the first 40.
    s = build_schedule("shift", Problem(seqlen_q=3200, block_m=64, block_n=64), 50)
    assert verify(s).num_conflicts == 0
    assert all(s.workers[j][0].m_block == j and s.workers[j][0].dq_rank == 0 for j in range(50))
    swaps = {}
    for i in range(50):
        swaps[(i, 0)] = 1
        swaps[((i - 1) % 50, 1)] = 0
    found = violations_of(set_rank(s, swaps))
    assert [v.kind for v in found] == ["liveness"]
    assert "cycle of 100 tasks" in found[0].message
    assert "(10 more runs)" in found[0].message
    assert found[0].message.count("worker ") == 40
