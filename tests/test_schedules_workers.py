"""The worker count decides only who runs which unit when: every named schedule gives a tile the
same dq_rank and dkv_rank on any worker count from its minimum to 132 and whatever the other
sequences are; workers_used refuses fewer than the minimum; the loads and the summary (no tasks
built) are the built schedule's."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashgen import Problem, Schedule, build_schedule, verify
from dashgen.schedule.builders import (BUILDERS, Tiling, list_schedules, min_workers,
                                       schedule_loads, workers_used)
from dashgen.schedule.summary import problem_tasks, summarize

MAX_WORKERS = 132  # the kernels' SM count (dashgen.runtime.select.DEFAULT_SM_COUNT)
TILES = [(64, 128), (128, 128)]  # the backward's (block_m, block_n) at head_dim 128 and 64
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, batch: int | None = None, heads_kv: int | None = None,
             group: int | None = None) -> Problem:
    """Full or causal, seqlen_q and seqlen_k drawn apart (or equal), the backward's tiles; the
    sequence count drawn unless given."""
    block_m, block_n = draw(st.sampled_from(TILES))
    seqlen_q = draw(st.integers(1, 700))
    seqlen_k = draw(st.one_of(st.just(seqlen_q), st.integers(1, 700)))
    heads_kv = heads_kv or draw(st.integers(1, 2))
    return Problem(batch=batch or draw(st.integers(1, 2)),
                   heads_q=heads_kv * (group or draw(st.integers(1, 2))), heads_kv=heads_kv,
                   seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                   mask=draw(st.sampled_from(["full", "causal"])),
                   head_dim=128 if block_m == 64 else 64, block_m=block_m, block_n=block_n)


def served(problem: Problem) -> list[str]:
    return [name for name in list_schedules() if BUILDERS[name].supports(problem) is None]


def ranks(schedule: Schedule) -> dict[tuple[int, int, int, int], tuple[int, int | None]]:
    """(batch, head, n_block, m_block) -> (dq_rank, dkv_rank) of every task."""
    return {t.tile: (t.dq_rank, t.dkv_rank) for program in schedule.workers for t in program}


@FAST
@given(problem=problems())
def test_ranks_are_the_same_on_every_worker_count(problem):
    for name in served(problem):
        lo = min_workers(name, problem)
        reference = ranks(build_schedule(name, problem, lo))
        assert len(reference) == problem_tasks(problem)
        for workers in range(lo + 1, MAX_WORKERS + 1):
            schedule = build_schedule(name, problem, workers)
            assert not schedule.depends_on_workers
            assert ranks(schedule) == reference, (name, problem.describe(), workers)


@FAST
@given(data=st.data(), one=problems(batch=1, heads_kv=1, group=1),
       batch=st.integers(1, 3), heads_kv=st.integers(1, 2), group=st.integers(1, 3))
def test_a_sequences_ranks_do_not_depend_on_the_other_sequences(data, one, batch, heads_kv,
                                                                 group):
    many = Problem(batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv,
                   seqlen_q=one.seqlen_q, seqlen_k=one.seqlen_k, mask=one.mask,
                   head_dim=one.head_dim, block_m=one.block_m, block_n=one.block_n)
    for name in served(one):
        alone = ranks(build_schedule(name, one, min_workers(name, one)))
        workers = data.draw(st.integers(min_workers(name, many), MAX_WORKERS), label=name)
        together = ranks(build_schedule(name, many, workers))
        for b in range(batch):
            for h in range(many.heads_q):
                # dK/dV under GQA: the query heads of a group add in head order
                dkv = h % many.group_size if many.gqa else None
                mine = {(n, m): r for (bb, hh, n, m), r in together.items() if (bb, hh) == (b, h)}
                assert mine == {(n, m): (dq, dkv) for (_, _, n, m), (dq, _) in alone.items()}, (
                    name, many.describe(), workers, b, h)


@FAST
@given(problem=problems())
def test_workers_used_refuses_fewer_than_the_minimum(problem):
    for name in served(problem):
        policy = BUILDERS[name]
        lo = min_workers(name, problem)
        tiling = Tiling(problem)
        per_seq = policy.units(tiling)
        units = problem.batch * problem.heads_q * per_seq
        together = policy.runs_together(tiling)  # hybrid: by the sequence's size
        if not together:
            assert lo == 1
        else:
            assert lo == max(1, per_seq)
        for workers in range(1, lo):
            for call in (workers_used, schedule_loads, build_schedule):
                with pytest.raises(ValueError) as err:
                    call(name, problem, workers)
                message = str(err.value)
                assert f"schedule {name!r} needs at least {lo} workers" in message
                assert f"got num_workers={workers}" in message
        for workers in range(lo, MAX_WORKERS + 1):
            used = workers_used(name, problem, workers)
            # whole sequences a wave for the arrival-ranked orders, never more than the units
            rounded = workers - workers % per_seq if together else workers
            assert used == max(1, min(rounded, units)) and 1 <= used <= workers


@FAST
@given(problem=problems(), extra=st.integers(0, 11))
def test_every_schedule_verifies_from_its_minimum_up(problem, extra):
    for name in served(problem):
        lo = min_workers(name, problem)
        for workers in sorted({lo, lo + extra, lo + 2 * extra + 1, max(lo, MAX_WORKERS)}):
            schedule = build_schedule(name, problem, workers)
            report = verify(schedule)
            assert report.num_tasks == problem_tasks(problem)
            assert schedule.num_workers == workers_used(name, problem, workers)


@FAST
@given(problem=problems(), data=st.data())
def test_loads_and_summary_are_the_built_schedules(problem, data):
    for name in served(problem):
        workers = data.draw(st.integers(min_workers(name, problem), MAX_WORKERS), label=name)
        built = build_schedule(name, problem, workers)
        lengths = [len(program) for program in built.workers]
        assert schedule_loads(name, problem, workers) == lengths
        s = summarize(name, problem, workers)
        assert (s.num_workers, s.workers_used, s.num_tasks) == (workers, built.num_workers,
                                                                built.num_tasks)
        assert (s.min_load, s.max_load, s.busiest) == (min(lengths), max(lengths),
                                                       lengths.index(max(lengths)))
        assert s.bound == -(-built.num_tasks // workers) <= s.max_load
        assert s.ratio == s.max_load / s.bound >= 1.0
        assert s.mean_load == pytest.approx(built.num_tasks / built.num_workers)


def anchors_problem(head_dim: int, mask: str, seqlen: int) -> Problem:
    """A benchmark configuration (16384 tokens, hidden 2048) in the backward's tiles."""
    return Problem(batch=16384 // seqlen, heads_q=2048 // head_dim, seqlen_q=seqlen,
                   head_dim=head_dim, mask=mask, block_m=128 if head_dim == 64 else 64,
                   block_n=128)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("seqlen", [1024, 2048, 4096, 8192, 16384])
def test_the_dash_orders_run_whole_heads_on_the_benchmark(head_dim, mask, seqlen):
    # A head has seqlen / 128 KV tiles: a unit each under shift, a pair a unit under
    # symmetric_shift (all of one size), so 4 to 128 units: 132 SMs run a multiple of them.
    name = "shift" if mask == "full" else "symmetric_shift"
    problem = anchors_problem(head_dim, mask, seqlen)
    per_seq = seqlen // 128 // (1 if mask == "full" else 2)
    assert min_workers(name, problem) == per_seq
    assert workers_used(name, problem, 132) == 132 - 132 % per_seq == (
        132 if per_seq == 4 else 128)
    loads = schedule_loads(name, problem, 132)
    tiling = Tiling(problem)
    size = BUILDERS[name].unit_tasks(tiling, 0)
    assert {BUILDERS[name].unit_tasks(tiling, u) for u in range(per_seq)} == {size}
    # dealt in turn: the workers' unit counts differ by one at most
    assert max(loads) - min(loads) <= size and sum(loads) == problem_tasks(problem)


@pytest.mark.parametrize("name", ["fa3", "spt", "descending"])
def test_the_launch_ranked_orders_run_on_any_worker_count(name):
    problem = anchors_problem(64, "causal", 4096)
    assert min_workers(name, problem) == 1
    assert [workers_used(name, problem, w) for w in (1, 7, 128, 132)] == [1, 7, 128, 132]
