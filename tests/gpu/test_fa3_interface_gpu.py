"""FA3's interface over dashgen on an sm_90 GPU, the parts that reshape the call: attention_chunk
(a pack of the chunks), seqused_q / seqused_k (a pack of used and unused parts),
flash_attn_qkvpacked_func (q, k and v taken apart from one tensor) and head dims without a
kernel of their own (zero-padded into the next served one). Accuracy
against float64 within 2x PyTorch's own bf16 error, gradients included; bits across repeats; a
used token's bits are those of its used sequence run alone.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_fa3_interface_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.interfaces import flash_attn_interface as fa3  # noqa: E402

pytestmark = pytest.mark.gpu


def grads(fn, tensors, do):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


def rel_err(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def chunk_masked(q, k, v, causal, chunk, scale, window=(-1, -1), sinks=None):
    """FA3's chunk mask (its hopper/mask.h) in q's dtype: row i keeps keys [p - p % chunk,
    p - p % chunk + chunk), p = i + seqlen_k - seqlen_q (floor division: none where p < 0);
    causal: none after p; window (left, right): p - left .. p + right; sinks: one logit per
    query head in each row's denominator."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, 2).transpose(1, 2) for t in (k, v))
    scores = (q.transpose(1, 2) @ kt.transpose(-1, -2)) * scale
    p = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    start = torch.div(p, chunk, rounding_mode="floor") * chunk
    keep = (j >= start) & (j < start + chunk)
    left, right = window[0], 0 if causal else window[1]
    if left >= 0:
        keep &= j >= p - left
    if right >= 0:
        keep &= j <= p + right
    scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat((scores, sink), -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    return (probs.masked_fill(~keep.any(-1, keepdim=True), 0.0) @ vt).transpose(1, 2)


@pytest.mark.parametrize("seqlen_q, seqlen_k, chunk", [(1000, 1000, 256), (700, 1000, 384),
                                                       (513, 513, 128), (1000, 600, 256)],
                         ids=str)
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (100, 50)), (True, (127, -1))], ids=str)
def test_attention_chunk_is_fa3s_chunk_mask_with_gradients(seqlen_q, seqlen_k, chunk, causal,
                                                           window, seed):
    q = torch.randn(2, seqlen_q, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, seqlen_k, 2, 128, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)
    ours = [grads(lambda *t: fa3.flash_attn_func(*t, causal=causal, window_size=window,
                                                 attention_chunk=chunk, deterministic=True),
                  (q, k, v), do)
            for _ in range(3)]
    assert all(torch.equal(a, b) for r in ours[1:] for a, b in zip(r, ours[0]))
    ref_fn = lambda *t: chunk_masked(*t, causal, chunk, 128 ** -0.5, window)  # noqa: E731
    ref = grads(ref_fn, [t.double() for t in (q, k, v)], do.double())
    theirs = grads(ref_fn, (q, k, v), do)
    for name, x, t, r in zip(("o", "dq", "dk", "dv"), ours[0], theirs, ref):
        err, limit = rel_err(x, r), rel_err(t, r)
        assert err <= 2 * limit + 1e-6, f"{name}: error {err:.3e} > 2 x {limit:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqused_tokens_have_their_used_sequences_bits(causal, seed):
    lengths_q, lengths_k = [300, 0, 513, 200, 64], [300, 128, 513, 257, 64]
    used_q, used_k = [200, 0, 513, 1, 64], [300, 100, 77, 257, 0]
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32,
                                device="cuda")
    i32 = lambda n: torch.tensor(n, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, 128, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)
    call = lambda *t: fa3.flash_attn_varlen_func(  # noqa: E731
        *t, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k), seqused_q=i32(used_q),
        seqused_k=i32(used_k), causal=causal, deterministic=True)
    o, dq, dk, dv = grads(call, (q, k, v), do)
    again = grads(call, (q, k, v), do)
    assert all(torch.equal(a, b) for a, b in zip((o, dq, dk, dv), again))
    # The used tokens alone, packed without the unused ones.
    pick = lambda t, lengths, used: torch.cat(  # noqa: E731
        [t[s:s + u] for s, u in zip(cu(lengths).tolist(), used)])
    alone = grads(lambda *t: dashgen.attention_varlen(
        *t, cu(used_q), cu(used_k), max(used_q), max(used_k), causal=causal, deterministic=True),
        (pick(q, lengths_q, used_q), pick(k, lengths_k, used_k), pick(v, lengths_k, used_k)),
        pick(do, lengths_q, used_q))
    assert torch.equal(pick(o, lengths_q, used_q), alone[0])
    assert torch.equal(pick(dq, lengths_q, used_q), alone[1])
    assert torch.equal(pick(dk, lengths_k, used_k), alone[2])
    assert torch.equal(pick(dv, lengths_k, used_k), alone[3])
    unused = lambda t, lengths, used: torch.cat(  # noqa: E731
        [t[s + u:s + n] for s, u, n in zip(cu(lengths).tolist(), used, lengths)])
    for t, lengths, used in ((o, lengths_q, used_q), (dq, lengths_q, used_q),
                             (dk, lengths_k, used_k), (dv, lengths_k, used_k)):
        rest = unused(t, lengths, used)
        assert rest.numel() and torch.equal(rest, torch.zeros_like(rest))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_packs_chunks_have_each_sequences_bits_alone(causal, seed):
    """flash_attn_varlen_func's attention_chunk (with sinks and a window): each sequence's o and
    gradients are bitwise those of flash_attn_func's chunked call on it alone, and within 2x
    PyTorch's bf16 error of the float64 chunk mask."""
    lengths_q, lengths_k, chunk = [700, 1, 513, 300], [700, 300, 513, 900], 256
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32,
                                device="cuda")
    q = torch.randn(sum(lengths_q), 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, 128, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    sinks = torch.randn(8, device="cuda")
    do = torch.randn_like(q)
    options = dict(causal=causal, window_size=(200, 100), attention_chunk=chunk,
                   deterministic=True, learnable_sink=sinks)
    packed = grads(lambda *t: fa3.flash_attn_varlen_func(
        *t, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k), **options),
        (q, k, v), do)
    q0 = k0 = 0
    for lq, lk in zip(lengths_q, lengths_k):
        piece = lambda t, a, n: t[a:a + n][None]  # noqa: E731
        alone = grads(lambda *t: fa3.flash_attn_func(*t, **options),
                      (piece(q, q0, lq), piece(k, k0, lk), piece(v, k0, lk)), piece(do, q0, lq))
        for name, x, y, a, n in (("o", packed[0], alone[0], q0, lq),
                                 ("dq", packed[1], alone[1], q0, lq),
                                 ("dk", packed[2], alone[2], k0, lk),
                                 ("dv", packed[3], alone[3], k0, lk)):
            assert torch.equal(x[a:a + n], y[0]), f"{name} of sequence ({lq}, {lk})"
        ref_fn = lambda *t: chunk_masked(*t, causal, chunk, 128 ** -0.5, (200, 100),  # noqa
                                         sinks)
        args = (piece(q, q0, lq), piece(k, k0, lk), piece(v, k0, lk))
        ref = grads(ref_fn, [t.double() for t in args], piece(do, q0, lq).double())
        theirs = grads(ref_fn, args, piece(do, q0, lq))
        for name, x, t, r in zip(("o", "dq", "dk", "dv"), alone, theirs, ref):
            err, limit = rel_err(x, r), rel_err(t, r)
            assert err <= 2 * limit + 1e-6, f"{name}: error {err:.3e} > 2 x {limit:.3e}"
        q0, k0 = q0 + lq, k0 + lk


@pytest.mark.parametrize("num_heads_q", [None, 8], ids=["stacked", "gqa-heads"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked_has_flash_attn_funcs_bits(causal, num_heads_q):
    """flash_attn_qkvpacked_func, deterministic: o and dqkv bitwise flash_attn_func's o, dq,
    dk, dv on the same q, k and v, in qkv's layout (stacked, or query, key and value heads
    along one dim under GQA)."""
    torch.manual_seed(3 + causal)
    heads = (3, 8) if num_heads_q is None else (8 + 2 * 2,)
    qkv = torch.randn(2, 777, *heads, 128, device="cuda", dtype=torch.bfloat16)
    parts = ((lambda t: t.unbind(2)) if num_heads_q is None else
             (lambda t: t.split([8, 2, 2], 2)))
    do = torch.randn(2, 777, 8, 128, device="cuda", dtype=torch.bfloat16)
    packed = qkv.clone().requires_grad_()
    o = fa3.flash_attn_qkvpacked_func(packed, causal=causal, deterministic=True,
                                      num_heads_q=num_heads_q)
    (dqkv,) = torch.autograd.grad(o, packed, do)
    ref = grads(lambda q, k, v: fa3.flash_attn_func(q, k, v, causal=causal, deterministic=True),
                parts(qkv), do)
    assert torch.equal(o, ref[0])
    for got, want in zip(parts(dqkv), ref[1:]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("head_dim, causal", [(40, True), (72, False), (160, True), (224, False)])
def test_a_head_dim_without_a_kernel_runs_padded(head_dim, causal, seed):
    """FA3 takes any head_dim up to 256; dashgen pads one it has no kernel of into the next
    served one (run_padded): against float64 within 2x PyTorch's own bf16 error, gradients at
    the inputs' width, bits across repeats."""
    q = torch.randn(2, 700, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 700, 2, head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)
    ours = [grads(lambda *t: fa3.flash_attn_func(*t, causal=causal, deterministic=True),
                  (q, k, v), do)
            for _ in range(3)]
    assert all(torch.equal(a, b) for r in ours[1:] for a, b in zip(r, ours[0]))
    assert [t.shape[-1] for t in ours[0]] == [head_dim] * 4
    ref_fn = lambda *t: chunk_masked(*t, causal, 1 << 30, head_dim ** -0.5)  # noqa: E731
    ref = grads(ref_fn, [t.double() for t in (q, k, v)], do.double())
    theirs = grads(ref_fn, (q, k, v), do)
    for name, x, t, r in zip(("o", "dq", "dk", "dv"), ours[0], theirs, ref):
        err, limit = rel_err(x, r), rel_err(t, r)
        assert err <= 2 * limit + 1e-6, f"{name}: error {err:.3e} > 2 x {limit:.3e}"
