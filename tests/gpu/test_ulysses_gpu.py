"""Context parallelism over heads on one GPU: the per-rank calls of CP 2, 4 and 8 (each rank's
heads over the whole sequence; the all-to-alls are copies of head slices) give the unsharded
call's o, dq, dk and dv bits, for the schedules whose bits do not depend on the workers and for
a shift schedule. tests/test_ulysses.py runs the communication pattern itself on gloo.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_ulysses_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.interfaces.ulysses import whole_call_schedule  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("causal, schedule", [(True, "auto"), (True, "spt"),
                                              (False, "fa3"), (False, "shift")])
def test_per_rank_heads_give_the_unsharded_bits(causal, schedule, seed):
    heads_q, heads_kv = 16, 8
    q = torch.randn(2, 1000, heads_q, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, heads_kv, 128, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)

    # "auto" resolved on the whole problem, as ulysses_attention does from any rank's shard.
    resolved = whole_call_schedule(q, k, 1, causal, True, schedule)

    def call(q, k, v, do):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = dashgen.attention(*leaves, causal=causal, deterministic=True, schedule=resolved)
        return (o.detach(), *torch.autograd.grad(o, leaves, do))

    whole = call(q, k, v, do)
    for ranks in (2, 4, 8):
        shard = 1000 // ranks
        assert whole_call_schedule(q[:, :shard], k[:, :shard], ranks, causal, True,
                                   schedule) == resolved
        per_q, per_kv = heads_q // ranks, heads_kv // ranks
        parts = [call(q[:, :, r * per_q:(r + 1) * per_q].contiguous(),
                      k[:, :, r * per_kv:(r + 1) * per_kv].contiguous(),
                      v[:, :, r * per_kv:(r + 1) * per_kv].contiguous(),
                      do[:, :, r * per_q:(r + 1) * per_q].contiguous()) for r in range(ranks)]
        for i, got in enumerate(zip(*parts)):
            assert torch.equal(torch.cat(got, 2), whole[i]), (ranks, ("o", "dq", "dk", "dv")[i])
