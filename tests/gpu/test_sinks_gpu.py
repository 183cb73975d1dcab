"""Attention sinks (sinks=, GPT-OSS's) on an sm_90 GPU: against GPT-OSS's reference in float64
(the sink logit joins each row's softmax, its column dropped) within 2x PyTorch's own bf16
error, o and every gradient including the sinks'; with a causal mask and a sliding window;
bits across 1,000 repeats beside a busy stream; a tiny GPT-OSS through transformers against its eager
attention.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_sinks_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402

from test_attention_gpu import REPEATS, busy_mismatches, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def gpt_oss_attention(q, k, v, sinks, window, scale, lse=None):
    """GPT-OSS's eager attention in q's dtype, (batch, seqlen, heads, head_dim), with
    FlashAttention's (left, right) window (bottom-right, -1 open); `lse`, a list, receives the
    rows' logsumexp with the sink's term."""
    left, right = window
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, 2)) * scale
    i = torch.arange(q.shape[1], device=q.device)[:, None] + k.shape[1] - q.shape[1]
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    keep = torch.ones_like(i - j, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    sink = sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)
    if lse is not None:
        lse.append(torch.logsumexp(torch.cat([s, sink], -1), -1).detach())
    probs = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.repeat_interleave(group, 2))


def grads(fn, tensors, do):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (255, 0)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sinks_match_gpt_oss_in_float64(head_dim, window, seed):
    q = torch.randn(2, 1000, 8, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)
    sinks = torch.randn(8, device="cuda", dtype=torch.bfloat16) * 2
    scale = head_dim ** -0.5
    ref_fn = lambda q, k, v, s: gpt_oss_attention(q, k, v, s, window, scale)  # noqa: E731
    ref = grads(ref_fn, [t.double() for t in (q, k, v, sinks)], do.double())
    theirs = grads(ref_fn, (q, k, v, sinks), do)
    ours = grads(lambda q, k, v, s: dashgen.attention(q, k, v, window_size=window, sinks=s,
                                                      deterministic=True),
                 (q, k, v, sinks), do)
    for name, x, t, r in zip(("o", "dq", "dk", "dv"), ours, theirs, ref):
        err, limit = rel_err(x, r), rel_err(t, r)
        assert err <= 2 * limit + 1e-6, f"{name}: error {err:.3e} > 2 x {limit:.3e}"
    # dsinks sums one term a row, exp(sink - lse') * rowsum(dO * o'), whose signs cancel (on
    # an H100 its error against the cancelled float64 sum read 2.2x PyTorch's bf16 one at 128,
    # full mask): each head's error is held to two bf16 roundings of its terms' absolute sum.
    lse = []
    gpt_oss_attention(*(t.double() for t in (q, k, v, sinks)), window, scale, lse)
    terms = (torch.exp(sinks.double()[None, :, None] - lse[0])
             * (do.double() * ref[0]).sum(-1).transpose(1, 2)).abs().sum((0, 2))
    err = (ours[4].double() - ref[4]).abs()
    assert (err <= 2 * 2.0 ** -8 * terms).all(), f"dsinks: error {err} against terms {terms}"


def test_sink_gradients_are_bitwise_reproducible_beside_a_busy_stream(seed):
    q = torch.randn(1, 2048, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 2048, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    sinks = torch.randn(16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(1, 2048, 16, 64, device="cuda", dtype=torch.bfloat16)
    o = dashgen.attention(q, k, v, causal=True, window_size=(127, 0), sinks=sinks,
                          deterministic=True)
    grad = lambda: torch.autograd.grad(o, (q, k, v, sinks), do, retain_graph=True)  # noqa
    first = grad()
    mismatches = busy_mismatches(grad, first, REPEATS)
    assert not mismatches, f"{len(mismatches)} of {REPEATS} calls differed: {mismatches[:5]}"


def test_a_gpt_oss_runs_on_dashgen_like_its_eager_attention(seed):
    transformers = pytest.importorskip("transformers")
    from dashgen.interfaces import transformers as hf
    hf.register()
    config = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=256,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000,
                  num_local_experts=4, num_experts_per_tok=2, sliding_window=128,
                  layer_types=["sliding_attention", "full_attention"])
    ours = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        attn_implementation="dashgen", **config)).to("cuda", torch.bfloat16).eval()
    # Sinks away from zero, so that a lost sink would show in the logits.
    with torch.no_grad():
        for layer in ours.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    eager = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        attn_implementation="eager", **config)).to("cuda", torch.bfloat16).eval()
    eager.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 1000, (2, 512), device="cuda")
    with torch.no_grad():
        a, b = ours(ids, use_cache=False).logits, eager(ids, use_cache=False).logits
    assert torch.isfinite(a).all() and rel_err(a, b.double()) < 5e-2


def test_a_pack_with_sinks_gives_each_sequence_its_bits_alone(seed):
    """attention_varlen(sinks=...): each sequence's o, dq, dk, dv the bits dashgen.attention
    gives it alone with the same sinks; the sinks' gradient the sum of the sequences' alone
    (within float32 summation order, not bitwise: one reduction over the pack)."""
    lengths = [1, 300, 0, 129, 700]
    heads_q, heads_kv, head_dim = 8, 2, 64
    make = lambda n, h: torch.randn(n, h, head_dim, device="cuda", dtype=torch.bfloat16)  # noqa
    q, do = make(sum(lengths), heads_q), make(sum(lengths), heads_q)
    k, v = make(sum(lengths), heads_kv), make(sum(lengths), heads_kv)
    sinks = torch.randn(heads_q, device="cuda", dtype=torch.float32)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    o = dashgen.attention_varlen(*leaves[:3], cu, cu, max(lengths), max(lengths), causal=True,
                                 sinks=leaves[3], deterministic=True)
    packed = (o.detach(), *torch.autograd.grad(o, leaves, do))
    start, dsinks = 0, torch.zeros_like(sinks)
    for n in lengths:
        if n:
            rows = slice(start, start + n)
            alone = grads(lambda q, k, v, s: dashgen.attention(
                q, k, v, causal=True, sinks=s, deterministic=True),
                (q[None, rows], k[None, rows], v[None, rows], sinks), do[None, rows])
            for name, x, y in zip(("o", "dq", "dk", "dv"), packed, alone):
                assert torch.equal(x[rows], y[0]), f"{name} of the sequence of {n} tokens"
            dsinks += alone[4]
        start += n
    assert torch.allclose(packed[4], dsinks, rtol=1e-5, atol=1e-5)
