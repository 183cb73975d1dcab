"""dashgen where users already call attention, on the CPU: dashgen.sdpa (SDPA's layout),
SDPA's flash backend through torch.nn.attention's registry, and flash_attn_func. The driver
boundary is faked as in test_op_errors (op._kernels), so what each entry point hands the
kernels, and what it hands back, is checked exactly; the GPU tests run the real kernels."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.interfaces import sdpa as sdpa_mod  # noqa: E402
from test_op_errors import (  # noqa: E402,F401  (fixtures by name)
    BF16, cpu_leaves, fake_gradients, h200, kernels, on_cpu, restore_determinism, varlen)


def bhsd_leaves(batch=2, heads_q=8, heads_kv=2, seqlen_q=100, seqlen_k=100, head_dim=64):
    """SDPA-layout leaves whose memory is (batch, seqlen, heads, head_dim), as a projection's
    .view(...).transpose(1, 2) makes them."""
    torch.manual_seed(0)
    return tuple(torch.randn(batch, s, h, head_dim, dtype=BF16).transpose(1, 2).requires_grad_()
                 for h, s in ((heads_q, seqlen_q), (heads_kv, seqlen_k), (heads_kv, seqlen_k)))


# -- dashgen.sdpa ------------------------------------------------------------------------------

def test_sdpa_is_attention_in_the_bhsd_layout(on_cpu, kernels):
    q, k, v = bhsd_leaves()
    out = dashgen.sdpa(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
    ref_o, _ = kernels.forward(*(t.detach().transpose(1, 2).contiguous() for t in (q, k, v)),
                               causal=True, softmax_scale=0.25)
    assert out.shape == q.shape and torch.equal(out.detach(), ref_o.transpose(1, 2))
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    want = fake_gradients(do.transpose(1, 2), *(t.transpose(1, 2) for t in (q, k, v)))
    for got, ref in zip((dq, dk, dv), want):
        assert torch.equal(got, ref.transpose(1, 2))
    # The (batch, seqlen, heads, head_dim) memory went to the kernels as it was: no copy.
    assert kernels.prepared[0][:3] == tuple(t.data_ptr() for t in (q, k, v))


def test_sdpa_takes_the_autocast_dtype_as_sdpa_does(on_cpu, kernels):
    """Under torch.autocast, float32 inputs reach the kernels in the autocast dtype (SDPA is an
    op autocast runs in lower precision); the gradients return in float32. Outside autocast a
    float32 input is named."""
    q, k, v = (t.detach().float().requires_grad_() for t in bhsd_leaves())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dashgen.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == torch.bfloat16
    assert kernels.forward_calls[-1][2] == torch.bfloat16
    assert all(g.dtype == torch.float32
               for g in torch.autograd.grad(out.float().sum(), (q, k, v)))
    with pytest.raises(TypeError, match=r"^q has dtype torch.float32"):
        dashgen.sdpa(q, k, v, is_causal=True, enable_gqa=True)


def test_sdpa_follows_the_deterministic_flag(on_cpu, kernels, restore_determinism):
    for flag in (True, False):
        torch.use_deterministic_algorithms(flag)
        q, k, v = bhsd_leaves(heads_kv=8)
        dashgen.sdpa(q, k, v).sum().backward()
        prepared = [options for name, options in kernels.calls if name == "prepare"]
        assert prepared[-1]["deterministic"] is flag


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(attn_mask=torch.ones(100, 100, dtype=torch.bool), enable_gqa=True),
     r"attn_mask of shape \(100, 100\): dashgen serves a key-padding mask \(2 or 1, 1, 1, 100\)"),
    (dict(attn_mask=torch.zeros(2, 1, 1, 100), enable_gqa=True),
     r"attn_mask: dashgen takes a boolean key-padding mask, got torch.float32"),
    (dict(attn_mask=torch.ones(2, 1, 1, 100, dtype=torch.bool), is_causal=True),
     r"attn_mask with is_causal: SDPA takes one or the other"),
    (dict(dropout_p=0.1), r"dropout_p: dashgen has no dropout"),
    (dict(), r"query has 8 heads and key 2: pass enable_gqa=True"),
])
def test_sdpa_refuses_what_it_cannot_do_before_any_kernel(on_cpu, kernels, kwargs, pattern):
    q, k, v = bhsd_leaves()
    with pytest.raises(ValueError, match=r"^dashgen.sdpa: " + pattern):
        dashgen.sdpa(q, k, v, **kwargs)
    assert kernels.calls == []


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 70), (1, 70)])
def test_sdpa_runs_a_key_padding_mask_as_a_pack_of_every_query(on_cpu, kernels, varlen,
                                                                mask_shape):
    """A boolean key-padding mask: each row's kept keys and all its queries as one sequence
    (the packed kernels replaced by float32 attention), SDPA's own answer with that mask."""
    q, k, v = bhsd_leaves(seqlen_k=70)
    keep = torch.ones(mask_shape, dtype=torch.bool)
    keep[..., 50:] = False
    if mask_shape[0] == 2:
        keep[1, ..., :10] = False
    out = dashgen.sdpa(q, k, v, attn_mask=keep, enable_gqa=True)
    assert kernels.calls == [] and out.shape == q.shape
    kept = [50, 40] if mask_shape[0] == 2 else [50, 50]
    assert varlen == [dict(q=(200, 8, 64), k=(sum(kept), 2, 64), cu_q=[0, 100, 200],
                           cu_k=[0, kept[0], sum(kept)], max_q=100, max_k=max(kept),
                           causal=False)]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=keep, enable_gqa=True)
    assert torch.allclose(out.float(), want, atol=1e-2)
    dq, dk, _ = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert torch.equal(dk.transpose(1, 2)[:, 50:], torch.zeros_like(dk.transpose(1, 2)[:, 50:]))


def test_sdpa_refuses_causal_with_unequal_lengths(on_cpu, kernels):
    # SDPA's is_causal is top-left aligned, dashgen's causal bottom-right.
    q, k, v = bhsd_leaves(heads_kv=8, seqlen_k=70)
    with pytest.raises(ValueError, match=r"is_causal with 100 queries and 70 keys: SDPA aligns "
                                         r"the causal mask top-left"):
        dashgen.sdpa(q, k, v, is_causal=True)
    assert dashgen.sdpa(q, k, v).shape == q.shape  # without is_causal the lengths may differ


# -- SDPA's flash backend ----------------------------------------------------------------------

def test_dashgen_is_registered_with_torch_but_not_active():
    if not sdpa_mod.registry_available():
        pytest.skip("this torch has no torch.nn.attention.register_flash_attention_impl")
    assert sdpa_mod.IMPL_NAME in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() != sdpa_mod.IMPL_NAME


def test_activate_and_restore_override_the_flash_ops_and_put_them_back():
    if not sdpa_mod.registry_available():
        pytest.skip("this torch has no torch.nn.attention.register_flash_attention_impl")
    registry = torch.nn.attention._registry
    try:
        torch.nn.attention.activate_flash_attention_impl(sdpa_mod.IMPL_NAME)
        assert torch.nn.attention.current_flash_attention_impl() == sdpa_mod.IMPL_NAME
        handle = registry._FLASH_ATTENTION_ACTIVE[1]
        assert isinstance(handle, sdpa_mod._Handle) and handle.library is not None
    finally:
        torch.nn.attention.restore_flash_attention_impl()
    assert torch.nn.attention.current_flash_attention_impl() is None
    assert handle.library is None  # the overrides are gone


def test_flash_backend_forward_and_backward_keep_sdpa_layouts(on_cpu, kernels,
                                                             restore_determinism):
    torch.use_deterministic_algorithms(True)
    q, k, v = (t.detach() for t in bhsd_leaves(heads_kv=2))
    out, lse, cum_q, cum_k, max_q, max_k, rng, unused, debug = sdpa_mod._flash_forward(
        q, k, v, 0.0, True, False, scale=0.5)
    ref_o, ref_lse = kernels.forward(*(t.transpose(1, 2).contiguous() for t in (q, k, v)),
                                     causal=True, softmax_scale=0.5)
    assert torch.equal(out, ref_o.transpose(1, 2)) and torch.equal(lse, ref_lse)
    assert (cum_q, cum_k, max_q, max_k) == (None, None, 100, 100)
    assert rng.shape == (2,) and unused.shape == () and debug.numel() == 0
    do = torch.randn_like(out)
    grads = sdpa_mod._flash_backward(do, q, k, v, out, lse, None, None, 100, 100, 0.0, True,
                                     rng, unused, scale=0.5)
    want = fake_gradients(*(t.transpose(1, 2) for t in (do, q, k, v)))
    assert all(torch.equal(g, w.transpose(1, 2)) for g, w in zip(grads, want))
    assert kernels.calls[-1] == ("backward", dict(causal=True, softmax_scale=0.5,
                                                  deterministic=True, schedule="symmetric_shift",
                                                  num_workers=16))


def test_flash_backend_refusals_name_the_reason_and_the_way_back(on_cpu, kernels):
    q, k, v = (t.detach() for t in bhsd_leaves(heads_kv=8, head_dim=64))
    with pytest.raises(RuntimeError, match=r"^dashgen as SDPA's flash backend \(forward\): "
                                           r"dropout_p: .*restore_flash_attention_impl"):
        sdpa_mod._flash_forward(q, k, v, 0.2)
    with pytest.raises(RuntimeError, match=r"\(forward\): return_debug_mask"):
        sdpa_mod._flash_forward(q, k, v, 0.0, False, True)
    q72 = torch.randn(2, 8, 100, 72, dtype=BF16)  # a head_dim dashgen has no kernel for
    with pytest.raises(RuntimeError, match=r"\(forward\): q has head_dim 72"):
        sdpa_mod._flash_forward(q72, q72, q72)
    with pytest.raises(RuntimeError, match=r"\(backward\): variable-length"):
        sdpa_mod._flash_backward(q, q, k, v, q, None, torch.zeros(3), None, 1, 1, 0.0, False,
                                 None, None)
    assert kernels.calls == []


# -- flash_attn_func ---------------------------------------------------------------------------

def test_flash_attn_func_returns_out_or_out_lse_and_none(on_cpu, kernels):
    q, k, v = cpu_leaves()
    out = dashgen.flash_attn_func(q, k, v, causal=True)
    out2, lse, mask = dashgen.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref_o, ref_lse = kernels.forward(*(t.detach() for t in (q, k, v)), causal=True,
                                     softmax_scale=1 / 8)
    assert torch.equal(out.detach(), ref_o) and torch.equal(out2.detach(), ref_o)
    assert torch.equal(lse, ref_lse) and mask is None


def test_flash_attn_func_passes_softmax_scale_and_deterministic(on_cpu, kernels,
                                                               restore_determinism):
    torch.use_deterministic_algorithms(False)
    q, k, v = cpu_leaves()
    dashgen.flash_attn_func(q, k, v, softmax_scale=0.3, deterministic=True).sum().backward()
    assert kernels.calls[0] == ("forward", dict(causal=False, softmax_scale=0.3))
    assert kernels.calls[1][1]["deterministic"] is True
    dashgen.flash_attn_func(q, k, v).sum().backward()  # None: the flag, here off
    assert kernels.calls[-2][1]["deterministic"] is False


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(dropout_p=0.1), r"^dropout_p: dashgen has no dropout"),
    (dict(alibi_slopes=torch.ones(8)), r"^alibi_slopes: dashgen has no ALiBi"),
])
def test_flash_attn_func_refuses_what_it_cannot_do(on_cpu, kernels, kwargs, pattern):
    q, k, v = cpu_leaves()
    with pytest.raises(ValueError, match=pattern):
        dashgen.flash_attn_func(q, k, v, **kwargs)
    assert kernels.calls == []


def test_flash_attn_func_passes_softcap_to_the_kernels(on_cpu, kernels, monkeypatch):
    """flash_attn's softcap (Gemma 2's logit cap) reaches both kernels; 0 is no cap."""
    q, k, v = cpu_leaves()
    dashgen.flash_attn_func(q, k, v, causal=True, softcap=30.0).sum().backward()
    assert kernels.calls[0] == ("forward", dict(causal=True, softmax_scale=q.shape[-1] ** -0.5,
                                                softcap=30.0))
    prepared = [options for name, options in kernels.calls if name == "prepare"]
    assert [options.get("softcap") for options in prepared] == [30.0]  # the backward's
    kernels.calls.clear()
    dashgen.flash_attn_func(q, k, v, softcap=0.0)
    assert "softcap" not in kernels.calls[0][1]



# -- q/k 192 with v 128 (DeepSeek's MLA) through each entry point ---------------------------------

def mla_bhsd_leaves(seqlen=64):
    """SDPA-layout q, k of 192 columns and v of 128 (MHA: the pair is refused under GQA)."""
    q, k, _ = bhsd_leaves(heads_kv=8, seqlen_q=seqlen, seqlen_k=seqlen, head_dim=192)
    v = bhsd_leaves(heads_kv=8, seqlen_q=seqlen, seqlen_k=seqlen, head_dim=128)[2]
    return q, k, v


def test_sdpa_hands_v_narrower_than_q_to_the_kernels_as_it_is(on_cpu, kernels):
    q, k, v = mla_bhsd_leaves()
    out = dashgen.sdpa(q, k, v, is_causal=True)
    assert out.shape == (2, 8, 64, 128)  # o has v's width
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    want = fake_gradients(do.transpose(1, 2), *(t.transpose(1, 2) for t in (q, k, v)))
    for got, ref in zip((dq, dk, dv), want):
        assert got.shape == ref.transpose(1, 2).shape and torch.equal(got, ref.transpose(1, 2))
    (launch,) = kernels.backward_launches
    assert launch.selection.backward.kernel_name.startswith("dashgen_bwd_bf16_d192v128_causal")


def test_flash_backend_runs_v_narrower_than_q(on_cpu, kernels, restore_determinism):
    torch.use_deterministic_algorithms(True)
    q, k, v = (t.detach() for t in mla_bhsd_leaves())
    out, lse, *_ = sdpa_mod._flash_forward(q, k, v, 0.0, True, False)
    ref_o, ref_lse = kernels.forward(*(t.transpose(1, 2).contiguous() for t in (q, k, v)),
                                     causal=True, softmax_scale=192 ** -0.5)
    assert out.shape == (2, 8, 64, 128) and torch.equal(out, ref_o.transpose(1, 2))
    do = torch.randn_like(out)
    grads = sdpa_mod._flash_backward(do, q, k, v, out, lse, None, None, 64, 64, 0.0, True,
                                     torch.zeros(2), torch.zeros(()))
    want = fake_gradients(*(t.transpose(1, 2) for t in (do, q, k, v)))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert all(torch.equal(g, w.transpose(1, 2)) for g, w in zip(grads, want))


def test_flash_attn_func_runs_v_narrower_than_q(on_cpu, kernels):
    q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_()
               for t in mla_bhsd_leaves())
    out = dashgen.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 64, 8, 128)
    out.float().sum().backward()
    assert v.grad.shape == v.shape and q.grad.shape == q.shape
    assert torch.equal(v.grad, torch.full_like(v, 5.0))  # fake_gradients' dv reached v
    (launch,) = kernels.backward_launches
    assert launch.selection.backward.head_dim_v == 128
