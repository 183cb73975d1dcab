"""The kernel model (dashgen plan --kernel-model): the writer decoupled from the MMA pipeline,
its buffers and lanes, the dQ order's waits and the signal latency across workers."""
from __future__ import annotations

import pytest

from dashgen import Problem, build_schedule
from dashgen.schedule.ir import Task
from dashgen.tools.kernel_model import KernelCost, kernel_makespan


def full_problem(n: int) -> Problem:
    return Problem(seqlen_q=64 * n, seqlen_k=64 * n, block_m=64, block_n=64)


def test_one_worker_runs_its_compute_back_to_back_when_the_writer_keeps_up():
    s = build_schedule("fa3", full_problem(4), 1)  # 16 tasks on one worker
    assert kernel_makespan(s, KernelCost(c=1.0, r=0.5)) == pytest.approx(16 + 0.5)


def test_a_slow_writer_bounds_the_worker_through_its_buffers():
    s = build_schedule("fa3", full_problem(4), 1)
    # The writer needs 2 per task: 16 adds after the first compute.
    assert kernel_makespan(s, KernelCost(c=1.0, r=2.0, buffers=2)) == pytest.approx(1 + 16 * 2)


def test_fa3_full_mask_waits_shift_does_not():
    p = full_problem(8)  # 8 KV tiles x 8 Q tiles, 8 workers: all want dQ 0 at once under fa3
    cost = KernelCost(c=1.0, r=0.9, buffers=1)
    fa3 = kernel_makespan(build_schedule("fa3", p, 8), cost)
    shift = kernel_makespan(build_schedule("shift", p, 8), cost)
    assert shift == pytest.approx(8 * 1.0 + 0.9)  # never waits: compute + the last add
    assert fa3 > shift + 5 * 0.9  # the serialized first dQ tile staggers the workers


def test_unordered_mode_never_waits():
    p = full_problem(8)
    s = build_schedule("fa3", p, 8)
    cost = KernelCost(c=1.0, r=0.9, signal_latency=0.3, buffers=1)
    assert kernel_makespan(s, cost, ordered=False) == pytest.approx(8 * 1.0 + 0.9)
    assert kernel_makespan(s, cost, ordered=True) > kernel_makespan(s, cost, ordered=False)


def test_signal_latency_costs_only_across_workers():
    s = build_schedule("fa3", full_problem(4), 1)
    assert kernel_makespan(s, KernelCost(1.0, 0.5, signal_latency=10.0)) == pytest.approx(16.5)


def test_overhead_adds_once():
    s = build_schedule("fa3", full_problem(2), 2)
    base = kernel_makespan(s, KernelCost(1.0, 0.2))
    assert kernel_makespan(s, KernelCost(1.0, 0.2, overhead=7.0)) == pytest.approx(base + 7.0)


def test_a_rank_cycle_deadlocks():
    p = Problem(seqlen_q=128, block_m=64, block_n=64)  # 2 KV tiles x 2 Q tiles
    s = build_schedule("fa3", p, 2)
    # Worker 0 adds m0 second and m1 first; worker 1 the opposite, in program order m0, m1.
    s.workers[0] = [Task(0, 0, 0, 0, 1), Task(0, 0, 0, 1, 0)]
    s.workers[1] = [Task(0, 0, 1, 1, 1), Task(0, 0, 1, 0, 0)]
    with pytest.raises(RuntimeError, match="deadlock"):
        kernel_makespan(s, KernelCost(buffers=1))


def test_two_writer_lanes_keep_up_with_a_writer_twice_as_slow():
    s = build_schedule("fa3", full_problem(4), 1)  # 16 tasks on one worker
    # One lane: 16 adds of 2 after the first compute. Two (a buffer each): task p's MMAs end
    # at p + 1 and its add at p + 3, so the compute sets the pace.
    assert kernel_makespan(s, KernelCost(c=1.0, r=2.0, buffers=2, writers=2)) == \
        pytest.approx(16 * 1.0 + 2.0)


def test_two_lanes_wait_apart_but_one_tiles_adds_stay_in_a_chain():
    p = full_problem(8)
    one, two = (KernelCost(c=1.0, r=1.5, buffers=2, writers=w) for w in (1, 2))
    # fa3: a lane waiting for a rank no longer holds the next task's add.
    fa3 = build_schedule("fa3", p, 8)
    assert kernel_makespan(fa3, two) < kernel_makespan(fa3, one)
    # shift: each dQ tile's eight adds land one after another (1 + 8 x 1.5) with any lanes.
    shift = build_schedule("shift", p, 8)
    assert kernel_makespan(shift, one) == kernel_makespan(shift, two) == pytest.approx(13.0)


def test_two_lanes_run_a_rank_cycle_one_lane_cannot():
    p = Problem(seqlen_q=128, block_m=64, block_n=64)
    s = build_schedule("fa3", p, 2)
    s.workers[0] = [Task(0, 0, 0, 0, 1), Task(0, 0, 0, 1, 0)]
    s.workers[1] = [Task(0, 0, 1, 1, 1), Task(0, 0, 1, 0, 0)]
    # Each worker's second task is its tile's rank 0: its own lane adds it while the first
    # task's lane waits, which one lane (in program order) cannot.
    assert kernel_makespan(s, KernelCost(c=1.0, r=0.5, buffers=2, writers=2)) == \
        pytest.approx(3.0)
    with pytest.raises(RuntimeError, match="deadlock"):
        kernel_makespan(s, KernelCost(c=1.0, r=0.5, buffers=2, writers=1))


@pytest.mark.parametrize("fields", [dict(writers=3), dict(writers=0), dict(writers=True),
                                    dict(buffers=1, writers=2)])
def test_writer_lanes_beyond_the_buffers_are_refused(fields):
    with pytest.raises(ValueError, match="writers must be"):
        KernelCost(**fields)


@pytest.mark.parametrize("field,value", [("c", -1.0), ("r", "x"), ("buffers", 0)])
def test_bad_costs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        KernelCost(**{field: value})
