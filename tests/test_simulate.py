"""The simulator against the DASH paper's closed forms, a brute-force longest path, and broken
schedules; plus the Gantt renderings."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dashgen.schedule.ir import Schedule, Task
from dashgen.schedule.problem import Mask, Problem
from dashgen.schedule.builders import (UnsupportedProblem, build_schedule, list_schedules,
                                       min_workers)
from dashgen.schedule.simulate import Cost, SimulationDeadlock, simulate

COSTS = [(1.0, 0.25), (3.0, 1.0), (1.0, 0.2)]
BLOCK = 128


def full(n: int, heads: int) -> Problem:
    return Problem(heads_q=heads, seqlen_q=n * BLOCK, block_m=BLOCK, block_n=BLOCK)


def causal(n: int, heads: int) -> Problem:
    return Problem(heads_q=heads, seqlen_q=n * BLOCK, mask="causal", block_m=BLOCK, block_n=BLOCK)


def makespan(name: str, problem: Problem, workers: int, cost: Cost) -> float:
    return simulate(build_schedule(name, problem, workers), cost).makespan


# -- closed forms (signal_latency 0, constant c and r, n KV tiles == W workers) ---------------

@pytest.mark.parametrize("c,r", COSTS)
@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("m", range(1, 5))
def test_full_mask_closed_forms(c, r, n, m):
    cost = Cost(c, r)
    assert makespan("fa3", full(n, m), n, cost) == pytest.approx(m * n * (c + r) + (n - 1) * r)
    assert makespan("shift", full(n, m), n, cost) == pytest.approx(m * n * (c + r))


@pytest.mark.parametrize("c,r", COSTS)
@pytest.mark.parametrize("n", [2, 4, 6, 8])
@pytest.mark.parametrize("m", [2, 4])
def test_causal_symmetric_shift_closed_form(c, r, n, m):
    got = makespan("symmetric_shift", causal(n, m), n, Cost(c, r))
    assert got == pytest.approx(m * (n + 1) * (c + r) / 2)


@pytest.mark.parametrize("c,r", [(1.0, 0.25), (3.0, 1.0)])
def test_where_the_formulas_break_n2_one_head(c, r):
    # One head cannot share its wave with another, so the folding has nothing to fold against.
    problem, cost = causal(2, 1), Cost(c, r)
    desc = makespan("descending", problem, 2, cost)
    sym = makespan("symmetric_shift", problem, 2, cost)
    assert desc == pytest.approx(2 * (c + r))
    assert sym == pytest.approx(3 * (c + r))
    assert desc != pytest.approx(1.5 * (c + r) + (2 - 1) * r)
    assert sym != pytest.approx(1.5 * (c + r))


# -- a brute-force reference: relax the DAG until nothing changes ------------------------------

def reference_makespan(schedule: Schedule, cost: Cost) -> float:
    """Fixed point of the longest-path equations, swept naively (no event queue, no waiters)."""
    p = schedule.problem
    dq_holder = {(t.dq_tile, t.dq_rank): (w, i) for w, ts in enumerate(schedule.workers)
                 for i, t in enumerate(ts)}
    kv_holder = {}
    seg_last = set()
    for w, ts in enumerate(schedule.workers):
        for i, t in enumerate(ts):
            if p.gqa and (i + 1 == len(ts) or ts[i + 1].kv_tile != t.kv_tile):
                kv_holder[((t.batch, p.kv_head(t.head), t.n_block), t.dkv_rank)] = (w, i)
                seg_last.add((w, i))
    red_end, done = {}, {}  # (w, i) -> end of the dQ add / end of everything the task does
    for _ in range(schedule.num_tasks + 2):
        changed = False
        for w, ts in enumerate(schedule.workers):
            prev = 0.0
            for i, t in enumerate(ts):
                ce = prev + cost.compute(t, p)
                rs = ce
                if t.dq_rank:
                    src = dq_holder[(t.dq_tile, t.dq_rank - 1)]
                    rs = max(rs, red_end.get(src, float("inf"))
                             + (cost.signal_latency if src[0] != w else 0.0))
                re = rs + cost.reduce(t, p)
                end = re
                if (w, i) in seg_last:
                    if t.dkv_rank:
                        kv = (t.batch, p.kv_head(t.head), t.n_block)
                        src = kv_holder[(kv, t.dkv_rank - 1)]
                        end = max(end, done.get(src, float("inf"))
                                  + (cost.signal_latency if src[0] != w else 0.0))
                    end += cost.dkv_reduce(t, p)
                if red_end.get((w, i)) != re or done.get((w, i)) != end:
                    red_end[(w, i)], done[(w, i)], changed = re, end, True
                prev = end
        if not changed:
            break
    return max(done.values(), default=0.0)


masks = st.sampled_from([Mask.full(), Mask.causal(), Mask.window(100, 0), Mask.window(64, 200)])


@st.composite
def problems(draw):
    heads_kv = draw(st.integers(1, 2))
    block_m = draw(st.sampled_from([64, 128]))
    block_n = draw(st.sampled_from([64, 128]))
    seqlen_q = draw(st.integers(1, 6 * block_m))
    same = draw(st.booleans())
    return Problem(batch=draw(st.integers(1, 2)), heads_q=heads_kv * draw(st.integers(1, 3)),
                   heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_q if same else draw(st.integers(1, 6 * block_n)),
                   mask=draw(masks), block_m=block_m, block_n=block_n)


costs = st.builds(
    lambda masked, c, r, lat, dkv: (Cost.masked(c, r, lat, dkv) if masked else Cost(c, r, lat, dkv)),
    st.booleans(), st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([0.0, 0.2, 1.0]),
    st.sampled_from([0.0, 0.05, 0.5]), st.sampled_from([None, 0.0, 0.7]))


def build_or_skip(name, problem, workers):
    """The schedule on `workers` workers, or on its minimum where that is more (a whole head)."""
    try:
        return build_schedule(name, problem, max(workers, min_workers(name, problem)))
    except UnsupportedProblem:
        assume(False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(list_schedules()), problem=problems(), workers=st.integers(1, 132),
       cost=costs)
def test_every_builder_respects_the_lower_bound(name, problem, workers, cost):
    schedule = build_or_skip(name, problem, workers)
    workers = schedule.num_workers  # what the schedule runs on (workers_used)
    res = simulate(schedule, cost)
    work = sum(cost.compute(t, problem) + cost.reduce(t, problem)
               for ts in schedule.workers for t in ts)
    work += sum(cost.dkv_reduce(seg[-1], problem)
                for w in range(workers) for seg in schedule.segments(w))
    assert res.lower_bound == pytest.approx(work / workers, rel=1e-12, abs=1e-12)
    assert res.makespan >= res.lower_bound * (1 - 1e-12)
    assert res.makespan == pytest.approx(reference_makespan(schedule, cost), rel=1e-12, abs=1e-12)
    assert len(res.busy) == len(res.idle) == len(res.wait) == workers
    for b, i, wt in zip(res.busy, res.idle, res.wait):
        assert b + i == pytest.approx(res.makespan, rel=1e-12, abs=1e-12)
        assert -1e-9 <= wt <= i + 1e-9
    assert len(res.events) == schedule.num_tasks
    keys = [(e.compute_start, e.worker) for e in res.events]
    assert keys == sorted(keys)
    last_end = {}
    for e in sorted(res.events, key=lambda e: (e.worker, e.position)):
        assert e.task == schedule.workers[e.worker][e.position]
        assert e.compute_start >= last_end.get(e.worker, 0.0) - 1e-9
        assert e.compute_start <= e.compute_end <= e.reduce_start <= e.reduce_end
        last_end[e.worker] = e.dkv_end if e.dkv_end is not None else e.reduce_end
    # dQ adds of one tile happen in rank order and never overlap.
    by_tile = {}
    for e in res.events:
        by_tile.setdefault(e.task.dq_tile, []).append(e)
    for evs in by_tile.values():
        evs.sort(key=lambda e: e.task.dq_rank)
        for a, b in zip(evs, evs[1:]):
            assert b.reduce_start >= a.reduce_end - 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(list_schedules()), problem=problems(), workers=st.integers(1, 24),
       cost=costs, seed=st.randoms(use_true_random=False))
def test_result_does_not_depend_on_worker_numbering(name, problem, workers, cost, seed):
    # Renaming workers changes the order the simulator visits them in, never the times.
    schedule = build_or_skip(name, problem, workers)
    workers = schedule.num_workers  # what the schedule runs on (workers_used)
    perm = list(range(workers))
    seed.shuffle(perm)
    shuffled = Schedule(schedule.name, problem, workers, [schedule.workers[i] for i in perm])
    a, b = simulate(schedule, cost), simulate(shuffled, cost)
    assert a.makespan == b.makespan
    assert [a.busy[i] for i in perm] == b.busy
    times = lambda res: {e.task: (e.compute_start, e.reduce_start, e.reduce_end, e.dkv_end)
                         for e in res.events}
    assert times(a) == times(b)


# -- broken schedules --------------------------------------------------------------------------

def hand_built(workers: list[list[Task]], problem: Problem | None = None) -> Schedule:
    problem = problem or full(2, 1)
    return Schedule("hand", problem, len(workers), workers)


def test_rank_cycle_deadlocks_and_names_the_workers():
    sched = hand_built([
        [Task(0, 0, 0, 0, 1), Task(0, 0, 0, 1, 0)],   # waits for worker 1's m0 add first
        [Task(0, 0, 1, 1, 1), Task(0, 0, 1, 0, 0)],   # waits for worker 0's m1 add first
    ])
    with pytest.raises(SimulationDeadlock) as info:
        simulate(sched)
    msg = str(info.value)
    assert "worker 0 position 0" in msg and "worker 1 position 0" in msg
    assert "counter == 1, counter is 0" in msg


def test_rank_gap_deadlocks():
    sched = hand_built([[Task(0, 0, 0, 0, 0), Task(0, 0, 0, 1, 0)],
                        [Task(0, 0, 1, 0, 2), Task(0, 0, 1, 1, 1)]])
    with pytest.raises(SimulationDeadlock, match=r"worker 1 position 0 .*counter == 2, counter is 1"):
        simulate(sched)


def test_deadlock_message_lists_at_most_ten_workers():
    # Fourteen workers wait on dQ tile m0, whose rank 0 nobody writes.
    sched = hand_built([[Task(0, 0, w, 0, w + 1)] for w in range(14)])
    with pytest.raises(SimulationDeadlock) as info:
        simulate(sched)
    assert str(info.value).count("waits for") == 10
    assert "and 4 more blocked workers" in str(info.value)


def test_duplicate_rank_is_refused():
    sched = hand_built([[Task(0, 0, 0, 0, 0)], [Task(0, 0, 1, 0, 0)]])
    with pytest.raises(ValueError, match=r"dQ tile \(b0 h0 m0\) has two tasks with rank 0"):
        simulate(sched)
    gqa = Problem(heads_q=2, heads_kv=1, seqlen_q=128)
    sched = hand_built([[Task(0, 0, 0, 0, 0, 0)], [Task(0, 1, 0, 0, 0, 0)]], gqa)
    with pytest.raises(ValueError, match=r"dK/dV tile \(b0 kvh0 n0\) has two tasks with rank 0"):
        simulate(sched)


def test_gqa_dkv_rank_cycle_deadlocks():
    p = Problem(heads_q=2, heads_kv=1, seqlen_q=128)
    sched = hand_built([[Task(0, 0, 0, 0, 0, 1), Task(0, 1, 0, 0, 0, 0)]], p)
    with pytest.raises(SimulationDeadlock, match=r"dK/dV tile \(b0 kvh0 n0\) counter == 1"):
        simulate(sched)


# -- costs ---------------------------------------------------------------------------------------

def test_signal_latency_is_free_on_one_worker():
    for problem in (full(4, 2), causal(4, 2), Problem(heads_q=4, heads_kv=2, seqlen_q=512)):
        for name in ("fa3", "spt", "descending"):
            sched = build_schedule(name, problem, 1)
            assert simulate(sched, Cost(1, 0.25, 5.0)).makespan == \
                simulate(sched, Cost(1, 0.25)).makespan


def test_signal_latency_stretches_fa3_across_workers():
    sched = build_schedule("fa3", full(4, 1), 4)
    spans = [simulate(sched, Cost(1.0, 0.25, lat)).makespan for lat in (0.0, 0.1, 0.5, 2.0)]
    assert spans == sorted(spans) and spans[0] < spans[-1]
    # The stagger becomes r + latency per worker: m*n*(c+r) + (n-1)*(r+L).
    assert spans[2] == pytest.approx(4 * 1.25 + 3 * (0.25 + 0.5))


def test_gqa_dkv_cost_defaults_to_r_and_is_free_without_gqa():
    t = Task(0, 0, 0, 0, 0, 0)
    assert Cost(1, 0.3).dkv_reduce(t, Problem(heads_q=2, heads_kv=1)) == 0.3
    assert Cost(1, 0.3, dkv_r=0.7).dkv_reduce(t, Problem(heads_q=2, heads_kv=1)) == 0.7
    assert Cost(1, 0.3, dkv_r=0.7).dkv_reduce(t, Problem(heads_q=2)) == 0.0


def test_masked_cost_makes_causal_diagonals_cheaper():
    problem = causal(8, 2)
    sched = build_schedule("symmetric_shift", problem, 8)
    masked, flat = simulate(sched, Cost.masked(1.0, 0.25)), simulate(sched, Cost(1.0, 0.25))
    assert masked.lower_bound < flat.lower_bound
    diag, off = Task(0, 0, 3, 3, 0), Task(0, 0, 3, 5, 0)
    assert Cost.masked(2.0).compute(diag, problem) < Cost.masked(2.0).compute(off, problem) == 2.0


@pytest.mark.parametrize("kwargs,field", [
    ({"c": -1.0}, "cost.c"), ({"r": -0.1}, "cost.r"), ({"signal_latency": -1}, "cost.signal_latency"),
    ({"dkv_r": -2}, "cost.dkv_r"), ({"c": float("nan")}, "cost.c"), ({"r": "1"}, "cost.r"),
])
def test_cost_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Cost(**kwargs)


def test_callable_cost_returning_negative_is_rejected():
    with pytest.raises(ValueError, match=r"cost.r returned -1"):
        simulate(build_schedule("fa3", full(2, 1), 2), Cost(1.0, lambda t, p: -1))


def test_efficiency_of_empty_and_perfect_schedules():
    assert simulate(hand_built([[], []])).efficiency == 1.0
    assert simulate(build_schedule("shift", full(4, 2), 4), Cost(1, 0.25)).efficiency == \
        pytest.approx(1.0)


# -- gantt ---------------------------------------------------------------------------------------

def test_draw_gantt_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from dashgen.schedule.gantt import draw_gantt

    problem = Problem(heads_q=3, heads_kv=1, seqlen_q=512, mask="causal")
    results = [(n, simulate(build_schedule(n, problem, 6), Cost(1, 0.25, 0.1)))
               for n in ("fa3", "symmetric_shift")]
    path = tmp_path / "plan.png"
    draw_gantt(results, str(path), title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


@pytest.mark.parametrize("workers,shown", [(4, 4), (20, 16)])
def test_text_gantt(workers, shown):
    from dashgen.schedule.gantt import text_gantt

    res = simulate(build_schedule("fa3", full(workers, 1), workers), Cost(1, 0.25))
    text = text_gantt(res, width=60)
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("w")]
    assert len(rows) == shown
    assert all(len(row) == len(rows[0]) and row.count("|") == 2 for row in rows)
    assert "#" in text and "efficient" in lines[0]
    if workers > shown:
        assert lines[-1] == f"... {workers - shown} more workers"
    # fa3's last worker waits r per worker in front of it before its first add.
    assert rows[-1].split("|")[1].startswith("#") and rows[0].split("|")[1].rstrip(".") != ""
