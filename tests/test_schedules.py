"""Builder-specific properties: the orders each schedule promises, refusals, JSON (the worker
count's part: tests/test_schedules_workers.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from dashgen import Problem, Schedule, ScheduleFormatError, UnsupportedProblem, build_schedule
from dashgen.schedule.builders import BUILDERS, list_schedules, min_workers


def dq_orders(schedule: Schedule) -> dict[tuple[int, int, int], list[int]]:
    """For every dQ tile, its contributing KV tiles in summation order."""
    tiles: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for tasks in schedule.workers:
        for t in tasks:
            tiles.setdefault(t.dq_tile, []).append((t.dq_rank, t.n_block))
    return {k: [n for _, n in sorted(v)] for k, v in tiles.items()}


def test_list_schedules_names_every_builder():
    assert list_schedules() == ["fa3", "spt", "descending", "shift", "symmetric_shift",
                                "spt_listed", "hybrid"]


@pytest.mark.parametrize("name", list_schedules())
def test_docstring_carries_a_show_example(name):
    # The doctest inside the docstring runs `dashgen show` and compares its output.
    assert '>>> main(["show", "--schedule", "%s"' % name in BUILDERS[name].doc


def test_fa3_sums_in_ascending_kv_order():
    p = Problem(heads_q=2, seqlen_q=700, mask="causal", block_m=64, block_n=128)
    for order in dq_orders(build_schedule("fa3", p, 5)).values():
        assert order == sorted(order)


def test_spt_launches_shortest_first_and_sums_highest_first():
    p = Problem(heads_q=3, seqlen_q=1024, mask="causal")
    s = build_schedule("spt", p, 4)
    for order in dq_orders(s).values():
        assert order == sorted(order, reverse=True)
    first = [tasks[0] for tasks in s.workers]
    assert [t.n_block for t in first] == [7, 6, 5, 4]


def test_descending_visits_q_tiles_last_to_first():
    p = Problem(seqlen_q=1024, mask="causal")
    s = build_schedule("descending", p, 8)
    for w in range(8):
        for seg in s.segments(w):
            ms = [t.m_block for t in seg]
            assert ms == sorted(ms, reverse=True)


def test_shift_has_no_two_workers_on_one_dq_tile_at_one_step():
    p = Problem(heads_q=2, seqlen_q=1024)  # 8 KV tiles, 8 Q tiles per head
    s = build_schedule("shift", p, 16)
    for step in range(8):
        tiles = [s.workers[w][step].dq_tile for w in range(16)]
        assert len(set(tiles)) == 16


def test_symmetric_shift_pairs_long_with_short_tiles():
    n = 8
    p = Problem(heads_q=2, seqlen_q=n * 128, mask="causal")
    s = build_schedule("symmetric_shift", p, n)
    for w in range(n):
        segs = s.segments(w)
        assert len(segs) == 2
        big, small = segs[0][0].n_block, segs[1][0].n_block
        assert big + small == n - 1
        assert len(s.workers[w]) == n + 1


def test_symmetric_shift_odd_tile_count_leaves_the_middle_alone():
    p = Problem(seqlen_q=5 * 128, mask="causal")
    s = build_schedule("symmetric_shift", p, 3)
    assert [[seg[0].n_block for seg in s.segments(w)] for w in range(3)] == [[0, 4], [1, 3], [2]]


@pytest.mark.parametrize("name,mask", [("shift", "causal"), ("shift", "window:64,64"),
                                       ("symmetric_shift", "full"),
                                       ("symmetric_shift", "window:128,0")])
def test_builders_refuse_masks_they_cannot_serve(name, mask):
    with pytest.raises(UnsupportedProblem) as err:
        build_schedule(name, Problem(seqlen_q=512, mask=mask), 4)
    assert name in str(err.value) and "mask" in err.value.reason


def test_unknown_schedule_and_bad_worker_count():
    p = Problem(seqlen_q=256)
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        build_schedule("nope", p, 4)
    with pytest.raises(ValueError, match="num_workers"):
        build_schedule("fa3", p, 0)


problems = st.builds(
    Problem,
    batch=st.integers(1, 2), heads_q=st.integers(1, 3),
    seqlen_q=st.integers(1, 900), seqlen_k=st.integers(1, 900),
    mask=st.sampled_from(["full", "causal", "window:100,30"]),
    block_m=st.sampled_from([64, 128]), block_n=st.sampled_from([64, 128, 192]))


@settings(max_examples=40, deadline=None)
@given(problems, st.integers(0, 131), st.integers(0, 131))
def test_dq_orders_are_the_same_on_any_two_worker_counts(problem, e1, e2):
    # Window masks and 192-key tiles too (tests/test_schedules_workers.py: every count, ranks)
    for name, builder in BUILDERS.items():
        if builder.supports(problem) is not None:
            continue
        lo = min_workers(name, problem)
        a = build_schedule(name, problem, lo + e1)
        b = build_schedule(name, problem, lo + e2)
        assert not a.depends_on_workers and not b.depends_on_workers
        assert dq_orders(a) == dq_orders(b), name


@pytest.mark.parametrize("name,mask", [("shift", "full"), ("symmetric_shift", "causal")])
def test_arrival_ordered_builders_run_whole_heads_at_once(name, mask):
    # 8 KV tiles: shift's 8 units or symmetric_shift's 4 pairs wait on each other both ways.
    p = Problem(heads_q=3, seqlen_q=1024, mask=mask)
    units = 8 if name == "shift" else 4
    assert BUILDERS[name].heads_together and min_workers(name, p) == units
    with pytest.raises(ValueError, match=f"needs at least {units} workers"):
        build_schedule(name, p, units - 1)
    assert build_schedule(name, p, 2 * units + 1).num_workers == 2 * units
    assert dq_orders(build_schedule(name, p, units)) == dq_orders(build_schedule(name, p, 24))


@settings(max_examples=30, deadline=None)
@given(problems, st.integers(0, 40), st.sampled_from(list_schedules()))
def test_json_round_trip(problem, extra, name):
    try:
        s = build_schedule(name, problem, min_workers(name, problem) + extra)
    except UnsupportedProblem:
        return
    back = Schedule.from_json(s.to_json())
    assert back.workers == s.workers
    assert back.problem == s.problem
    assert (back.name, back.num_workers, back.depends_on_workers) == (
        s.name, s.num_workers, s.depends_on_workers)


def test_gqa_tasks_carry_dkv_ranks():
    p = Problem(heads_q=8, heads_kv=2, seqlen_q=512, mask="causal")
    s = build_schedule("fa3", p, 6)
    ranks: dict[tuple[int, int, int], set[int]] = {}
    for tasks in s.workers:
        for t in tasks:
            assert t.dkv_rank is not None
            ranks.setdefault((t.batch, p.kv_head(t.head), t.n_block), set()).add(t.dkv_rank)
    assert all(r == {0, 1, 2, 3} for r in ranks.values())


@pytest.mark.parametrize("text,message", [
    ("{", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"format": "other"}', "format must be"),
    ('{"format": "dashgen.schedule/1", "name": "x", "num_workers": 1, "problem": {"seqlen_q": 0},'
     ' "workers": []}', "seqlen_q must be a positive int"),
    ('{"format": "dashgen.schedule/1", "name": "x", "num_workers": 1, "problem": {},'
     ' "workers": [[[0, 0, 0]]]}', "worker 0 position 0"),
    ('{"format": "dashgen.schedule/1", "name": "x", "num_workers": 1, "problem": {"bogus": 1},'
     ' "workers": []}', "unknown fields: bogus"),
])
def test_malformed_schedule_files_give_readable_errors(text, message):
    with pytest.raises(ScheduleFormatError, match=message):
        Schedule.from_json(text)
