"""Sliding windows (window_size=) on an sm_90 GPU: FlashAttention's semantics (query row i sees
keys i + off - left .. i + off + right, off = seqlen_k - seqlen_q, -1 an open side; causal sets
right to 0), against float64 within 2x PyTorch's own error in the input dtype under every
schedule a window runs, both modes and head dims, GQA; rows that see no key and keys no row sees;
bits across repeats beside a busy stream and across worker counts; flash_attn_func's and
FA3's interface's window_size are attention's.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_window_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.codegen.variants import WINDOW_SCHEDULES  # noqa: E402

from test_attention_gpu import (REPEATS, ZERO_RMS, ZERO_TOLERANCE_RMS,  # noqa: E402
                                busy_mismatches, out_and_grads, rel_err, rms)

pytestmark = pytest.mark.gpu


def windowed_attention(q, k, v, window, scale):
    """FlashAttention's reference with a window, in q's dtype, (batch, seqlen, heads,
    head_dim); a row that sees no key gives 0."""
    left, right = window
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(group, 2).transpose(1, 2)
    vt = v.repeat_interleave(group, 2).transpose(1, 2)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    off = k.shape[1] - q.shape[1]
    i = torch.arange(q.shape[1], device=q.device)[:, None]
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    keep = torch.ones_like(j - i, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + off - left
    if right >= 0:
        keep &= j <= i + off + right
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, -1).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    return (probs @ vt).transpose(1, 2)


def inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16):
    make = lambda s, h: torch.randn(batch, s, h, head_dim, device="cuda", dtype=dtype)  # noqa
    return make(seqlen_q, heads_q), make(seqlen_k, heads_kv), make(seqlen_k, heads_kv), \
        make(seqlen_q, heads_q)


def failures(q, k, v, do, window, **options) -> list[str]:
    scale = q.shape[-1] ** -0.5
    ref_fn = lambda q, k, v: windowed_attention(q, k, v, window, scale)  # noqa: E731
    ref = out_and_grads(ref_fn, *(t.double() for t in (q, k, v)), do.double())
    torch_err = [rel_err(x, r) for x, r in zip(out_and_grads(ref_fn, q, k, v, do), ref)]
    ours = out_and_grads(lambda q, k, v: dashgen.attention(q, k, v, window_size=window,
                                                           **options), q, k, v, do)
    bad = []
    for name, x, r, limit in zip(("o", "dq", "dk", "dv"), ours, ref, torch_err):
        if rms(r) < ZERO_RMS:
            # Zero in exact math (window (0, 0): each row sees one key, so dS = 0): the kernel
            # must stay at float32 noise.
            if not rms(x) < ZERO_TOLERANCE_RMS:
                bad.append(f"{options} window={window}: {name} should be ~0, rms {rms(x):.3e}")
            continue
        err = rel_err(x, r)
        if not (err <= 2 * limit + 1e-6):  # also catches NaN
            bad.append(f"{options} window={window}: {name} error {err:.3e} > 2 x torch's "
                       f"{limit:.3e}")
    return bad


# Narrower and wider than a tile, open on one side, Mistral's causal window (left, 0), a window
# past the sequence's ends.
WINDOWS = [(64, 0), (200, 33), (0, 0), (300, -1), (-1, 150), (5000, 5000)]


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 1000), (300, 900), (900, 300), (257, 257)],
                         ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_window_matches_float64_under_every_schedule(head_dim, seqlen_q, seqlen_k, seed):
    q, k, v, do = inputs(2, seqlen_q, seqlen_k, 8, 2, head_dim)
    plans = [dict(schedule=name, deterministic=True) for name in WINDOW_SCHEDULES]
    plans += [dict(deterministic=False), dict(deterministic=True, num_workers=7)]
    bad = [msg for window in WINDOWS for plan in plans
           for msg in failures(q, k, v, do, window, **plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_window_mha_and_fp16(head_dim, seed):
    q, k, v, do = inputs(1, 700, 700, 4, 4, head_dim, dtype=torch.float16)
    bad = [msg for window in ((100, 0), (31, 77)) for msg in failures(q, k, v, do, window)]
    assert not bad, "\n".join(bad)


def test_causal_with_a_window_is_the_window_with_right_zero(seed):
    q, k, v, do = inputs(1, 513, 513, 4, 2, 128)
    run = lambda **kw: out_and_grads(  # noqa: E731
        lambda *t: dashgen.attention(*t, deterministic=True, **kw), q, k, v, do)
    a = run(causal=True, window_size=(100, 7))
    b = run(window_size=(100, 0))
    plain = run(causal=True, window_size=(-1, 7))
    causal = run(causal=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(plain, causal))


def test_unseen_keys_and_rows_get_zeros(seed):
    # seqlen_k - seqlen_q = 600 > left: keys 0 .. 499 are seen by no row; right = 0 with more
    # queries than keys elsewhere is covered above. MHA and GQA (the two dK/dV paths).
    for heads_kv in (4, 1):
        q, k, v, do = inputs(1, 200, 800, 4, heads_kv, 128)
        o, dq, dk, dv = out_and_grads(lambda *t: dashgen.attention(*t, window_size=(100, 0)),
                                      q, k, v, do)
        assert torch.equal(dk[:, :500], torch.zeros_like(dk[:, :500]))
        assert torch.equal(dv[:, :500], torch.zeros_like(dv[:, :500]))
        assert dk[:, 500:].abs().amax(-1).gt(0).all()
    q, k, v, do = inputs(1, 800, 200, 4, 4, 64)
    o, lse = dashgen.attention(q, k, v, window_size=(-1, 0), return_lse=True)
    assert torch.equal(o[:, :600], torch.zeros_like(o[:, :600]))
    assert bool(lse[:, :, :600].isneginf().all()) and bool(lse[:, :, 600:].isfinite().all())


@pytest.mark.parametrize("schedule", ["spt_listed", "spt", "fa3"])
def test_window_backward_is_bitwise_reproducible_beside_a_busy_stream(schedule, seed):
    q, k, v, do = (t.requires_grad_(i < 3) for i, t in
                   enumerate(inputs(2, 2000, 2000, 16, 4, 128)))
    o = dashgen.attention(q, k, v, window_size=(511, 0), schedule=schedule, deterministic=True)
    grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
    first = grad()
    few = torch.autograd.grad(dashgen.attention(q, k, v, window_size=(511, 0), schedule=schedule,
                                                deterministic=True, num_workers=5),
                              (q, k, v), do)
    assert all(torch.equal(x, y) for x, y in zip(few, first)), "bits follow the worker count"
    mismatches = busy_mismatches(grad, first, REPEATS)
    assert not mismatches, f"{len(mismatches)} of {REPEATS} calls differed: {mismatches[:5]}"


def test_the_flash_attn_interfaces_window_size_is_attentions(seed):
    from dashgen.interfaces import flash_attn_interface as fa3
    q, k, v, do = inputs(2, 600, 600, 8, 2, 128)
    theirs = out_and_grads(lambda *t: dashgen.attention(*t, causal=True, window_size=(127, 0),
                                                        deterministic=True), q, k, v, do)
    for fn in (dashgen.flash_attn_func, fa3.flash_attn_func):
        ours = out_and_grads(lambda *t: fn(*t, causal=True, window_size=(127, 0),
                                           deterministic=True), q, k, v, do)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), fn.__module__


@pytest.mark.parametrize("window", [(63, 0), (200, 31)], ids=str)
@pytest.mark.parametrize("head_dim, heads_kv", [(64, 2), (128, 8), (96, 2)])
def test_a_windowed_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, window, seed):
    """A pack under a window: each sequence's o, dq, dk, dv are the bits dashgen.attention gives
    it alone with the same window (spt's ranks both ways), keys no row of their sequence sees
    included (zeros)."""
    lengths_q, lengths_k = [1, 300, 0, 129, 700, 90], [1, 300, 40, 129, 700, 400]
    heads_q = 8
    make = lambda n, h: torch.randn(n, h, head_dim, device="cuda", dtype=torch.bfloat16)  # noqa
    q, do = make(sum(lengths_q), heads_q), make(sum(lengths_q), heads_q)
    k, v = make(sum(lengths_k), heads_kv), make(sum(lengths_k), heads_kv)
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32,  # noqa
                                device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = dashgen.attention_varlen(*leaves, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                 max(lengths_k), window_size=window, deterministic=True)
    grads = torch.autograd.grad(o, leaves, do)
    q0 = k0 = 0
    for nq, nk in zip(lengths_q, lengths_k):
        if nq and nk:
            alone = out_and_grads(lambda *t: dashgen.attention(
                *t, window_size=window, schedule="spt", deterministic=True),
                q[None, q0:q0 + nq], k[None, k0:k0 + nk], v[None, k0:k0 + nk],
                do[None, q0:q0 + nq])
            for name, x, y, rows in zip(("o", "dq", "dk", "dv"), (o.detach(), *grads), alone,
                                        (slice(q0, q0 + nq),) * 2 + (slice(k0, k0 + nk),) * 2):
                assert torch.equal(x[rows], y[0]), f"{name} of the sequence {nq}/{nk}"
        elif nk:  # keys without queries: zero gradients
            assert torch.equal(grads[1][k0:k0 + nk], torch.zeros_like(grads[1][k0:k0 + nk]))
        q0, k0 = q0 + nq, k0 + nk


@pytest.mark.parametrize("seqlen_q, seqlen_k, window", [
    (1000, 1000, (127, 0)), (1000, 1000, (200, 33)), (900, 300, (64, 0)), (300, 900, (100, 0))])
@pytest.mark.parametrize("heads_kv", [8, 2])
def test_the_fused_converter_under_a_window_changes_no_bits(seqlen_q, seqlen_k, window,
                                                           heads_kv, seed):
    """A window's dQ converted in the main kernel (the fused converter over WindowTiling's
    receiving tiles, the convert kernel zeroing the rows no key reaches: (900, 300) with
    (64, 0)) gives the convert kernel's bits, under spt_listed and fa3."""
    from dashgen.runtime.backward import backward
    from dashgen.runtime.forward import forward
    from dashgen.runtime.select import Overrides
    q, k, v, do = inputs(2, seqlen_q, seqlen_k, 8, heads_kv, 128)
    scale = 128 ** -0.5
    o, lse = forward(q, k, v, causal=False, softmax_scale=scale, window=window)
    for schedule in ("spt_listed", "fa3"):
        runs = [backward(do, q, k, v, o, lse, causal=False, softmax_scale=scale,
                         deterministic=True, schedule=schedule, num_workers=None,
                         overrides=Overrides(fused_convert=fused), window=window)
                for fused in (False, True)]
        differ = [name for name, a, b in zip(("dq", "dk", "dv"), *runs) if not torch.equal(a, b)]
        assert not differ, f"{schedule} window={window}: {differ} differ with the converter"
