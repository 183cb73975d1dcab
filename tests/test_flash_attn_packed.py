"""flash_attn 2.x's packed functions over dashgen (dashgen.interfaces.flash_attn): q, k and v
(or k and v) stacked in one tensor are taken apart, run as flash_attn_func /
flash_attn_varlen_func, and the gradient arrives in the stacked layout. The kernels are replaced
by float64 references of dashgen's contracts, so the outputs and gradients must be exactly those
of the unpacked functions on the parts."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.interfaces import flash_attn as fa2  # noqa: E402
from dashgen.runtime import op, op_varlen  # noqa: E402
from test_flash_attn_interface import dense_reference, packed_reference  # noqa: E402

# flash_attn 2.x's parameters after the tensors (flash_attn_func's, minus q, k, v).
OPTIONS = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
           "deterministic", "return_attn_probs"]


@pytest.fixture
def float64_kernels(monkeypatch):
    monkeypatch.setattr(op, "attention", lambda q, k, v, softmax_scale=None, **kwargs:
                        dense_reference(q, k, v, softmax_scale=softmax_scale, **kwargs))
    monkeypatch.setattr(op_varlen, "attention_varlen",
                        lambda q, k, v, *args, deterministic=None, **kwargs:
                        packed_reference(q, k, v, *args, **kwargs))


def test_the_signatures_are_flash_attns():
    expect = {"flash_attn_qkvpacked_func": ["qkv"],
              "flash_attn_kvpacked_func": ["q", "kv"],
              "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"],
              "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                                  "max_seqlen_q", "max_seqlen_k"]}
    for name, tensors in expect.items():
        assert list(inspect.signature(getattr(fa2, name)).parameters) == tensors + OPTIONS
        assert getattr(dashgen, name) is getattr(fa2, name)


def check(packed_fn, packed, parts, unpacked_fn, g):
    """packed_fn(packed) against unpacked_fn(*parts(packed)): o, lse and the gradients equal."""
    packed = [t.clone().requires_grad_() for t in packed]
    out, lse, mask = packed_fn(*packed)
    leaves = [t.detach().clone().requires_grad_() for t in parts(*packed)]
    ref, ref_lse, _ = unpacked_fn(*leaves)
    assert mask is None
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    do = torch.randn(out.shape, dtype=out.dtype, generator=g)
    grads = torch.autograd.grad(out, packed, do)
    ref_grads = torch.autograd.grad(ref, leaves, do)
    got = parts(*grads)
    for a, b in zip(got, ref_grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fixed_length_packed_functions_are_flash_attn_func_on_their_parts(float64_kernels,
                                                                         causal):
    g = torch.Generator().manual_seed(11 + causal)
    qkv = torch.randn(2, 13, 3, 4, 8, dtype=torch.float64, generator=g)
    q = torch.randn(2, 9, 4, 8, dtype=torch.float64, generator=g)
    kv = torch.randn(2, 13, 2, 2, 8, dtype=torch.float64, generator=g)  # GQA: 2 KV heads
    options = dict(causal=causal, softmax_scale=0.3, return_attn_probs=True)
    check(lambda t: fa2.flash_attn_qkvpacked_func(t, **options), [qkv],
          lambda t: t.unbind(2),
          lambda q_, k_, v_: fa2.flash_attn_func(q_, k_, v_, **options), g)
    check(lambda a, b: fa2.flash_attn_kvpacked_func(a, b, **options), [q, kv],
          lambda a, b: (a, *b.unbind(2)),
          lambda q_, k_, v_: fa2.flash_attn_func(q_, k_, v_, **options), g)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_packed_functions_are_flash_attn_varlen_func_on_their_parts(float64_kernels,
                                                                          causal):
    g = torch.Generator().manual_seed(21 + causal)
    cu = torch.tensor([0, 5, 5, 17, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 9, 21, 30], dtype=torch.int32)
    qkv = torch.randn(20, 3, 4, 8, dtype=torch.float64, generator=g)
    q = torch.randn(20, 4, 8, dtype=torch.float64, generator=g)
    kv = torch.randn(30, 2, 1, 8, dtype=torch.float64, generator=g)  # MQA
    options = dict(causal=causal, softmax_scale=0.4, return_attn_probs=True)
    check(lambda t: fa2.flash_attn_varlen_qkvpacked_func(t, cu, 12, **options), [qkv],
          lambda t: t.unbind(1),
          lambda q_, k_, v_: fa2.flash_attn_varlen_func(q_, k_, v_, cu, cu, 12, 12, **options),
          g)
    check(lambda a, b: fa2.flash_attn_varlen_kvpacked_func(a, b, cu, cu_k, 12, 12, **options),
          [q, kv], lambda a, b: (a, *b.unbind(1)),
          lambda q_, k_, v_: fa2.flash_attn_varlen_func(q_, k_, v_, cu, cu_k, 12, 12,
                                                        **options), g)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: fa2.flash_attn_qkvpacked_func([1]), TypeError, r"^qkv must be a tensor, got list$"),
    (lambda: fa2.flash_attn_qkvpacked_func(torch.zeros(2, 5, 2, 4, 8)), ValueError,
     r"^qkv must be \(batch, seqlen, 3, heads, head_dim\), got \(2, 5, 2, 4, 8\)$"),
    (lambda: fa2.flash_attn_kvpacked_func(torch.zeros(2, 5, 4, 8), torch.zeros(2, 5, 4, 8)),
     ValueError, r"^kv must be \(batch, seqlen_k, 2, heads_kv, head_dim\), got \(2, 5, 4, 8\)$"),
    (lambda: fa2.flash_attn_varlen_qkvpacked_func(torch.zeros(5, 3, 4, 8, 1), None, 5),
     ValueError, r"^qkv must be \(total, 3, heads, head_dim\)"),
    (lambda: fa2.flash_attn_varlen_kvpacked_func(torch.zeros(5, 4, 8), torch.zeros(5, 3, 4, 8),
                                                 None, None, 5, 5),
     ValueError, r"^kv must be \(total_k, 2, heads_kv, head_dim\), got \(5, 3, 4, 8\)$"),
    (lambda: fa2.flash_attn_qkvpacked_func(torch.zeros(2, 5, 3, 4, 8), dropout_p=0.1),
     ValueError, r"^dropout_p: dashgen has no dropout"),
])
def test_packed_layouts_and_refusals_are_named(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


@pytest.mark.parametrize("head_dim", [64, 72])
def test_the_stacked_functions_trace_whole_under_torch_compile(monkeypatch, head_dim):
    """A training step under torch.compile(fullgraph=True): FA3's and flash_attn's qkv-stacked
    functions trace without a graph break (the stack taken apart by views; at 72 the zero
    padding into the 80 kernels and the cut back), and the compiled outputs and gradients are
    the eager ones."""
    from test_op_errors import FakeKernels
    from dashgen.caches import clear_caches
    from dashgen.interfaces import flash_attn_interface as fa3
    from dashgen.runtime import checks
    fake = FakeKernels()
    monkeypatch.setattr(op, "_kernels", lambda: fake)
    monkeypatch.setattr(checks, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(checks, "_device_facts", lambda index: (9, 0, 132, "NVIDIA H200"))
    clear_caches()
    torch._dynamo.reset()
    torch.manual_seed(0)
    qkv = torch.randn(2, 64, 3, 4, head_dim, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(2, 64, 4, head_dim, dtype=torch.bfloat16)
    for fn in (lambda t: fa2.flash_attn_qkvpacked_func(t, causal=True, deterministic=True),
               lambda t: fa3.flash_attn_qkvpacked_func(t, causal=True, deterministic=True)):
        eager = fn(qkv)
        (eager_grad,) = torch.autograd.grad(eager, qkv, do)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = compiled(qkv)
        (grad,) = torch.autograd.grad(out, qkv, do)
        assert torch.equal(out, eager) and torch.equal(grad, eager_grad)
        torch._dynamo.reset()
    clear_caches()
