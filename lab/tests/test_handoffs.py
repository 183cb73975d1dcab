"""lab/handoffs.py: the timed trace's stamps read back as waits, pace and release latency."""
import pytest
import torch

from dashgen import Problem, build_schedule
from dashgen.codegen.variants import TRACE_COLUMNS

from handoffs import handoffs, summarize  # lab/ is on the path (the root conftest.py)


def timed_trace(schedule, ready, acquired, landed, base=0):
    """A trace of `schedule` in plan order with the given timer stamps (ns, offset by `base`
    and wrapped to 32 bits as the kernel writes them) and SM clocks twice the timer."""
    rows = []
    for w, tasks in enumerate(schedule.workers):
        for t in tasks:
            rows.append([t.batch, t.head, t.n_block, t.m_block, t.dq_rank, t.dq_rank])
    trace = torch.zeros(len(rows), TRACE_COLUMNS, dtype=torch.int64)
    trace[:, :6] = torch.tensor(rows)
    for column, stamps in ((6, ready), (7, acquired), (8, landed)):
        ns = torch.tensor(stamps, dtype=torch.int64) + base
        trace[:, column] = (2 * ns) % 2**32
        trace[:, column + 3] = ns % 2**32
    # int32 as the kernel's buffer holds them (values past 2**31 read negative)
    return torch.where(trace >= 2**31, trace - 2**32, trace).to(torch.int32)


def offsets_of(schedule):
    out = [0]
    for tasks in schedule.workers:
        out.append(out[-1] + len(tasks))
    return out


@pytest.mark.parametrize("base", [0, 2**32 - 150])  # the timer wraps inside the kernel
def test_two_workers_shift_stamps_read_back(base):
    # shift, 2 KV tiles x 2 Q tiles on 2 workers: worker 0 runs (n0,m0) (n0,m1), worker 1
    # (n1,m1) (n1,m0); rank 1 of m1 is worker 0's second task, of m0 worker 1's second.
    p = Problem(batch=1, heads_q=1, heads_kv=1, seqlen_q=256, seqlen_k=256, head_dim=64,
                mask="full", block_m=128, block_n=128)
    s = build_schedule("shift", p, 2)
    assert [(t.m_block, t.dq_rank) for w in s.workers for t in w] == [(0, 0), (1, 1), (1, 0),
                                                                       (0, 1)]
    ready = [0, 100, 10, 120]
    acquired = [0, 400, 10, 130]   # worker 0's second task waited 300 ns for worker 1's add
    landed = [50, 450, 60, 180]
    h = handoffs(timed_trace(s, ready, acquired, landed, base), offsets_of(s))
    assert h.ready.tolist() == ready and h.landed.tolist() == landed
    assert h.worker.tolist() == [0, 0, 1, 1]
    assert h.first.tolist() == [True, False, True, False]
    assert h.previous.tolist() == [-1, 2, -1, 0]
    sm = summarize(h)
    assert sm.span_ns == 450
    assert sm.cadence["mean"] == pytest.approx((100 + 110) / 2)
    assert sm.wait["mean"] == pytest.approx(310 / 4)
    assert sm.waited_share == pytest.approx(0.25)  # only the 300 ns wait is over 200
    assert sm.release_to_acquire["p50"] == 400 - 60  # worker 1's first add landed at 60
    assert sm.add["mean"] == pytest.approx((50 + 50 + 50 + 50) / 4)
    assert sm.finish_spread_ns == 450 - 180


def test_bad_traces_are_refused():
    with pytest.raises(ValueError, match="trace must be"):
        handoffs(torch.zeros(4, 6, dtype=torch.int32), [0, 4])
    with pytest.raises(ValueError, match="worker_offsets"):
        handoffs(torch.zeros(4, TRACE_COLUMNS, dtype=torch.int32), [0, 3])
