"""lab/pieces_model.py: the swapped backward's dQ hand-off in pieces, on one worker whose turns
are always free, where each case has a closed form."""
from __future__ import annotations

import pytest

from dashgen import Problem, build_schedule
from pieces_model import PieceCost, pieces_makespan  # lab/ is on the path (the root conftest.py)


def one_worker(tiles: int = 4):
    problem = Problem(seqlen_q=64 * tiles, seqlen_k=64 * tiles, block_m=64, block_n=64)
    return build_schedule("fa3", problem, 1)  # tiles^2 tasks, every turn free in program order


def test_a_turn_taken_after_the_first_piece_stretches_each_task_by_what_the_dq_phase_cannot_hide():
    s = one_worker()  # 16 tasks
    cost = PieceCost(c=1.0, dq_share=0.25, r=0.2, acquire=0.2, signal_latency=0.0)
    # Each task: first piece at 0.75, turn at 0.95, pieces read and landed at 1.15 > 1.0.
    assert pieces_makespan(s, cost) == pytest.approx(16 * 1.15)
    # The turn taken first (at the writer's last landing + 0.2) is before the first piece.
    assert pieces_makespan(s, cost, turn_first=True) == pytest.approx(16 * 1.0)
    assert pieces_makespan(s, cost, ordered=False) == pytest.approx(16 * 1.0)


def test_a_short_acquire_is_hidden_by_the_dq_phase_either_way():
    s = one_worker()
    cost = PieceCost(c=1.0, dq_share=0.25, r=0.2, acquire=0.05, signal_latency=0.0)
    assert pieces_makespan(s, cost) == pytest.approx(16 * 1.0)


def test_a_rank_cycle_deadlocks():
    from dashgen.schedule.ir import Task
    s = build_schedule("fa3", Problem(seqlen_q=128, block_m=64, block_n=64), 2)
    s.workers[0] = [Task(0, 0, 0, 0, 1), Task(0, 0, 0, 1, 0)]
    s.workers[1] = [Task(0, 0, 1, 1, 1), Task(0, 0, 1, 0, 0)]
    with pytest.raises(RuntimeError, match="deadlock"):
        pieces_makespan(s, PieceCost())
