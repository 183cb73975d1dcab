"""Soft-capping (softcap=) on an sm_90 GPU: FlashAttention's semantics (the scaled scores s become
softcap * tanh(s / softcap) before the softmax), against float64 within 2x PyTorch's own error in
the input dtype, the gradients through the tanh included; bitwise repeats beside a busy stream;
packs give each sequence's bits alone; flash_attn_func's softcap= is attention's.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_softcap_gpu.py -q
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.codegen.variants import HEAD_DIMS  # noqa: E402
from dashgen.schedule.builders import BUILDERS, unsupported_reason  # noqa: E402
from dashgen.runtime.select import problem_for  # noqa: E402

from test_attention_gpu import REPEATS, busy_mismatches, out_and_grads, rel_err  # noqa

pytestmark = pytest.mark.gpu


def capped_attention(q, k, v, causal, scale, softcap):
    """FlashAttention's reference with softcap, in q's dtype, (batch, seqlen, heads, head_dim),
    bottom-right causal; a row that sees no key gives 0."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(group, 2).transpose(1, 2)
    vt = v.repeat_interleave(group, 2).transpose(1, 2)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        i = torch.arange(q.shape[1], device=q.device)[:, None]
        j = torch.arange(k.shape[1], device=q.device)[None, :]
        keep = j <= i + k.shape[1] - q.shape[1]
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, -1).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    else:
        probs = torch.softmax(scores, -1)
    return (probs @ vt).transpose(1, 2)


def inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16,
           spread=3.0):
    """q and k spread out so that many scores reach the cap's bend (tanh far from linear)."""
    make = lambda s, h, std: torch.randn(batch, s, h, head_dim, device="cuda", dtype=dtype) * std
    return (make(seqlen_q, heads_q, spread), make(seqlen_k, heads_kv, spread),
            make(seqlen_k, heads_kv, 1.0), make(seqlen_q, heads_q, 1.0))


def failures(q, k, v, do, causal, softcap, **options) -> list[str]:
    scale = q.shape[-1] ** -0.5
    ref_fn = lambda q, k, v: capped_attention(q, k, v, causal, scale, softcap)
    ref = out_and_grads(ref_fn, *(t.double() for t in (q, k, v)), do.double())
    torch_err = [rel_err(x, r) for x, r in zip(out_and_grads(ref_fn, q, k, v, do), ref)]
    ours = out_and_grads(lambda q, k, v: dashgen.attention(q, k, v, causal=causal,
                                                           softcap=softcap, **options),
                         q, k, v, do)
    bad = []
    for name, x, r, limit in zip(("o", "dq", "dk", "dv"), ours, ref, torch_err):
        err = rel_err(x, r)
        if not (err <= 2 * limit + 1e-6):  # also catches NaN
            bad.append(f"{options} softcap={softcap}: {name} error {err:.3e} > 2 x torch's "
                       f"{limit:.3e}")
    return bad


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(257, 257), (300, 100)],
                         ids=lambda s: str(s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_softcap_matches_float64_under_every_schedule(head_dim, causal, seqlen_q, seqlen_k,
                                                      seed):
    q, k, v, do = inputs(2, seqlen_q, seqlen_k, 8, 2, head_dim)
    problem = problem_for(2, 8, 2, seqlen_q, seqlen_k, head_dim, causal)
    # Every schedule at head_dim 128; at the others what select picks (the same policies run
    # there, in kernels that differ only in their tiles).
    plans = [dict(schedule=name, deterministic=True) for name in BUILDERS
             if head_dim == 128 and unsupported_reason(name, problem) is None]
    plans += [dict(deterministic=True), dict(deterministic=False),
              dict(schedule="auto", deterministic=True, num_workers=7)]
    bad = [msg for cap in (2.0,) for plan in plans
           for msg in failures(q, k, v, do, causal, cap, **plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp16_softcap_matches_float64(causal, seed):
    q, k, v, do = inputs(1, 333, 333, 4, 4, 128, dtype=torch.float16)
    bad = failures(q, k, v, do, causal, 5.0)
    assert not bad, "\n".join(bad)


def test_softcap_zero_is_no_cap_and_a_cap_changes_the_result(seed):
    q, k, v, do = inputs(1, 257, 257, 4, 4, 64)
    run = lambda **kw: out_and_grads(  # noqa: E731
        lambda q, k, v: dashgen.attention(q, k, v, causal=True, deterministic=True, **kw),
        q, k, v, do)
    plain, zero, capped = run(), run(softcap=0.0), run(softcap=1.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, zero))
    assert not torch.equal(plain[0], capped[0])


@pytest.mark.parametrize("causal, schedule", [(True, "spt_listed"), (False, "shift")])
def test_softcap_backward_is_bitwise_reproducible_beside_a_busy_stream(causal, schedule, seed):
    q, k, v, do = (t.requires_grad_(i < 3) for i, t in
                   enumerate(inputs(2, 1000, 1000, 16, 4, 128)))
    o = dashgen.attention(q, k, v, causal=causal, schedule=schedule, deterministic=True,
                          softcap=20.0)
    grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    first = grad()
    mismatches = busy_mismatches(grad, first, REPEATS)
    assert not mismatches, f"{len(mismatches)} of {REPEATS} calls differed: {mismatches[:5]}"


@pytest.mark.parametrize("cap", [10.0, 0.0], ids=["capped", "uncapped"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_soft_capped_pack_gives_each_sequences_bits_alone(causal, head_dim, cap, seed):
    lengths = [1, 300, 0, 129, 700]
    heads_q, heads_kv = 6, 2
    seqs = [inputs(1, n, n, heads_q, heads_kv, head_dim) for n in lengths]
    packed = [torch.cat([s[i][0] for s in seqs]).requires_grad_(i < 3) for i in range(4)]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    o = dashgen.attention_varlen(*packed[:3], cu, cu, max(lengths), max(lengths), causal=causal,
                                 softcap=cap, deterministic=True)
    grads = torch.autograd.grad(o, packed[:3], packed[3])
    start = 0
    for (q, k, v, do), n in zip(seqs, lengths):
        if n:
            alone = out_and_grads(lambda q, k, v: dashgen.attention(
                q, k, v, causal=causal, softcap=cap, deterministic=True), q, k, v, do)
            rows = slice(start, start + n)
            for name, x, y in zip(("o", "dq", "dk", "dv"), (o.detach(), *grads), alone):
                assert torch.equal(x[rows], y[0]), f"{name} of the sequence of {n} tokens"
        start += n


def test_flash_attn_func_softcap_is_attentions(seed):
    q, k, v, do = inputs(2, 257, 257, 8, 2, 128)
    ours = out_and_grads(lambda q, k, v: dashgen.flash_attn_func(
        q, k, v, causal=True, softcap=15.0, deterministic=True), q, k, v, do)
    theirs = out_and_grads(lambda q, k, v: dashgen.attention(
        q, k, v, causal=True, softcap=15.0, deterministic=True), q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert math.isfinite(ours[1].float().norm().item())
