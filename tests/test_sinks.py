"""Attention sinks (dashgen/runtime/sinks.py) on the CPU: the rescaled forward and the
kernels' backward handed o' and lse' give the sunk attention's output and every gradient, the
sinks' included, against autograd of GPT-OSS's reference in float64 (the kernels stand in as
exact float64 attention with FlashAttention's backward from o and lse); and dashgen.attention
checks sinks and routes them."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.runtime import op  # noqa: E402
from dashgen.runtime.sinks import SinkAttention, check_sinks  # noqa: E402

from test_op_errors import cpu_leaves, h200, kernels, on_cpu  # noqa: E402,F401


def mask(seqlen_q, seqlen_k, window):
    """FlashAttention's (left, right) window, bottom-right, -1 open: the kept pairs."""
    left, right = window
    i = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k)[None, :]
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def scores(q, k, scale, keep):
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, 2)) * scale
    return s.masked_fill(~keep, float("-inf"))


def kernel_forward(q, k, v, scale, keep):
    """What the forward kernel returns: o (rows without a key 0) and lse (-inf there)."""
    group = q.shape[2] // k.shape[2]
    s = scores(q, k, scale, keep)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(group, 2)), lse


def kernel_backward(do, q, k, v, o, lse, scale, keep):
    """FlashAttention's backward from o and lse: P = exp(S - lse), D = rowsum(dO * o)."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    p = torch.exp(scores(q, k, scale, keep) - lse[..., None]).nan_to_num(0.0)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
    d = (do * o).sum(-1).transpose(1, 2)[..., None]
    ds = p * (dp - d)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    fold = lambda t: t.view(*t.shape[:2], k.shape[2], group, t.shape[-1]).sum(3)  # noqa: E731
    return dq, fold(dk), fold(dv)


def gpt_oss_reference(q, k, v, sinks, scale, keep):
    """GPT-OSS's eager attention: the sink logit joins each row's scores, the softmax runs
    over both, the sink's column is dropped."""
    group = q.shape[2] // k.shape[2]
    s = scores(q, k, scale, keep)
    sink = sinks[None, :, None, None].expand(*s.shape[:3], 1)
    probs = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.repeat_interleave(group, 2))


@pytest.mark.parametrize("seqlen_q, seqlen_k, window", [
    (37, 37, (-1, 0)), (20, 45, (-1, -1)), (45, 20, (-1, 0)), (40, 40, (5, 0)), (30, 50, (3, 7))])
def test_sunk_attention_is_gpt_oss_attention_with_every_gradient(seqlen_q, seqlen_k, window):
    g = torch.Generator().manual_seed(seqlen_q * 100 + seqlen_k)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g)  # noqa: E731
    q, k, v = make(2, seqlen_q, 4, 8), make(2, seqlen_k, 2, 8), make(2, seqlen_k, 2, 8)
    sinks, do = make(4) * 2, make(2, seqlen_q, 4, 8)
    scale, keep = 0.35, mask(seqlen_q, seqlen_k, window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = SinkAttention.apply(
        *leaves, lambda q, k, v: kernel_forward(q, k, v, scale, keep),
        lambda do, q, k, v, o, lse: kernel_backward(do, q, k, v, o, lse, scale, keep))
    ours = (o.detach(), *torch.autograd.grad(o, leaves, do))
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    ref_o = gpt_oss_reference(*ref_leaves, scale, keep)
    ref = (ref_o.detach(), *torch.autograd.grad(ref_o, ref_leaves, do))
    for name, x, r in zip(("o", "dq", "dk", "dv", "dsinks"), ours, ref):
        assert torch.allclose(x, r, atol=1e-10, rtol=1e-9), name
    # lse is the sunk rows' logsumexp (the sink's term included).
    s = scores(q, k, scale, keep)
    sink = sinks[None, :, None, None].expand(*s.shape[:3], 1)
    assert torch.allclose(lse, torch.logsumexp(torch.cat([s, sink], -1), -1), atol=1e-12)


def test_a_sink_of_minus_infinity_is_no_sink_and_empty_rows_stay_zero():
    g = torch.Generator().manual_seed(5)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g)  # noqa: E731
    q, k, v, do = make(1, 30, 2, 8), make(1, 10, 2, 8), make(1, 10, 2, 8), make(1, 30, 2, 8)
    keep = mask(30, 10, (-1, 0))  # the first 20 rows see no key
    sinks = torch.tensor([float("-inf"), 1.0], dtype=torch.float64)
    fwd = lambda q, k, v: kernel_forward(q, k, v, 0.3, keep)  # noqa: E731
    bwd = lambda do, q, k, v, o, lse: kernel_backward(do, q, k, v, o, lse, 0.3, keep)  # noqa
    o, lse = SinkAttention.apply(q, k, v, sinks, fwd, bwd)
    plain_o, plain_lse = fwd(q, k, v)
    assert torch.equal(o[:, :, 0], plain_o[:, :, 0]) and torch.equal(lse[:, 0], plain_lse[:, 0])
    assert torch.equal(o[:, :20], torch.zeros_like(o[:, :20]))
    assert torch.isneginf(lse[:, 0, :20]).all() and (lse[:, 1, :20] == 1.0).all()


@pytest.mark.parametrize("sinks, error, pattern", [
    ([0.0] * 8, TypeError, r"^sinks must be a tensor of one logit per query head, got list$"),
    (torch.zeros(8, dtype=torch.int32), TypeError, r"^sinks must be a floating tensor"),
    (torch.zeros(4), ValueError, r"^sinks must have shape \(8,\), one logit per query head, "
                                 r"got \(4,\)$"),
])
def test_bad_sinks_are_named(sinks, error, pattern):
    q = torch.zeros(1, 4, 8, 16)
    with pytest.raises(error, match=pattern):
        check_sinks(sinks, q)


def test_attention_routes_sinks_through_the_kernels(on_cpu, kernels):
    """dashgen.attention(sinks=...): the kernels' forward once, their backward handed the
    rescaled o and lse, and a gradient for the sinks."""
    q, k, v = cpu_leaves()
    sinks = torch.zeros(q.shape[2], requires_grad=True)
    o, lse = op.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert o.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    o.sum().backward()
    names = [name for name, _ in kernels.calls]
    assert names == ["forward", "backward"]
    assert sinks.grad is not None and sinks.grad.shape == sinks.shape
    with pytest.raises(ValueError, match=r"^sinks must have shape"):
        op.attention(q, k, v, sinks=torch.zeros(3))


def test_a_packs_sinks_follow_each_sequence(monkeypatch):
    """attention_varlen(sinks=...) through its layout (the pack as a batch of one, lse by head,
    the kernels' per-sequence lse blocks restored for their backward): o and every gradient
    equal GPT-OSS's reference run on each sequence alone, in float64 (the packed kernels
    standing in as exact attention per sequence, causal)."""
    from types import SimpleNamespace
    from dashgen.runtime import op_varlen
    lengths_q, lengths_k = [5, 0, 17, 9], [7, 3, 17, 4]
    heads_q, heads_kv, dim, scale = 4, 2, 8, 0.4
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist())  # noqa: E731
    cu_q, cu_k = cu(lengths_q), cu(lengths_k)

    def spans():
        for b, (nq, nk) in enumerate(zip(lengths_q, lengths_k)):
            yield b, slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))

    def packed_forward(q, k, v, *rest):
        o = torch.zeros_like(q)
        lse = torch.full((heads_q * q.shape[0],), float("-inf"), dtype=q.dtype)
        for b, rq, rk in spans():
            nq = rq.stop - rq.start
            if nq == 0 or rk.stop == rk.start:
                continue
            ob, lb = kernel_forward(q[None, rq], k[None, rk], v[None, rk], scale,
                                    mask(nq, rk.stop - rk.start, (-1, 0)))
            o[rq] = ob[0]
            lse[heads_q * rq.start:heads_q * rq.stop] = lb[0].flatten()
        return o, lse

    def packed_backward(do, q, k, v, o, lse, *rest):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for b, rq, rk in spans():
            nq, nk = rq.stop - rq.start, rk.stop - rk.start
            if nq == 0 or nk == 0:
                continue
            lb = lse[heads_q * rq.start:heads_q * rq.stop].view(1, heads_q, nq)
            g = kernel_backward(do[None, rq], q[None, rq], k[None, rk], v[None, rk], o[None, rq],
                                lb, scale, mask(nq, nk, (-1, 0)))
            dq[rq], dk[rk], dv[rk] = g[0][0], g[1][0], g[2][0]
        return dq, dk, dv

    monkeypatch.setattr(op_varlen, "_eager_forward", lambda q, k, v, *rest: packed_forward(q, k, v))
    monkeypatch.setattr(op_varlen, "_run_backward", packed_backward)
    g = torch.Generator().manual_seed(11)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g)  # noqa: E731
    q, do = make(sum(lengths_q), heads_q, dim), make(sum(lengths_q), heads_q, dim)
    k, v = make(sum(lengths_k), heads_kv, dim), make(sum(lengths_k), heads_kv, dim)
    sinks = make(heads_q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    entry = SimpleNamespace(options=None)
    o, lse = op_varlen._sunk_varlen(*leaves[:3], cu_q, cu_k, 17, 17, leaves[3], entry)
    ours = (o.detach(), *torch.autograd.grad(o, leaves, do))
    want = [torch.zeros_like(t) for t in (q, q, k, v)] + [torch.zeros_like(sinks)]
    for b, rq, rk in spans():
        nq, nk = rq.stop - rq.start, rk.stop - rk.start
        if nq == 0:
            continue
        ref_leaves = [t.clone().requires_grad_() for t in (q[None, rq], k[None, rk], v[None, rk],
                                                            sinks)]
        ref_o = gpt_oss_reference(*ref_leaves, scale, mask(nq, nk, (-1, 0)))
        grads = torch.autograd.grad(ref_o, ref_leaves, do[None, rq])
        want[0][rq], want[1][rq] = ref_o.detach()[0], grads[0][0]
        want[2][rk], want[3][rk] = grads[1][0], grads[2][0]
        want[4] += grads[3]
    for name, x, r in zip(("o", "dq", "dk", "dv", "dsinks"), ours, want):
        assert torch.allclose(x, r, atol=1e-10, rtol=1e-9), name
    assert lse.shape == (heads_q, sum(lengths_q))
