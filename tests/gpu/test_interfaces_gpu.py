"""dashgen's entry points where users already call attention, on an sm_90 GPU: dashgen.sdpa,
SDPA's flash backend with dashgen activated, flash_attn_func and its packed variants, and
attention(return_lse=True).
Each runs the same kernels as dashgen.attention, so their bits must equal its bits; accuracy is
held to 2x PyTorch's own bf16 error against float64.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_interfaces_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import dashgen  # noqa: E402
from dashgen.interfaces import sdpa as sdpa_mod  # noqa: E402
from dashgen.tools.bench import deterministic_algorithms  # noqa: E402
from test_attention_gpu import math_attention  # noqa: E402

pytestmark = pytest.mark.gpu


def bhsd(batch, heads, seqlen, head_dim, dtype=torch.bfloat16):
    """SDPA-layout tensors over (batch, seqlen, heads, head_dim) memory."""
    return torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype).transpose(1, 2)


def run(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


def rel_err(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def check_accuracy(ours, q, k, v, do, causal):
    """ours (o, dq, dk, dv in SDPA's layout) against float64, within 2x the error of attention
    computed in the inputs' dtype (test_attention_gpu.math_attention: bf16 matmuls)."""
    tr = lambda t: t.transpose(1, 2)  # noqa: E731
    scale = q.shape[-1] ** -0.5
    fn = lambda *t: tr(math_attention(*(tr(x) for x in t), causal, scale))  # noqa: E731
    ref = run(fn, q.double(), k.double(), v.double(), do.double())
    theirs = run(fn, q, k, v, do)
    for name, x, t, r in zip(("o", "dq", "dk", "dv"), ours, theirs, ref):
        err, limit = rel_err(x, r), rel_err(t, r)
        assert err <= 2 * limit + 1e-6, f"{name}: error {err:.3e} > 2 x {limit:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, heads_q, heads_kv", [(64, 8, 2), (96, 6, 2), (128, 4, 4)])
def test_sdpa_matches_attention_bitwise_and_float64(causal, head_dim, heads_q, heads_kv, seed):
    q, k, v = bhsd(2, heads_q, 1000, head_dim), *(bhsd(2, heads_kv, 1000, head_dim)
                                                  for _ in range(2))
    do = torch.randn_like(q)
    with deterministic_algorithms(True):
        ours = run(lambda *t: dashgen.sdpa(*t, is_causal=causal, enable_gqa=True), q, k, v, do)
        again = run(lambda *t: dashgen.sdpa(*t, is_causal=causal, enable_gqa=True), q, k, v, do)
        plain = run(lambda *t: dashgen.attention(*(x.transpose(1, 2) for x in t),
                                                 causal=causal).transpose(1, 2), q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(ours, again))
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))
    check_accuracy(ours, q, k, v, do, causal)


@pytest.mark.skipif(not sdpa_mod.registry_available(),
                    reason="this torch has no torch.nn.attention.register_flash_attention_impl")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_flash_backend_runs_dashgen_once_activated(causal, seed):
    q, k, v = (bhsd(2, 8, 1000, 128) for _ in range(3))
    do = torch.randn_like(q)
    flash = lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal)  # noqa: E731
    backend = torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    with deterministic_algorithms(True), backend:
        pytorch_flash = run(flash, q, k, v, do)
        torch.nn.attention.activate_flash_attention_impl(sdpa_mod.IMPL_NAME)
        try:
            routed = [run(flash, q, k, v, do) for _ in range(3)]
        finally:
            torch.nn.attention.restore_flash_attention_impl()
        ours = run(lambda *t: dashgen.sdpa(*t, is_causal=causal), q, k, v, do)
        restored = run(flash, q, k, v, do)
    for r in routed:  # dashgen's bits, every time
        assert all(torch.equal(a, b) for a, b in zip(r, ours))
    # After restore, PyTorch's own flash kernels again (their forward is deterministic).
    assert torch.equal(restored[0], pytorch_flash[0])
    check_accuracy(routed[0], q, k, v, do, causal)


def test_flash_attn_func_and_return_lse_give_attentions_bits_and_logsumexp(seed):
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 700, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = dashgen.attention(q, k, v, causal=True, return_lse=True)
    fo, flse, mask = dashgen.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert mask is None and torch.equal(fo, o) and torch.equal(flse, lse)
    # The logsumexp of each row's scaled scores, bottom-right causal; -inf where no key is seen.
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(4, 2))
    scores = scores / 128 ** 0.5
    i = torch.arange(1000, device="cuda")[:, None]
    j = torch.arange(700, device="cuda")[None, :]
    scores = scores.masked_fill(~(j <= i + 700 - 1000), float("-inf"))
    ref = torch.logsumexp(scores, -1)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), seen) and bool((lse[~seen] == float("-inf")).all())
    assert (lse[seen].double() - ref[seen]).abs().max().item() < 2e-2


def test_default_deterministic_follows_the_flag_on_the_gpu(seed):
    q, k, v = (torch.randn(2, 1000, 8, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    do = torch.randn_like(q)
    fn = lambda *t: dashgen.attention(*t, causal=True)  # noqa: E731
    with deterministic_algorithms(True):
        runs = [run(fn, q, k, v, do) for _ in range(5)]
        explicit = run(lambda *t: dashgen.attention(*t, causal=True, deterministic=True),
                       q, k, v, do)
        with pytest.raises(RuntimeError, match=r"^deterministic=False asks for"):
            dashgen.attention(q, k, v, deterministic=False)
    assert all(torch.equal(a, b) for r in runs + [explicit] for a, b in zip(r, runs[0]))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_packed_functions_give_the_unpacked_bits(causal):
    """flash_attn 2.x's qkvpacked and kvpacked functions, fixed-length and packed: o and the
    gradients (in the stacked layout) bitwise those of flash_attn_func /
    flash_attn_varlen_func on the parts, deterministic."""
    torch.manual_seed(5 + causal)
    cu = torch.tensor([0, 300, 301, 1000], device="cuda", dtype=torch.int32)
    cases = [
        (dashgen.flash_attn_qkvpacked_func, (torch.randn(2, 555, 3, 4, 128),), (),
         lambda t: t.unbind(2), dashgen.flash_attn_func, ()),
        (dashgen.flash_attn_kvpacked_func, (torch.randn(2, 400, 8, 128),
                                            torch.randn(2, 555, 2, 2, 128)), (),
         lambda a, b: (a, *b.unbind(2)), dashgen.flash_attn_func, ()),
        (dashgen.flash_attn_varlen_qkvpacked_func, (torch.randn(1000, 3, 4, 128),), (cu, 699),
         lambda t: t.unbind(1), dashgen.flash_attn_varlen_func, (cu, cu, 699, 699)),
        (dashgen.flash_attn_varlen_kvpacked_func, (torch.randn(1000, 8, 64),
                                                   torch.randn(1000, 2, 2, 64)),
         (cu, cu, 699, 699), lambda a, b: (a, *b.unbind(1)), dashgen.flash_attn_varlen_func,
         (cu, cu, 699, 699)),
    ]
    for packed_fn, tensors, args, parts, unpacked_fn, unpacked_args in cases:
        tensors = [t.to("cuda", torch.bfloat16).requires_grad_() for t in tensors]
        o = packed_fn(*tensors, *args, causal=causal, deterministic=True)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, tensors, do)
        leaves = [t.detach().clone().requires_grad_() for t in parts(*tensors)]
        ref = unpacked_fn(*leaves, *unpacked_args, causal=causal, deterministic=True)
        assert torch.equal(o, ref), packed_fn.__name__
        for got, want in zip(parts(*grads), torch.autograd.grad(ref, leaves, do)):
            assert torch.equal(got, want), packed_fn.__name__


def test_sdpa_key_padding_mask_matches_float64_and_keeps_each_rows_bits(seed):
    """dashgen.sdpa with a boolean key-padding mask (row 0 keeps 700 of 1,024 keys, row 1 all,
    row 2 keys 100-899): output and gradients within 2x bf16 SDPA's error of float64 SDPA with
    the mask, padded keys' gradients zero, and a row's bits the same whatever another row
    holds."""
    q, k, v = bhsd(3, 8, 1024, 128), bhsd(3, 2, 1024, 128), bhsd(3, 2, 1024, 128)
    do = torch.randn_like(q)
    keep = torch.ones(3, 1, 1, 1024, dtype=torch.bool, device="cuda")
    keep[0, ..., 700:] = False
    keep[2, ..., :100] = keep[2, ..., 900:] = False

    def ours(q, k, v):
        return dashgen.sdpa(q, k, v, attn_mask=keep, enable_gqa=True)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)

    # dashgen.sdpa follows torch's deterministic flag: the bits below are the ordered backward's.
    with deterministic_algorithms(True):
        got = run(ours, q, k, v, do)
        other = run(ours, q, torch.cat([k[:2], k[2:] + 1]), v, do)
    ref = run(sdpa, *(t.double() for t in (q, k, v)), do.double())
    low = run(sdpa, q, k, v, do)
    for x, r, lo in zip(got, ref, low):
        assert rel_err(x, r) <= 2 * rel_err(lo, r) + 1e-3
    padded = ~keep[:, 0, 0]
    assert torch.equal(got[2].transpose(1, 2)[padded], torch.zeros_like(
        got[2].transpose(1, 2)[padded]))
    assert torch.equal(got[0][:2], other[0][:2]) and torch.equal(got[1][:2], other[1][:2])
