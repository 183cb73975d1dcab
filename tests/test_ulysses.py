"""Context parallelism over heads (dashgen.interfaces.ulysses) on the CPU: gloo processes run the
communication pattern with a float64 attention in place of the kernels, and every rank's o and
the gradients of q, k, v, gathered, must be the unsharded call's bits. The kernels' own part of
the contract (a head's bits do not depend on the other heads) is tests/gpu's."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dashgen.interfaces.ulysses import ulysses_attention, ulysses_attention_varlen


def reference(q, k, v, *, causal, softmax_scale=None, deterministic=None, schedule="auto"):
    """float64 attention, one head at a time (so a head's bits cannot depend on the others),
    bottom-right causal, GQA by contiguous groups as dashgen maps query heads to KV heads."""
    batch, seqlen_q, heads_q, d = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    i = torch.arange(seqlen_q)[:, None]
    j = torch.arange(seqlen_k)[None]
    outs = []
    for h in range(heads_q):
        kh, vh = k[:, :, h // (heads_q // heads_kv)], v[:, :, h // (heads_q // heads_kv)]
        s = torch.einsum("bqd,bkd->bqk", q[:, :, h], kh) * scale
        if causal:
            s = s.masked_fill(~(j <= i + seqlen_k - seqlen_q), float("-inf"))
        outs.append(torch.einsum("bqk,bkd->bqd", torch.softmax(s, -1), vh))
    return torch.stack(outs, 2)


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale=None,
                     deterministic=None, schedule="auto"):
    """reference over each sequence of a pack alone (empty sequences give no rows)."""
    parts = []
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.stop > qs.start:
            parts.append(reference(q[None, qs], k[None, ks], v[None, ks], causal=causal)[0])
    return torch.cat(parts)


def inputs(batch, seqlen, heads_q, heads_kv, d):
    g = torch.Generator().manual_seed(7)
    make = lambda heads: torch.randn(batch, seqlen, heads, d, generator=g,  # noqa: E731
                                     dtype=torch.float64)
    return make(heads_q), make(heads_kv), make(heads_kv), make(heads_q)


def save_gathered(rank, ranks, tensors, dim, out):
    """Every rank's shares of `tensors`, concatenated along the token dimension `dim`, saved by
    rank 0 for the test process to compare."""
    gathered = []
    for t in tensors:
        parts = [torch.empty_like(t) for _ in range(ranks)]
        dist.all_gather(parts, t.contiguous())
        gathered.append(torch.cat(parts, dim))
    if rank == 0:
        torch.save(gathered, out)


def _rank(rank, ranks, init, shape, causal, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ranks)
    try:
        q, k, v, do = inputs(*shape)
        shard = shape[1] // ranks
        mine = slice(rank * shard, (rank + 1) * shard)
        qs, ks, vs = (t[:, mine].clone().requires_grad_() for t in (q, k, v))
        o = ulysses_attention(qs, ks, vs, causal=causal, attention=reference)
        o.backward(do[:, mine])
        save_gathered(rank, ranks, (o.detach(), qs.grad, ks.grad, vs.grad), 1, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_rank_count_gives_the_unsharded_bits(tmp_path, ranks, causal):
    shape = (2, 16, 8, 4, 8)  # batch, seqlen, heads_q, heads_kv (GQA 2), head_dim
    out = tmp_path / "gathered.pt"
    mp.spawn(_rank, args=(ranks, f"file://{tmp_path / 'init'}", shape, causal, str(out)),
             nprocs=ranks, join=True)
    o, dq, dk, dv = torch.load(out)
    q, k, v, do = inputs(*shape)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    ref = reference(qg, kg, vg, causal=causal)
    ref.backward(do)
    for got, want in ((o, ref.detach()), (dq, qg.grad), (dk, kg.grad), (dv, vg.grad)):
        assert torch.equal(got, want)


def test_heads_must_divide_over_the_ranks(tmp_path):
    # One rank's group is enough to reach the checks.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        q = torch.zeros(1, 4, 6, 8)
        with pytest.raises(TypeError, match="^k must be a torch.Tensor"):
            ulysses_attention(q, None, q, attention=reference)
        with pytest.raises(ValueError, match=r"^q must be 4-d"):
            ulysses_attention(q[0], q, q, attention=reference)
        o = ulysses_attention(q, q, q, attention=reference)  # one rank: the plain call
        assert torch.equal(o, reference(q, q, q, causal=False))
    finally:
        dist.destroy_process_group()


def test_each_rank_takes_whole_heads():
    from dashgen.interfaces.ulysses import _check
    q, kv = torch.zeros(1, 4, 8, 8), torch.zeros(1, 4, 6, 8)
    with pytest.raises(ValueError, match=r"^heads_kv=6 must be a multiple of the group's 4 ranks"):
        _check(q, kv, kv, 4)
    with pytest.raises(ValueError, match=r"^heads_q=8 must be a multiple of the group's 3 ranks"):
        _check(q, kv, kv, 3)
    _check(q, kv, kv, 2)


def test_auto_is_resolved_on_the_whole_problem(monkeypatch):
    from types import SimpleNamespace

    from dashgen.interfaces.ulysses import whole_call_schedule
    from dashgen.runtime.select import problem_for, resolve_schedule
    import dashgen
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(multi_processor_count=132))
    try:
        for seqlen, causal in ((8192, False), (32768, True), (65536, True)):
            whole = problem_for(1, 16, 8, seqlen, seqlen, 128, causal)
            want = resolve_schedule(whole, "auto", None, 132, True)[0]
            for ranks in (2, 4, 8):
                shard = torch.empty(1, seqlen // ranks, 16, 128, device="meta",
                                    dtype=torch.bfloat16)
                kv = torch.empty(1, seqlen // ranks, 8, 128, device="meta",
                                 dtype=torch.bfloat16)
                assert whole_call_schedule(shard, kv, ranks, causal, True, "auto") == want
        assert whole_call_schedule(shard, kv, 8, True, True, "fa3") == "fa3"
        # A dtype the kernels lack is left for dashgen.attention to refuse by name.
        assert whole_call_schedule(shard.float(), kv, 8, True, True, "auto") == "auto"
    finally:
        dashgen.clear_caches()  # the memos hold the faked SM count's answers


PACK = [5, 0, 9, 2]  # 16 tokens: a sequence straddles the ranks' shares at 2 and 4 ranks


def _rank_varlen(rank, ranks, init, causal, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ranks)
    try:
        q, k, v, do = (t[0] for t in inputs(1, sum(PACK), 8, 4, 8))
        cu = torch.tensor([0, *torch.tensor(PACK).cumsum(0).tolist()], dtype=torch.int32)
        share = sum(PACK) // ranks
        mine = slice(rank * share, (rank + 1) * share)
        qs, ks, vs = (t[mine].clone().requires_grad_() for t in (q, k, v))
        o = ulysses_attention_varlen(qs, ks, vs, cu, cu, max(PACK), max(PACK), causal=causal,
                                     attention=reference_varlen)
        o.backward(do[mine])
        save_gathered(rank, ranks, (o.detach(), qs.grad, ks.grad, vs.grad), 0, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_pack_over_the_ranks_gives_the_unsharded_bits(tmp_path, ranks, causal):
    out = tmp_path / "gathered.pt"
    mp.spawn(_rank_varlen, args=(ranks, f"file://{tmp_path / 'init'}", causal, str(out)),
             nprocs=ranks, join=True)
    o, dq, dk, dv = torch.load(out)
    q, k, v, do = (t[0] for t in inputs(1, sum(PACK), 8, 4, 8))
    cu = torch.tensor([0, *torch.tensor(PACK).cumsum(0).tolist()], dtype=torch.int32)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    ref = reference_varlen(qg, kg, vg, cu, cu, max(PACK), max(PACK), causal=causal)
    ref.backward(do)
    for got, want in ((o, ref.detach()), (dq, qg.grad), (dk, kg.grad), (dv, vg.grad)):
        assert torch.equal(got, want)
