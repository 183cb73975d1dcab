"""Chunked attention (dashgen/runtime/chunks.py): a sequence's chunks as a pack give exactly
FlashAttention-3's chunk mask (hopper/mask.h: row i keeps keys [p - p % C, p - p % C + C), p =
i + seqlen_k - seqlen_q, floor division, intersected with the window or causal mask), for fixed
lengths and packs, seqlen_q above or below seqlen_k; and dashgen.attention / attention_varlen /
FA3's interface with attention_chunk compute it forward and backward, here through a float64
reference in place of the kernels (the runtime faked as in test_varlen)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dashgen  # noqa: E402
from dashgen.caches import clear_caches  # noqa: E402
from dashgen.interfaces import flash_attn_interface as fa3  # noqa: E402
from dashgen.runtime import op_varlen  # noqa: E402
from dashgen.runtime.chunks import chunk_pack, chunk_varlen_pack  # noqa: E402
from test_op_errors import cpu_leaves, h200, on_cpu  # noqa: E402,F401  (fixtures by name)
from test_varlen import FakePackRuntime  # noqa: E402

BF16 = torch.bfloat16


def window_keep(p, j, causal, window):
    """FlashAttention's window (or causal) rule at bottom-right positions p and keys j."""
    left, right = window
    right = 0 if causal else right
    keep = torch.ones(p.shape[0], j.shape[1], dtype=torch.bool)
    if left >= 0:
        keep &= j >= p - left
    if right >= 0:
        keep &= j <= p + right
    return keep


def fa3_mask(lengths_q, lengths_k, chunk, causal, window):
    """FA3's chunked mask over a pack's tokens (block-diagonal over its sequences)."""
    mask = torch.zeros(sum(lengths_q), sum(lengths_k), dtype=torch.bool)
    q0 = k0 = 0
    for lq, lk in zip(lengths_q, lengths_k):
        p = torch.arange(lq)[:, None] + lk - lq
        j = torch.arange(lk)[None, :]
        start = torch.div(p, chunk, rounding_mode="floor") * chunk
        keep = (j >= start) & (j < start + chunk) & window_keep(p, j, causal, window)
        mask[q0:q0 + lq, k0:k0 + lk] = keep
        q0, k0 = q0 + lq, k0 + lk
    return mask


def pack_mask(cu_q, cu_k, causal, window):
    """The mask dashgen's packed kernels apply to a pack: each sequence alone, bottom-right."""
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    mask = torch.zeros(cu_q[-1], cu_k[-1], dtype=torch.bool)
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        assert q1 >= q0 and k1 >= k0, "offsets must not fall"
        p = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        j = torch.arange(k1 - k0)[None, :]
        mask[q0:q1, k0:k1] = window_keep(p, j, causal, window)
    return mask


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist(),
                        dtype=torch.int32)


windows = st.sampled_from([(-1, -1), (0, 0), (3, 0), (5, 2), (-1, 4), (9, -1), (40, 40)])


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1,
                        max_size=5),
       chunk=st.integers(1, 17), causal=st.booleans(), window=windows)
def test_a_packs_chunks_are_fa3s_chunk_mask(lengths, chunk, causal, window):
    lengths_q, lengths_k = [a for a, _ in lengths], [b for _, b in lengths]
    max_q, max_k = max(lengths_q), max(lengths_k)
    cu_q, cu_k, chunk_q, chunk_k = chunk_varlen_pack(cu_of(lengths_q), cu_of(lengths_k), max_q,
                                                     max_k, chunk)
    assert torch.equal(pack_mask(cu_q, cu_k, causal, window),
                       fa3_mask(lengths_q, lengths_k, chunk, causal, window))
    # The maxima bound every sequence, and no sequence is longer than the chunk.
    assert int(cu_q.diff().max()) <= chunk_q <= chunk and int(cu_k.diff().max()) <= chunk_k
    assert cu_q[-1] == sum(lengths_q) and cu_k[-1] == sum(lengths_k)


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(1, 3), seqlen_q=st.integers(1, 50), seqlen_k=st.integers(1, 50),
       chunk=st.integers(1, 20), causal=st.booleans(), window=windows)
def test_a_batchs_chunks_are_fa3s_chunk_mask(batch, seqlen_q, seqlen_k, chunk, causal, window):
    cu_q, cu_k, max_q, max_k = chunk_pack(batch, seqlen_q, seqlen_k, chunk)
    assert torch.equal(pack_mask(cu_q, cu_k, causal, window),
                       fa3_mask([seqlen_q] * batch, [seqlen_k] * batch, chunk, causal, window))
    assert int(cu_q.diff().max()) <= max_q <= min(chunk, seqlen_q)
    assert int(cu_k.diff().max()) == max_k == min(chunk, seqlen_k)
    # Leading sequences only where rows see no key: ceil(seqlen_k / chunk) chunks otherwise.
    lead = -(-max(seqlen_q - seqlen_k, 0) // chunk)
    assert cu_q.numel() - 1 == batch * (lead + max(-(-seqlen_k // chunk), 1))


def test_the_chunk_count_is_bounded_by_name():
    with pytest.raises(ValueError, match=r"^attention_chunk=1: the call's 80000 chunks \(with "
                                         r"the rows before the first key\) exceed the 65535"):
        chunk_pack(2, 40000, 40000, 1)
    with pytest.raises(ValueError, match=r"^attention_chunk must be a non-negative int, got "
                                         r"-3$"):
        dashgen.attention(*cpu_leaves(), attention_chunk=-3)
    # q, k and v are named in dashgen.attention's layout, before the chunks flatten them.
    q, k, v = cpu_leaves()
    with pytest.raises(ValueError, match=r"^v has shape .* k and v must have the same batch, "
                                         r"seqlen and heads"):
        dashgen.attention(q, k, v[:, :-1], attention_chunk=16)


# -- the entry points, through a float64 reference in place of the kernels ----------------------

def reference_pack(q, k, v, cu_q, cu_k, causal, window, scale):
    """o and the kernels' lse (each sequence's (heads_q, seqlen) block) of a pack in float64."""
    q, k, v = q.double(), k.double(), v.double()
    heads_q, group = q.shape[1], q.shape[1] // k.shape[1]
    outs, lses = [], []
    for q0, q1, k0, k1 in zip(cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(),
                              cu_k.tolist()[1:]):
        qs = q[q0:q1].transpose(0, 1)
        ks, vs = (t[k0:k1].repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
        p = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        keep = window_keep(p, torch.arange(k1 - k0)[None, :], causal, window)
        scores = ((qs @ ks.transpose(-1, -2)) * scale).masked_fill(~keep, float("-inf"))
        lses.append(torch.logsumexp(scores, -1).flatten())
        outs.append((torch.softmax(scores, -1).nan_to_num(0.0) @ vs).transpose(0, 1))
    o = torch.cat(outs) if outs else q.new_zeros(0, heads_q, v.shape[-1])
    return o, (torch.cat(lses) if lses else q.new_zeros(0))


class ReferencePackRuntime:
    """dashgen.runtime.varlen's prepared calls as the float64 reference of the pack they are
    given (its offsets, mask and window), rounded to the inputs' dtype."""

    def pack_forward_call(self, variant, q_shape, k_shape, batch, max_q, max_k, softmax_scale,
                          device, softcap, window=(-1, -1)):
        def call(q, k, v, cu_q, cu_k):
            o, lse = reference_pack(q, k, v, cu_q, cu_k, variant.causal, window, softmax_scale)
            return o.to(q.dtype), lse.float()
        return call

    def pack_backward_call(self, variant, q_shape, k_shape, batch, max_q, max_k, softmax_scale,
                           deterministic, workers, device, softcap, window=(-1, -1)):
        def call(do, q, k, v, o, lse, cu_q, cu_k):
            with torch.enable_grad():  # autograd runs this call with grad mode off
                leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
                out, _ = reference_pack(*leaves, cu_q, cu_k, variant.causal, window,
                                        softmax_scale)
                grads = torch.autograd.grad(out, leaves, do.double(), allow_unused=True)
            return tuple(torch.zeros_like(t) if g is None else g.to(t.dtype)
                         for g, t in zip(grads, (q, k, v)))
        return call


@pytest.fixture
def reference_runtime(on_cpu, monkeypatch):
    monkeypatch.setattr(op_varlen, "_runtime", lambda: ReferencePackRuntime())
    clear_caches()
    yield
    clear_caches()


def fa3_reference(q, k, v, lengths_q, lengths_k, chunk, causal, window, scale):
    """FA3's chunked attention over a pack's tokens in float64 (fa3_mask): o, lse by head."""
    mask = fa3_mask(lengths_q, lengths_k, chunk, causal, window)
    group = q.shape[1] // k.shape[1]
    kt, vt = (t.double().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
    scores = (q.double().transpose(0, 1) @ kt.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, -1).nan_to_num(0.0) @ vt).transpose(0, 1), \
        torch.logsumexp(scores, -1)


def close(ours, ref, name):
    err = (ours.double() - ref).abs().max().item()
    assert err <= 2e-2 * max(ref.abs().max().item(), 1.0), f"{name}: max error {err:.3e}"


@pytest.mark.parametrize("lengths_q, lengths_k, chunk", [
    ([37, 0, 20, 9], [37, 5, 33, 4], 8), ([16, 40], [16, 12], 16), ([3], [70], 32)], ids=str)
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (6, 2)), (True, (5, -1))], ids=str)
def test_attention_varlen_chunks_forward_and_backward(reference_runtime, lengths_q, lengths_k,
                                                      chunk, causal, window):
    g = torch.Generator().manual_seed(sum(lengths_q) + chunk)
    q = torch.randn(sum(lengths_q), 4, 64, generator=g).to(BF16).requires_grad_()
    k, v = (torch.randn(sum(lengths_k), 2, 64, generator=g).to(BF16).requires_grad_()
            for _ in range(2))
    do = torch.randn(q.shape, generator=g).to(BF16)
    o, lse = dashgen.attention_varlen(q, k, v, cu_of(lengths_q), cu_of(lengths_k),
                                      max(lengths_q), max(lengths_k), causal=causal,
                                      window_size=window, attention_chunk=chunk,
                                      return_lse=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_o, ref_lse = fa3_reference(*leaves, lengths_q, lengths_k, chunk, causal, window,
                                   64 ** -0.5)
    ref_grads = torch.autograd.grad(ref_o, leaves, do.double())
    close(o, ref_o.detach(), "o")
    assert torch.equal(lse.isneginf(), ref_lse.isneginf())
    close(lse.masked_fill(lse.isneginf(), 0), ref_lse.detach().masked_fill(ref_lse.isneginf(), 0),
          "lse")
    for name, ours, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
        close(ours, ref, name)


@pytest.mark.parametrize("seqlen_q, seqlen_k, chunk", [(40, 40, 16), (50, 20, 8), (9, 30, 7)],
                         ids=str)
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)),
                                            (False, (4, 4))], ids=str)
def test_fa3s_flash_attn_func_chunks(reference_runtime, seqlen_q, seqlen_k, chunk, causal,
                                     window):
    """flash_attn_func's attention_chunk through dashgen.attention, with windows and seqlen_q >
    seqlen_k (rows with p < 0 see no key: o = 0, lse = -inf)."""
    g = torch.Generator().manual_seed(seqlen_q * 100 + chunk)
    q = torch.randn(2, seqlen_q, 4, 64, generator=g).to(BF16).requires_grad_()
    k, v = (torch.randn(2, seqlen_k, 2, 64, generator=g).to(BF16).requires_grad_()
            for _ in range(2))
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                   attention_chunk=chunk, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, seqlen_q)
    flat = lambda t: t.detach().reshape(-1, *t.shape[2:])  # noqa: E731
    ref_o, ref_lse = fa3_reference(flat(q), flat(k), flat(v), [seqlen_q] * 2, [seqlen_k] * 2,
                                   chunk, causal, window, 64 ** -0.5)
    close(flat(out), ref_o, "o")
    ref_lse = ref_lse.view(4, 2, seqlen_q).transpose(0, 1)
    assert torch.equal(lse.isneginf(), ref_lse.isneginf())
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_a_chunked_call_takes_a_schedules_name(reference_runtime):
    q, k, v = cpu_leaves()
    schedule = dashgen.build_schedule("fa3", dashgen.Problem(batch=1, heads_q=1, seqlen_q=64,
                                                             head_dim=64), 1)
    with pytest.raises(ValueError, match=r"^schedule: with attention_chunk the chunks run as a "
                                         r"pack"):
        dashgen.attention(q, k, v, attention_chunk=16, schedule=schedule)


def test_torch_compile_traces_a_chunked_call(on_cpu, monkeypatch):
    """dashgen.attention with attention_chunk under torch.compile (fullgraph): the chunk pack
    formed in the graph (not read from its memo), the eager call's results, at two lengths.
    As for attention_varlen, the eager call of a head_dim and mask fills the selection memo
    the trace reads."""
    runtime = FakePackRuntime()
    monkeypatch.setattr(op_varlen, "_runtime", lambda: runtime)
    clear_caches()

    def call(q, k, v):
        return dashgen.attention(q, k, v, causal=True, attention_chunk=32, deterministic=True)
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    for seqlen in (100, 77):
        q, k, v = cpu_leaves(seqlen_q=seqlen, seqlen_k=seqlen)
        want = call(q, k, v)
        (want_dq,) = torch.autograd.grad(want.float().sum(), (q,))
        out = compiled(q, k, v)
        assert torch.equal(out, want)
        assert torch.equal(torch.autograd.grad(out.float().sum(), (q,))[0], want_dq)
    torch._dynamo.reset()
