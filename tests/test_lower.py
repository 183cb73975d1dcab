"""lower(): the task table the kernel walks decodes back to the schedule, for every builder."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashgen import Mask, Problem, Schedule, Task, build_schedule, list_schedules
from dashgen.schedule.lower import TASK_WORDS, decode, lower
from dashgen.schedule.builders import BUILDERS, unsupported_reason

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MASKS = {"full": Mask.full(), "causal": Mask.causal(), "window": Mask.window(100, 30)}
LIMIT = 1 << 15


def served(name: str) -> list[str]:
    return [kind for kind, mask in MASKS.items()
            if unsupported_reason(name, Problem(mask=mask)) is None]


@st.composite
def schedules(draw):
    """A builder, one of the masks it serves, GQA on or off, 1..64 workers, a small problem."""
    name = draw(st.sampled_from(list_schedules()))
    kind = draw(st.sampled_from(served(name)))
    heads_kv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]) if draw(st.booleans()) else st.just(1))  # GQA on/off
    seqlen_q = draw(st.integers(1, 600))
    seqlen_k = draw(st.one_of(st.just(seqlen_q), st.integers(1, 600)))
    problem = Problem(batch=draw(st.integers(1, 2)), heads_q=heads_kv * group, heads_kv=heads_kv,
                      seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                      head_dim=draw(st.sampled_from([64, 128])), mask=MASKS[kind], block_m=draw(st.sampled_from([64, 128])),
                      block_n=draw(st.sampled_from([64, 128])))
    least = BUILDERS[name].min_workers(problem)  # the shift orders: one sequence at once
    return build_schedule(name, problem, draw(st.integers(least, max(least, 64))))


@FAST
@given(schedules())
def test_decode_inverts_lower(schedule):
    plan = lower(schedule)
    assert decode(plan) == schedule.workers
    assert plan.schedule_name == schedule.name and plan.problem == schedule.problem
    assert plan.num_workers == schedule.num_workers
    assert plan.tasks.typecode == "i" and plan.worker_offsets.typecode == "i"


@FAST
@given(schedules())
def test_worker_offsets_bound_each_program(schedule):
    plan = lower(schedule)
    offsets = list(plan.worker_offsets)
    assert len(offsets) == schedule.num_workers + 1 and offsets[0] == 0
    assert all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert offsets[-1] == plan.num_tasks == schedule.num_tasks
    assert len(plan.tasks) == TASK_WORDS * plan.num_tasks
    assert [b - a for a, b in zip(offsets, offsets[1:])] == [len(w) for w in schedule.workers]


def test_every_builder_and_served_mask_is_drawn():
    # The strategy above only draws from served(); make sure that covers every builder.
    assert all(served(name) for name in list_schedules())
    assert served("shift") == ["full"] and served("symmetric_shift") == ["causal"]


def test_dkv_rank_none_encodes_as_minus_one():
    problem = Problem(heads_q=4, heads_kv=4, seqlen_q=256, mask="causal", block_m=64, block_n=64)
    plan = lower(build_schedule("fa3", problem, 3))
    assert set(plan.tasks[3::TASK_WORDS]) == {-1}
    gqa = Problem(heads_q=4, heads_kv=2, seqlen_q=256, mask="causal", block_m=64, block_n=64)
    plan = lower(build_schedule("fa3", gqa, 3))
    assert min(plan.tasks[3::TASK_WORDS]) == 0


# A schedule's table is checked against its problem before any task is packed, so an empty
# program on a huge problem is enough to reach the limit without building millions of tasks.
@pytest.mark.parametrize("field,problem", [
    ("batch", Problem(batch=LIMIT)),
    ("heads_q", Problem(heads_q=LIMIT)),
    ("num_m_blocks", Problem(seqlen_q=LIMIT * 64, seqlen_k=64, block_m=64)),
    ("num_n_blocks", Problem(seqlen_q=64, seqlen_k=LIMIT * 64, block_n=64)),
])
def test_too_large_for_the_table_names_the_field(field, problem):
    with pytest.raises(ValueError, match=rf"^{field} = {LIMIT} does not fit the task table"):
        lower(Schedule("fa3", problem, 1, [[]]))


def test_largest_problem_that_fits_round_trips():
    top = LIMIT - 1
    problem = Problem(batch=top, heads_q=top, seqlen_q=top * 64, seqlen_k=top * 64,
                      block_m=64, block_n=64)
    corner = [Task(top - 1, top - 1, top - 1, top - 1, 5, 7), Task(0, top - 1, 0, top - 1, 0, None)]
    plan = lower(Schedule("fa3", problem, 2, [corner, []]))
    assert decode(plan) == [corner, []]
    assert min(plan.tasks) >= -1  # both halves of every packed word stay non-negative
