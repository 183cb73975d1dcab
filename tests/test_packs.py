"""Packed variable-length problems (Problem.pack) in the schedule IR: every builder verifies on
hypothesis-drawn packs, empty and one-token sequences included; each sequence's ranks in a pack
are the ranks it has alone (the bits of a sequence cannot depend on its neighbours); the deal is
live and keeps heads_together units in one wave; the simulator, the summaries, the files and the
CLI take packs; the kernels refuse them."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashgen import Problem, Schedule, build_schedule, list_schedules, simulate, verify
from dashgen.cli import main
from dashgen.schedule.builders import (BUILDERS, hybrid_policy, schedule_loads,
                                       unsupported_reason)
from dashgen.schedule.builders.base import assemble, pack_deal, pack_order, pack_tilings
from dashgen.schedule.summary import problem_tasks, summarize

TILES = [(128, 128), (64, 128)]


@st.composite
def packs(draw, masks=("full", "causal", "window:100,20")):
    # Lengths around tile boundaries and zero and one token, sometimes with other key lengths.
    length = st.one_of(st.sampled_from([0, 1, 63, 64, 65, 127, 128, 129, 256]),
                       st.integers(0, 700))
    seqlens_q = draw(st.lists(length, min_size=1, max_size=6))
    seqlens_k = draw(st.one_of(st.none(), st.lists(length, min_size=len(seqlens_q),
                                                   max_size=len(seqlens_q))))
    heads_kv = draw(st.sampled_from([1, 2]))
    block_m, block_n = draw(st.sampled_from(TILES))
    return Problem.pack(seqlens_q, seqlens_k, heads_q=heads_kv * draw(st.sampled_from([1, 2])),
                        heads_kv=heads_kv, head_dim=64, mask=draw(st.sampled_from(masks)),
                        block_m=block_m, block_n=block_n)


def serving(problem):
    return [name for name in list_schedules() if unsupported_reason(name, problem) is None]


def rank_table(schedule: Schedule, batch: int | None = None) -> dict:
    """(head, n_block, m_block) -> (dq_rank, dkv_rank) of one sequence's tasks."""
    return {(t.head, t.n_block, t.m_block): (t.dq_rank, t.dkv_rank)
            for program in schedule.workers for t in program
            if batch is None or t.batch == batch}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=packs(), extra=st.integers(0, 40))
def test_every_builder_verifies_on_packs(problem, extra):
    for name in serving(problem):
        workers = BUILDERS[name].min_workers(problem) + extra
        schedule = build_schedule(name, problem, workers)
        verify(schedule)  # raises on any violation: coverage, contiguity, order, liveness
        assert sum(map(len, schedule.workers)) == problem_tasks(problem)
        assert schedule_loads(name, problem, workers) == [len(p) for p in schedule.workers]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=packs(masks=("full", "causal")), extra=st.integers(0, 20))
def test_a_sequences_ranks_in_a_pack_are_its_ranks_alone(problem, extra):
    for name in serving(problem):
        packed = build_schedule(name, problem, BUILDERS[name].min_workers(problem) + extra)
        for b in range(problem.batch):
            alone_problem = problem.sequence(b)
            alone = build_schedule(name, alone_problem,
                                   BUILDERS[name].min_workers(alone_problem) + extra)
            assert rank_table(packed, b) == rank_table(alone), (name, b)


@settings(max_examples=60, deadline=None)
@given(problem=packs(masks=("full", "causal")), extra=st.integers(0, 30))
def test_heads_together_units_share_a_wave_on_distinct_workers(problem, extra):
    for name in serving(problem):
        policy = BUILDERS[name]
        if not policy.heads_together:
            continue
        programs = pack_deal(policy, problem, policy.min_workers(problem) + extra)
        # A unit's wave on its worker: how many units the worker ran before it.
        placed = {}
        for w, units in enumerate(programs):
            for wave, (b, h, u) in enumerate(units):
                placed[(b, h, u)] = (w, wave)
        for (b, h, u), (w, wave) in placed.items():
            partners = [placed[(b, h, v)] for v in range(policy.units(pack_tilings(problem)[b]))]
            assert len({p[0] for p in partners}) == len(partners)  # distinct workers
            assert all(p[0] == w - u + v for v, p in enumerate(partners))  # consecutive


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=packs(masks=("full", "causal")), extra=st.integers(0, 20))
def test_hybrid_gives_each_sequence_the_ranks_of_its_order_alone(problem, extra):
    """hybrid with a bound of 3 KV tiles (so that small packs mix both orders): the pack
    verifies, and each sequence's ranks are those of shift / symmetric_shift alone where it has
    at most 3 KV tiles, else those of fa3 / descending alone."""
    policy = hybrid_policy(3, 106)
    packed = assemble(policy, problem, policy.min_workers(problem) + extra)
    verify(packed)
    assert sum(map(len, packed.workers)) == problem_tasks(problem)
    together, ordered = (("symmetric_shift", "descending") if problem.mask.kind == "causal"
                         else ("shift", "fa3"))
    for b, tiling in enumerate(pack_tilings(problem)):
        name = together if policy.runs_together(tiling) else ordered
        alone_problem = problem.sequence(b)
        alone = build_schedule(name, alone_problem,
                               BUILDERS[name].min_workers(alone_problem) + extra)
        assert rank_table(packed, b) == rank_table(alone), (name, b)


def test_a_fixed_length_batch_as_a_pack_keeps_its_ranks():
    """The same tasks and ranks (so the same bits); the shift orders even the same placement,
    while units that run independently are dealt by cost in a pack."""
    fixed = Problem(batch=3, heads_q=2, seqlen_q=700, head_dim=64, mask="causal")
    pack = Problem.pack([700] * 3, heads_q=2, head_dim=64, mask="causal")
    for name in serving(fixed):
        workers = BUILDERS[name].min_workers(fixed) * 2
        a, b = build_schedule(name, fixed, workers), build_schedule(name, pack, workers)
        for seq in range(3):
            assert rank_table(a, seq) == rank_table(b, seq), name
        if BUILDERS[name].heads_together:
            assert a.workers == b.workers, name


@pytest.mark.parametrize("name, mask, bound", [
    ("fa3", "causal", 1.05), ("descending", "causal", 1.05), ("spt", "causal", 1.20),
    ("fa3", "full", 1.05), ("spt", "full", 1.05)])
def test_independent_units_are_dealt_by_cost_in_a_snake(name, mask, bound):
    """A long-tailed pack of 16k tokens, 16 heads, 132 workers: the busiest worker against
    ceil(tasks / 132), as measured when the snake deal was chosen (1.006-1.181) with some room;
    dealt round-robin in pack order the same pack gave 1.05-1.29."""
    lengths = [9000, 2500, 1200, 1100, 700, 500, 300, 300, 200, 100, 100, 60, 30, 1, 0]
    problem = Problem.pack(lengths, heads_q=16, head_dim=128, mask=mask, block_m=64,
                           block_n=128)
    loads = schedule_loads(name, problem, 132)
    assert max(loads) <= bound * -(-sum(loads) // 132)


def test_long_sequences_are_dealt_first():
    problem = Problem.pack([100, 900, 0, 400], heads_q=1, head_dim=64, mask="causal")
    assert pack_order(BUILDERS["fa3"], pack_tilings(problem)) == [1, 3, 0]  # no empty one


def test_a_shift_pack_needs_its_largest_sequences_units():
    problem = Problem.pack([1000, 300], head_dim=64)  # 8 and 3 KV tiles of 128 keys
    assert BUILDERS["shift"].min_workers(problem) == 8
    with pytest.raises(ValueError, match=r"^schedule 'shift' needs at least 8 workers for this "
                                         r"pack"):
        build_schedule("shift", problem, 7)
    verify(build_schedule("shift", problem, 9))  # not a multiple of 8: the pack's waves fill it


def test_the_simulator_and_the_summary_take_packs():
    problem = Problem.pack([3000, 10, 500, 0, 9000], heads_q=4, head_dim=128, mask="causal",
                           block_m=64, block_n=128)
    for name in serving(problem):
        s = build_schedule(name, problem, 132)
        result = simulate(s)
        assert result.makespan >= result.lower_bound > 0
        summary = summarize(name, problem, 132)
        assert summary.num_tasks == problem_tasks(problem) == sum(map(len, s.workers))
        assert summary.max_load == max(map(len, s.workers))


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(seqlens_q=()), r"^seqlens_q must be a non-empty sequence of non-negative ints"),
    (dict(seqlens_q=(3, -1)), r"^seqlens_q must be a non-empty sequence"),
    (dict(seqlens_q=(3, 4), seqlens_k=(1,)), r"^seqlens_k has 1 sequences but seqlens_q has 2"),
    (dict(seqlens_k=(3,)), r"^seqlens_k needs seqlens_q"),
    (dict(seqlens_q=(3, 4), batch=3), r"^batch is 3 but the pack has 2 sequences"),
])
def test_bad_packs_are_named(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        Problem(**kwargs)


def test_a_packs_tiles_need_the_sequence():
    problem = Problem.pack([100, 300])
    with pytest.raises(ValueError, match=r"pass its batch index"):
        problem.m_blocks_of(0)
    assert problem.m_blocks_of(0, 1) == [0, 1, 2] and problem.m_blocks_of(1, 0) == []
    assert problem.batch == 2 and (problem.seqlen_q, problem.seqlen_k) == (300, 300)


def test_a_pack_schedule_round_trips_through_its_file(tmp_path):
    problem = Problem.pack([300, 0, 129], [200, 5, 129], heads_q=2, head_dim=64, mask="causal")
    schedule = build_schedule("spt", problem, 4)
    path = tmp_path / "pack.json"
    path.write_text(schedule.to_json())
    again = Schedule.from_json(path.read_text())
    assert again.problem == problem and again.workers == schedule.workers
    verify(again)
    data = json.loads(path.read_text())
    data["problem"]["seqlen_q"] = 999  # must agree with the sequences
    with pytest.raises(ValueError, match=r"problem.seqlen_q is 999 but the pack's sequences "
                                         r"give 300"):
        Schedule.from_json(json.dumps(data))


def test_the_cli_shows_and_plans_a_pack(capsys):
    assert main(["show", "--schedule", "fa3", "--seqlens", "130,0,1", "--hdim", "64",
                 "--mask", "causal", "--workers", "2"]) in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("fa3: pack of 3 sequences (131 tokens, the longest 130), heads 1")
    assert "b0.n1: m1" in out and "b2" in out and "b1" not in out  # the empty one has no tile
    assert main(["plan", "--schedule", "all", "--seqlens", "3000,10,500", "--hdim", "128",
                 "--mask", "causal"]) in (0, None)
    assert "symmetric_shift" in capsys.readouterr().out


def test_the_kernels_refuse_a_pack():
    from dashgen.runtime.select import check_kernel_problem
    with pytest.raises(ValueError, match=r"no per-shape kernel selection"):
        check_kernel_problem(Problem.pack([100, 200], head_dim=64))


def test_emit_refuses_a_pack_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--schedule", "fa3", "--seqlens", "100,200", "--hdim", "64"])
    assert exit_.value.code == 2
    assert "--seqlens: a pack's kernels read its lengths at run time: emit them with --varlen" \
        in capsys.readouterr().err


def test_plan_draws_a_packs_gantt_chart(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "pack.png"
    assert main(["plan", "--schedule", "symmetric_shift", "--seqlens", "700,0,1,300,129",
                 "--heads", "2", "--hdim", "64", "--mask", "causal", "--workers", "8",
                 "--png", str(png)]) in (0, None)
    assert f"wrote {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
