"""dashgen.interfaces.flash_attn_interface: FlashAttention-3's function names and signatures over
dashgen (the driver boundary faked as in test_op_errors): the arguments FA3 takes reach dashgen's
op as dashgen's options, its return values are FA3's, and what dashgen lacks is named."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from dashgen.interfaces import flash_attn_interface as fa3  # noqa: E402
from dashgen.interfaces.flash_attn import padded_width  # noqa: E402
from dashgen.runtime import op  # noqa: E402
from test_op_errors import cpu_leaves, h200, kernels, on_cpu  # noqa: E402,F401  (fixtures)
from test_varlen import pack  # noqa: E402

# FA3's hopper/flash_attn_interface.py (Dao-AILab/flash-attention 0251105): the parameters of
# its two functions, in order.
# FA3's signatures (its hopper flash_attn_interface), then learnable_sink, the sinks argument of
# newer FlashAttention interfaces, last so that FA3's positional calls keep their meaning.
FA3_FUNC = ["q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale",
            "v_descale", "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa",
            "deterministic", "sm_margin", "return_attn_probs", "learnable_sink"]
FA3_VARLEN = (["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
               "seqused_q", "seqused_k"] + FA3_FUNC[3:])


def test_the_signatures_are_fa3s():
    assert list(inspect.signature(fa3.flash_attn_func).parameters) == FA3_FUNC
    assert list(inspect.signature(fa3.flash_attn_varlen_func).parameters) == FA3_VARLEN
    defaults = {name: p.default for name, p in
                inspect.signature(fa3.flash_attn_func).parameters.items()}
    assert defaults["deterministic"] is False and defaults["window_size"] == (-1, -1)
    assert defaults["num_splits"] == 1 and defaults["sm_margin"] == 0


@pytest.mark.parametrize("window_size, causal, expect", [
    ((-1, -1), False, False), ((-1, 0), False, True), ((-1, -1), True, True),
    ((-5, -1), False, False), ((-1, 0), True, True)])
def test_the_masks_fa3_writes_as_windows(on_cpu, kernels, window_size, causal, expect):
    q, k, v = cpu_leaves()
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                   return_attn_probs=True)
    assert kernels.calls[0] == ("forward", dict(causal=expect, softmax_scale=0.125))
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert torch.is_tensor(fa3.flash_attn_func(q, k, v))  # out alone without return_attn_probs


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(window_size=3), TypeError, r"^window_size must be a pair of ints \(left, right\), got 3$"),
    (dict(qv=torch.zeros(1)), ValueError, r"^qv: "),
    (dict(k_descale=torch.ones(1)), ValueError, r"^k_descale: dashgen has no fp8 inputs$"),
    (dict(attention_chunk=-1), ValueError, r"^attention_chunk must be a non-negative int"),
    (dict(num_splits=-1), ValueError, r"^num_splits must be a non-negative int, got -1$"),
    (dict(deterministic=None), TypeError, r"^deterministic must be a bool, got None$"),
    (dict(sm_margin=-2), ValueError, r"^sm_margin must be a non-negative int, got -2$"),
    (dict(return_attn_probs=1), TypeError, r"^return_attn_probs must be a bool, got 1$"),
])
def test_what_dashgen_lacks_is_named(on_cpu, kernels, kwargs, error, pattern):
    q, k, v = cpu_leaves()
    with pytest.raises(error, match=pattern):
        fa3.flash_attn_func(q, k, v, **kwargs)
    assert kernels.calls == []


def test_deterministic_false_follows_the_flag_and_true_orders(on_cpu, kernels):
    """FA3's deterministic=False promises no bits: dashgen then follows
    torch.use_deterministic_algorithms (its default), never raising under it."""
    q, k, v = cpu_leaves()
    fa3.flash_attn_func(q, k, v, causal=True).sum().backward()
    fa3.flash_attn_func(q, k, v, causal=True, deterministic=True).sum().backward()
    prepared = [options for name, options in kernels.calls if name == "prepare"]
    assert [options["deterministic"] for options in prepared] == [False, True]
    torch.use_deterministic_algorithms(True)
    try:
        fa3.flash_attn_func(q, k, v, causal=True).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)
    prepared = [options for name, options in kernels.calls if name == "prepare"]
    assert prepared[-1]["deterministic"] is True


def test_sm_margin_leaves_sms_to_other_kernels(on_cpu, kernels, monkeypatch):
    monkeypatch.setattr(fa3, "sm_count", lambda device: 132)
    q, k, v = cpu_leaves()
    fa3.flash_attn_func(q, k, v, causal=True, sm_margin=4).sum().backward()
    prepared = [options for name, options in kernels.calls if name == "prepare"]
    asked = op.check_inputs(q, k, v, causal=True, num_workers=128)  # 132 - 4, resolved
    assert prepared[0]["num_workers"] == asked.num_workers
    assert asked != op.check_inputs(q, k, v, causal=True, num_workers=4)
    with pytest.raises(ValueError, match=r"^sm_margin=132 leaves none of this GPU's 132 SMs$"):
        fa3.flash_attn_func(q, k, v, sm_margin=132)


@pytest.mark.parametrize("used, error", [
    (torch.zeros(2, dtype=torch.int32), r"^seqused_q has 2 entries for 3 sequences$"),
    (torch.zeros(3, dtype=torch.int64), r"^seqused_q must be a 1-D int32 tensor, got "
                                        r"torch.int64 \(3,\)$"),
    ([1, 2], r"^seqused_q must be a 1-D int32 tensor, got list \(\)$")])
def test_seqused_is_checked(used, error):
    q, k, v, cu_q, cu_k, max_q, max_k = pack()
    with pytest.raises(ValueError, match=error):
        fa3.used_pack(cu_q, cu_k, used, None)


def fa3_chunked_reference(q, k, v, causal, chunk, scale):
    """FA3's test reference for attention_chunk (hopper/test_util.py, construct_chunk_mask):
    row i keeps keys [p - p % chunk, p - p % chunk + chunk), p = i + seqlen_k - seqlen_q, and
    under causal none after p. float64, (batch, seqlen, heads, head_dim); lse (b, h, s)."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, 2).transpose(1, 2) for t in (k, v))
    scores = (q.transpose(1, 2) @ kt.transpose(-1, -2)) * scale
    p = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    start = p - p % chunk
    keep = (j >= start) & (j < start + chunk)
    if causal:
        keep &= j <= p
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return (probs @ vt).transpose(1, 2), lse


def packed_reference(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale,
                     return_lse, **options):
    """dashgen.attention_varlen's contract in float64: each sequence alone, causal bottom-right
    within it; lse (heads_q, total_q)."""
    assert return_lse
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=q.dtype)
    group = q.shape[1] // k.shape[1]
    for (q0, q1), (k0, k1) in zip(zip(cu_q.tolist(), cu_q.tolist()[1:]),
                                  zip(cu_k.tolist(), cu_k.tolist()[1:])):
        if q1 == q0 or k1 == k0:
            continue
        qs, ks, vs = q[q0:q1].transpose(0, 1), k[k0:k1], v[k0:k1]
        ks, vs = (t.repeat_interleave(group, 1).transpose(0, 1) for t in (ks, vs))
        scores = (qs @ ks.transpose(-1, -2)) * softmax_scale
        if causal:
            keep = (torch.arange(k1 - k0)[None, :]
                    <= torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0))
            scores = scores.masked_fill(~keep, float("-inf"))
        lse[:, q0:q1] = torch.logsumexp(scores, -1)
        out[q0:q1] = (torch.softmax(scores, -1).nan_to_num(0.0) @ vs).transpose(0, 1)
    assert max(b - a for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:])) <= max_q
    return out, lse


@pytest.mark.parametrize("seqlen_q, seqlen_k, chunk", [(64, 64, 16), (50, 50, 16), (21, 70, 16),
                                                       (64, 64, 128), (1, 70, 32), (70, 21, 16)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_chunked_attention_is_fa3s_chunk_mask(monkeypatch, seqlen_q, seqlen_k, chunk, causal):
    """attention_chunk runs as a pack of the chunks (chunk_pack): with attention_varlen's
    contract computed in float64, o and lse are FA3's reference with its chunk mask."""
    from dashgen.runtime import op_varlen
    # dashgen.attention checks bf16 inputs; the pack's attention is then taken in float64.
    monkeypatch.setattr(op_varlen, "attention_varlen", lambda q, k, v, *args, **kwargs:
                        packed_reference(q.double(), k.double(), v.double(), *args, **kwargs))
    monkeypatch.setattr(fa3, "_options", lambda q, deterministic, sm_margin: {})
    g = torch.Generator().manual_seed(seqlen_q * 1000 + chunk)
    q = torch.randn(2, seqlen_q, 4, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, seqlen_k, 2, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    out, lse = fa3.flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal,
                                   attention_chunk=chunk, return_attn_probs=True)
    ref_out, ref_lse = fa3_chunked_reference(q.double(), k.double(), v.double(), causal, chunk,
                                             0.3)
    assert out.shape == q.shape and lse.shape == (2, 4, seqlen_q)
    assert torch.allclose(out, ref_out, atol=1e-12)
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    assert torch.allclose(lse[~lse.isinf()], ref_lse[~ref_lse.isinf()], atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("which", ["q", "k", "both"])
def test_seqused_tokens_are_the_used_sequences_alone(monkeypatch, causal, which):
    """FA3's seqused_q/k: each sequence's used queries against its used keys (causal
    bottom-right in the used part), through used_pack with attention_varlen's contract in
    float64; unused queries get o = 0 and lse = -inf."""
    from dashgen.runtime import op_varlen
    monkeypatch.setattr(op_varlen, "attention_varlen", packed_reference)
    monkeypatch.setattr(fa3, "_options", lambda q, deterministic, sm_margin: {})
    lengths_q, lengths_k = [9, 0, 13, 5], [11, 4, 13, 7]
    used_q, used_k = [6, 0, 13, 1], [11, 2, 8, 7]
    if which == "k":
        used_q = lengths_q
    if which == "q":
        used_k = lengths_k
    g = torch.Generator().manual_seed(len(which) + causal)
    q = torch.randn(sum(lengths_q), 4, 32, dtype=torch.float64, generator=g)  # a served width
    k, v = (torch.randn(sum(lengths_k), 2, 32, dtype=torch.float64, generator=g)
            for _ in range(2))
    cu = lambda n: torch.tensor([0] + list(torch.tensor(n).cumsum(0)), dtype=torch.int32)
    i32 = lambda n: torch.tensor(n, dtype=torch.int32)
    out, lse = fa3.flash_attn_varlen_func(
        q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
        seqused_q=None if which == "k" else i32(used_q),
        seqused_k=None if which == "q" else i32(used_k), softmax_scale=0.4, causal=causal,
        return_attn_probs=True)
    q0 = k0 = 0
    for lq, lk, uq, uk in zip(lengths_q, lengths_k, used_q, used_k):
        alone, alone_lse = packed_reference(
            q[q0:q0 + uq], k[k0:k0 + uk], v[k0:k0 + uk], cu([uq]), cu([uk]), uq, uk,
            causal=causal, softmax_scale=0.4, return_lse=True)
        assert torch.equal(out[q0:q0 + uq], alone)
        assert torch.equal(lse[:, q0:q0 + uq], alone_lse)
        assert torch.equal(out[q0 + uq:q0 + lq], torch.zeros_like(out[q0 + uq:q0 + lq]))
        assert bool(lse[:, q0 + uq:q0 + lq].isneginf().all())
        q0, k0 = q0 + lq, k0 + lk



def test_learnable_sink_reaches_the_sinks(on_cpu, kernels):
    q, k, v = cpu_leaves()
    sinks = torch.zeros(q.shape[2], requires_grad=True)
    fa3.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks).sum().backward()
    assert sinks.grad is not None and sinks.grad.shape == sinks.shape


# FA3's flash_attn_qkvpacked_func, its parameters in order.
FA3_QKVPACKED = ["qkv", "softmax_scale", "causal", "q_descale", "k_descale", "v_descale",
                 "window_size", "attention_chunk", "softcap", "deterministic", "num_heads_q",
                 "sm_margin", "return_attn_probs"]


def dense_reference(q, k, v, *, causal, softmax_scale, return_lse, **options):
    """dashgen.attention's contract in float64 with autograd, causal bottom-right, GQA."""
    assert return_lse
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt, vt = (t.repeat_interleave(group, 2).transpose(1, 2) for t in (k, v))
    scores = (qt @ kt.transpose(-1, -2)) * softmax_scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1) @ vt).transpose(1, 2), torch.logsumexp(scores, -1)


@pytest.fixture
def float64_attention(monkeypatch):
    """op.attention replaced by dense_reference; FA3's launch options left out."""
    monkeypatch.setattr(op, "attention", lambda q, k, v, softmax_scale=None, **kwargs:
                        dense_reference(q, k, v, softmax_scale=softmax_scale
                                        or q.shape[-1] ** -0.5, **kwargs))
    monkeypatch.setattr(fa3, "_options", lambda q, deterministic, sm_margin: {})


def test_the_qkvpacked_signature_is_fa3s():
    assert list(inspect.signature(fa3.flash_attn_qkvpacked_func).parameters) == FA3_QKVPACKED


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["stacked", "heads"])
def test_qkvpacked_is_flash_attn_func_on_its_parts(float64_attention, causal, layout):
    """o and lse are flash_attn_func's on q, k and v taken apart; the gradient arrives in qkv's
    own layout: dq, dk, dv where q, k and v lay (stacked on dim 2, or the query heads, then key
    heads, then value heads with num_heads_q, GQA)."""
    g = torch.Generator().manual_seed(7 + causal)
    if layout == "stacked":
        qkv = torch.randn(2, 11, 3, 4, 8, dtype=torch.float64, generator=g)
        parts, extra = (lambda t: t.unbind(2)), {}
    else:
        qkv = torch.randn(2, 11, 4 + 2 * 2, 8, dtype=torch.float64, generator=g)
        parts, extra = (lambda t: t.split([4, 2, 2], 2)), dict(num_heads_q=4)
    qkv.requires_grad_()
    out, lse = fa3.flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True,
                                             softmax_scale=0.3, **extra)
    q, k, v = (t.detach().clone().requires_grad_() for t in parts(qkv))
    ref, ref_lse = fa3.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True,
                                       softmax_scale=0.3)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    do = torch.randn(out.shape, dtype=torch.float64, generator=g)
    out.backward(do)
    ref.backward(do)
    for got, want in zip(parts(qkv.grad), (q.grad, k.grad, v.grad)):
        assert torch.equal(got, want)
    assert torch.is_tensor(fa3.flash_attn_qkvpacked_func(qkv.detach(), **extra))


@pytest.mark.parametrize("qkv, kwargs, error, pattern", [
    ([1.0], {}, TypeError, r"^qkv must be a tensor, got list$"),
    (torch.zeros(2, 5, 2, 4, 8), {}, ValueError,
     r"^qkv must be \(batch, seqlen, 3, heads, head_dim\), got \(2, 5, 2, 4, 8\)$"),
    (torch.zeros(2, 5, 8), {}, ValueError, r"^qkv must be \(batch, seqlen, 3, heads, head_dim\)"),
    (torch.zeros(2, 5, 8, 8), {}, ValueError,
     r"^num_heads_q must be a positive int with a 4-dim qkv .*got None$"),
    (torch.zeros(2, 5, 8, 8), dict(num_heads_q=3), ValueError,
     r"^qkv's 8 heads are not num_heads_q=3 query heads and two equal groups"),
    (torch.zeros(2, 5, 8, 8), dict(num_heads_q=8), ValueError, r"^qkv's 8 heads are not"),
])
def test_qkvpacked_layouts_are_checked(qkv, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        fa3.flash_attn_qkvpacked_func(qkv, **kwargs)


@pytest.mark.parametrize("name", ["flash_attn_with_kvcache", "flash_attn_combine",
                                  "get_scheduler_metadata"])
def test_fa3s_decoding_functions_import_and_refuse_by_name(name):
    function = getattr(fa3, name)
    assert function.__name__ == name
    with pytest.raises(NotImplementedError, match=rf"^{name}: dashgen serves attention for "
                                                  r"training; .* is not served"):
        function(torch.zeros(1), k_cache=None)


@pytest.mark.parametrize("head_dim, width", [(8, 32), (40, 48), (59, 64), (100, 112), (111, 112),
                                             (120, 128), (160, 192), (224, 256), (255, 256)])
def test_a_head_dim_without_a_kernel_pads_to_the_next_served_one(head_dim, width):
    t = torch.empty(1, 2, 1, head_dim, device="meta")
    assert padded_width(t, t, t) == width


@pytest.mark.parametrize("q_dim, v_dim", [(64, 64), (128, 128), (192, 128), (257, 257),
                                          (320, 320), (40, 48)])
def test_served_wider_and_mixed_widths_are_not_padded(q_dim, v_dim):
    """A served head_dim runs as it is, MLA's 192/128 too; past FA3's 256 and with V's width
    not q's (other than MLA's), dashgen's own checks name what they refuse."""
    q = torch.empty(1, 2, 1, q_dim, device="meta")
    v = torch.empty(1, 2, 1, v_dim, device="meta")
    assert padded_width(q, q if v_dim == q_dim else v, v) is None


@pytest.mark.parametrize("head_dim, causal, scale", [(40, False, None), (160, True, None),
                                                     (59, True, 0.2)])
def test_a_padded_call_is_fa3s_attention_at_its_own_width(float64_attention, monkeypatch,
                                                          head_dim, causal, scale):
    """o, lse and the gradients of a padded call are those of attention at the inputs' own
    width, with its 1/sqrt(head_dim) scale (or the one given); the op sees the served width."""
    seen = []
    attention = op.attention
    monkeypatch.setattr(op, "attention", lambda q, k, v, **kw: (
        seen.append((q.shape[-1], kw["softmax_scale"])), attention(q, k, v, **kw))[1])
    g = torch.Generator().manual_seed(head_dim)
    q, k, v = (torch.randn(2, 13, h, head_dim, dtype=torch.float64, generator=g)
               .requires_grad_() for h in (4, 2, 2))
    out, lse = fa3.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                   return_attn_probs=True)
    want_scale = head_dim ** -0.5 if scale is None else scale
    assert seen == [(padded_width(q, k, v), want_scale)]
    assert out.shape == q.shape and out.is_contiguous()
    ref, ref_lse = dense_reference(q, k, v, causal=causal, softmax_scale=want_scale,
                                   return_lse=True)
    assert torch.allclose(out, ref, atol=1e-12) and torch.allclose(lse, ref_lse, atol=1e-12)
    do = torch.randn(out.shape, dtype=torch.float64, generator=g)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), do),
                         torch.autograd.grad(ref, (q, k, v), do)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-12)


def test_a_padded_pack_is_each_sequences_attention_at_its_own_width(monkeypatch):
    from dashgen.runtime import op_varlen
    monkeypatch.setattr(op_varlen, "attention_varlen", packed_reference)
    monkeypatch.setattr(fa3, "_options", lambda q, deterministic, sm_margin: {})
    lengths = [9, 0, 13]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(sum(lengths), h, 72, dtype=torch.float64, generator=g)
               for h in (4, 2, 2))
    cu = torch.tensor([0, 9, 9, 22], dtype=torch.int32)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, causal=True,
                                          return_attn_probs=True)
    ref, ref_lse = packed_reference(q, k, v, cu, cu, 13, 13, causal=True,
                                    softmax_scale=72 ** -0.5, return_lse=True)
    assert out.shape == q.shape
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    assert torch.allclose(lse[~lse.isinf()], ref_lse[~ref_lse.isinf()], atol=1e-12)
