"""lab/band_shift.py's policy (measured, not kept: docs/design.md, `band-shift`) on random windows (left, right; narrower than a tile, wider than the sequence),
lengths, tile sizes and worker counts: it verifies (coverage, contiguity, total order,
liveness), its ranks are the tiles' and the window's alone (the same on every worker count, in
every batch and head), it refuses fewer workers than one sequence's KV tiles and masks other
than windows by name, and on an even band no two units visit one Q tile at one step."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashgen import Problem, verify
from dashgen.schedule.builders import Tiling
from dashgen.schedule.simulate import simulate

from band_shift import BAND_SHIFT, build  # lab/ is on the path (the root conftest.py)


def build_schedule(name, problem, workers):
    return build(name, problem, workers)


def min_workers(name, problem):
    return BAND_SHIFT.min_workers(problem)


def workers_used(name, problem, workers):
    return BAND_SHIFT.workers_used(problem, workers)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def window_problems(draw) -> Problem:
    block_m = draw(st.sampled_from([32, 64, 128, 192]))
    block_n = draw(st.sampled_from([64, 128, 192]))
    seqlen_q = draw(st.integers(1, 900))
    seqlen_k = draw(st.one_of(st.just(seqlen_q), st.integers(1, 900)))
    side = st.one_of(st.integers(0, 40), st.integers(0, 1200))  # narrower than a tile, or not
    heads_kv = draw(st.integers(1, 2))
    return Problem(batch=draw(st.integers(1, 2)), heads_q=heads_kv * draw(st.integers(1, 2)),
                   heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                   mask=f"window:{draw(side)},{draw(side)}", block_m=block_m, block_n=block_n)


def ranks(schedule):
    return {(t.batch, t.head, t.n_block, t.m_block): (t.dq_rank, t.dkv_rank)
            for tasks in schedule.workers for t in tasks}


@FAST
@given(problem=window_problems(), extra=st.integers(0, 140))
def test_band_shift_verifies_on_any_worker_count_from_its_minimum(problem, extra):
    lo = min_workers("band_shift", problem)
    assert lo == max(1, problem.num_n_blocks)
    schedule = build_schedule("band_shift", problem, lo + extra)
    verify(schedule)  # raises VerificationError listing any broken invariant
    simulate(schedule)  # and runs to the end (a deadlock raises)


@FAST
@given(problem=window_problems(), e1=st.integers(0, 140), e2=st.integers(0, 140))
def test_band_shift_ranks_are_the_tiles_not_the_workers(problem, e1, e2):
    lo = min_workers("band_shift", problem)
    a, b = (build_schedule("band_shift", problem, lo + e) for e in (e1, e2))
    assert ranks(a) == ranks(b)
    # and not the batch or the other heads: every sequence's ranks are the first one's
    one = ranks(build_schedule("band_shift", problem.sequence(0), lo))
    for (bb, h, n, m), r in ranks(a).items():
        assert one[(0, 0, n, m)][0] == r[0]


def test_band_shift_refuses_by_name():
    assert "band_shift needs a window mask" in BAND_SHIFT.supports(Problem(mask="causal"))
    assert "band_shift needs a window mask" in BAND_SHIFT.supports(Problem())
    with pytest.raises(ValueError, match="band_shift"):
        build_schedule("band_shift", Problem(seqlen_q=512, mask="full"), 8)
    p = Problem(seqlen_q=1024, mask="window:256,0")  # 8 KV tiles wait on each other both ways
    with pytest.raises(ValueError, match="'band_shift' needs at least 8 workers"):
        workers_used("band_shift", p, 7)
    assert workers_used("band_shift", p, 132) == 8  # one sequence: its units


@pytest.mark.parametrize("mask,tiles", [("window:1024,0", (128, 128)), ("window:1024,0", (64, 128)),
                                        ("window:512,512", (128, 128)),
                                        ("window:384,640", (64, 128))])
def test_band_shift_meets_no_two_units_on_one_q_tile_inside_an_even_band(mask, tiles):
    """Units whose bands are whole (neither end clamped) never share a Q tile at one step."""
    p = Problem(seqlen_q=8192, mask=mask, block_m=tiles[0], block_n=tiles[1])
    t = Tiling(p)
    schedule = build_schedule("band_shift", p, 132)
    width = max(t.rows(n) for n in range(t.num_n))
    whole = {n for n in range(t.num_n) if t.rows(n) == width}
    seen = {}
    for tasks in schedule.workers:
        for step, task in enumerate(tasks):
            if task.n_block in whole:
                assert (step, task.m_block) not in seen, (task, seen.get((step, task.m_block)))
                seen[(step, task.m_block)] = task.n_block


def test_band_shift_of_a_window_wider_than_the_sequence_is_the_cyclic_shift():
    wide = Problem(seqlen_q=512, mask="window:4096,4096")
    full = Problem(seqlen_q=512, mask="full")
    assert ranks(build_schedule("band_shift", wide, 4)) == ranks(build_schedule("shift", full, 4))
