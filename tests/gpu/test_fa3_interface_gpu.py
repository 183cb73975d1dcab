"""FA3's interface over dashgen on an sm_90 GPU, the parts that reshape the call: attention_chunk
(a pack of the chunks) and seqused_q / seqused_k (a pack of used and unused parts). Accuracy
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


def chunk_masked(q, k, v, causal, chunk, scale):
    """FA3's chunk mask (its test_util.construct_chunk_mask) in q's dtype: row i keeps keys
    [p - p % chunk, p - p % chunk + chunk), p = i + seqlen_k - seqlen_q; causal: none after p."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, 2).transpose(1, 2) for t in (k, v))
    scores = (q.transpose(1, 2) @ kt.transpose(-1, -2)) * scale
    p = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    start = p - p % chunk
    keep = (j >= start) & (j < start + chunk)
    if causal:
        keep &= j <= p
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    return (probs.masked_fill(~keep.any(-1, keepdim=True), 0.0) @ vt).transpose(1, 2)


@pytest.mark.parametrize("seqlen_q, seqlen_k, chunk", [(1000, 1000, 256), (700, 1000, 384),
                                                       (513, 513, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_chunk_is_fa3s_chunk_mask_with_gradients(seqlen_q, seqlen_k, chunk, causal,
                                                           seed):
    q = torch.randn(2, seqlen_q, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, seqlen_k, 2, 128, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    do = torch.randn_like(q)
    ours = [grads(lambda *t: fa3.flash_attn_func(*t, causal=causal, attention_chunk=chunk,
                                                 deterministic=True), (q, k, v), do)
            for _ in range(3)]
    assert all(torch.equal(a, b) for r in ours[1:] for a, b in zip(r, ours[0]))
    ref_fn = lambda *t: chunk_masked(*t, causal, chunk, 128 ** -0.5)  # noqa: E731
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
