"""lab/fa3_shim.py's `_flash_attn_backward`, the private call of FA3's determinism tests: the
gradients of dashgen's own forward and backward written into the tensors given, softmax_d in
FA3's lse layout, fixed-length and packed. The kernels are replaced by a float64 reference of
dashgen's contract, so the gradients must be exactly autograd's through flash_attn_func."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fa3_shim  # noqa: E402  (lab/ is on the path: the root conftest.py)
from dashgen.codegen.variants import ForwardVariant  # noqa: E402
from dashgen.interfaces import flash_attn_interface as fa3  # noqa: E402
from dashgen.runtime import op, op_varlen  # noqa: E402


def dense(q, k, v, *, causal, softmax_scale, return_lse, **options):
    """(batch, seqlen, heads, head_dim) attention in float64, causal bottom-right, GQA."""
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, 2).transpose(1, 2) for t in (k, v))
    scores = (q.transpose(1, 2) @ kt.transpose(-1, -2)) * (softmax_scale or q.shape[-1] ** -0.5)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1) @ vt).transpose(1, 2), torch.logsumexp(scores, -1)


def packed(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale, return_lse,
           **options):
    """Each sequence of a pack alone (dense above); lse (heads, total_q)."""
    outs, lses = [], []
    for (q0, q1), (k0, k1) in zip(zip(cu_q.tolist(), cu_q.tolist()[1:]),
                                  zip(cu_k.tolist(), cu_k.tolist()[1:])):
        o, lse = dense(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                       softmax_scale=softmax_scale, return_lse=True)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.fixture(autouse=True)
def float64_kernels(monkeypatch):
    monkeypatch.setattr(op, "attention", dense)
    monkeypatch.setattr(op_varlen, "attention_varlen", packed)
    monkeypatch.setattr(fa3, "_options", lambda q, deterministic, sm_margin: {})


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_private_backward_writes_dashgens_gradients(causal):
    g = torch.Generator().manual_seed(3 + causal)
    q = torch.randn(2, 9, 4, 8, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, 12, 2, 8, dtype=torch.float64, generator=g) for _ in range(2))
    out = fa3.flash_attn_func(q, k, v, causal=causal, softmax_scale=0.5)
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    got = fa3_shim._flash_attn_backward(dout, q, k, v, out, None, dq=dq, dk=dk, dv=dv,
                                        softmax_scale=0.5, causal=causal,
                                        deterministic=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(fa3.flash_attn_func(*leaves, causal=causal, softmax_scale=0.5),
                               leaves, dout)
    assert got[0] is dq and got[1] is dk and got[2] is dv
    for a, b in zip(got[:3], want):
        assert torch.equal(a, b)
    assert got[3].dtype == torch.float32 and got[3].shape == (2, 4, 9)  # FA3's lse layout
    assert torch.allclose(got[3].double(), (dout * out).sum(-1).transpose(1, 2), atol=1e-5)


def test_the_private_backward_of_a_pack_uses_its_offsets():
    g = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    q, k, v = (torch.randn(11, 2, 8, dtype=torch.float64, generator=g) for _ in range(3))
    out = fa3.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    dout = torch.randn_like(out)
    dq, dk, dv, softmax_d = fa3_shim._flash_attn_backward(dout, q, k, v, out, None, cu, cu,
                                                          None, None, 7, 7, causal=True)
    for s0, s1 in ((0, 4), (4, 11)):  # each sequence's gradients are its own
        leaves = [t[s0:s1].clone().requires_grad_() for t in (q, k, v)]
        alone = fa3.flash_attn_func(*(t[None] for t in leaves), causal=True)
        want = torch.autograd.grad(alone, leaves, dout[None, s0:s1])
        for got, w in zip((dq, dk, dv), want):
            assert torch.allclose(got[s0:s1], w, atol=1e-12)
    assert softmax_d.shape == (2, 11)


def test_count_only_stops_a_served_case_at_its_first_kernel(monkeypatch, tmp_path):
    """With lab/fa3_suite.py's --count-only variable set, importing the stand-in makes the first
    kernel load raise CaseServed (every kernel, fixed-length or packed, is loaded through
    device.LoadedKernels, after dashgen's checks and selection)."""
    import importlib
    import sys
    import fa3_suite
    from dashgen.runtime import device
    monkeypatch.setenv(fa3_suite.COUNT_ONLY_ENV, "1")
    monkeypatch.setattr(device.LoadedKernels, "__init__", device.LoadedKernels.__init__)
    module = importlib.import_module("fa3_shim")
    try:
        shim = importlib.reload(module)
        with pytest.raises(shim.CaseServed, match=r"^served by dashgen_fwd_bf16_d64"):
            device.LoadedKernels(ForwardVariant("bf16", 64, True))
    finally:
        monkeypatch.delenv(fa3_suite.COUNT_ONLY_ENV)
        importlib.reload(module)
        sys.modules["fa3_shim"] = module


def test_the_count_only_reference_is_zeros_of_the_references_shapes():
    """fa3_shim.no_reference, what --count-only puts in test_util.attention_ref: the output's
    shape and dtype (head_dim of V), the attention matrix's shape holding no memory."""
    q = torch.randn(2, 5, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 7, 2, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 7, 2, 32, dtype=torch.bfloat16)
    out, attn = fa3_shim.no_reference(q, k, v, None, None, causal=True, window_size=(3, 0))
    assert out.shape == (2, 5, 4, 32) and out.dtype == torch.bfloat16
    assert not out.any()
    assert attn.shape == (2, 4, 5, 7) and attn.stride() == (0, 0, 0, 0)
    assert not attn.any()


def test_the_count_only_reference_has_zero_gradients_for_a_case_without_a_kernel():
    """A case dashgen answers without a kernel (FA3's determinism file packs two sequences with
    no keys at 4096 tokens) reaches the reference's gradients: zeros of q's, k's and v's shapes,
    not an autograd error."""
    q, k, v = (torch.randn(2, 5, 4, 64, requires_grad=True) for _ in range(3))
    out, _ = fa3_shim.no_reference(q, k, v, None, None)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert not any(g.any() for g in grads)
