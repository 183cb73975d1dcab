"""head_dim 192 and 256 on an sm_90 GPU: the forward and the swapped backward
(attn/bwd_mainloop_swapped.cuh) against float64, held to 2x PyTorch's own error in the input dtype, under every schedule that
serves the problem, both masks, GQA/MQA, fp16, the unordered mode, a window and soft-capping;
bits across repeats beside a busy stream; a pack gives each sequence its bits alone.
The runtime served both once these passed (H100, 2026-12-06).

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_wide_head_dims_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402

from test_attention_gpu import (REPEATS, Case, busy_mismatches, out_and_grads,  # noqa: E402
                                serving_plans)

pytestmark = pytest.mark.gpu

WIDE = (192, 256)  # the swapped backward's head dims


LENGTHS = pytest.mark.parametrize("seqlen_q, seqlen_k",
                                  [(257, 257), (1000, 1000), (100, 257), (257, 100)], ids=str)
HEADS = pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (8, 2)], ids=str)
MASKS = pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])


@LENGTHS
@HEADS
@MASKS
@pytest.mark.parametrize("head_dim", WIDE)
def test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q, seqlen_k,
                                        sm_count, seed):
    case = Case(2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    plans = serving_plans(case.problem, sm_count) + [dict(deterministic=False)]
    bad = [msg for plan in plans for msg in case.failures(**plan)]
    assert not bad, "\n".join(bad)


@MASKS
@pytest.mark.parametrize("head_dim", WIDE)
def test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed):
    case = Case(1, 8, 1, 700, 333, head_dim, causal, dtype=torch.float16)
    bad = [msg for plan in serving_plans(case.problem, sm_count) for msg in case.failures(**plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("head_dim", WIDE)
def test_a_window_and_soft_capping_match_float64(head_dim, seed):
    from test_softcap_gpu import failures as softcap_failures
    from test_window_gpu import failures as window_failures
    from test_window_gpu import inputs
    q, k, v, do = inputs(1, 600, 600, 4, 2, head_dim)
    bad = [msg for window in ((100, 0), (31, 77))
           for msg in window_failures(q, k, v, do, window, deterministic=True)]
    bad += softcap_failures(q, k, v, do, causal=True, softcap=30.0)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("head_dim, causal, schedule",
                         [(256, False, "shift"), (256, True, "spt_listed"), (192, True, "spt")])
def test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                sm_count, seed):
    q, k, v = (torch.randn(2, 1000, h, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for h in (8, 2, 2))
    do = torch.randn_like(q)
    o = dashgen.attention(q, k, v, causal=causal, schedule=schedule, deterministic=True,
                          num_workers=sm_count if schedule == "shift" else None)
    grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
    mismatches = busy_mismatches(grad, grad(), REPEATS)
    assert not mismatches, f"{len(mismatches)} of {REPEATS} calls differed, first {mismatches[:5]}"


PACK_LENGTHS = [1, 300, 129, 700, 90]


def pack_mismatches(q, k, v, do, lengths) -> list[str]:
    """Which of o, dq, dk, dv of the pack (q, k, v, do: the sequences' rows one after another)
    differ from each sequence's own fixed-length call, bit for bit. spt both ways: a pack's auto
    deal (hybrid) ranks its sequences' tiles otherwise."""
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = dashgen.attention_varlen(*leaves, cu, cu, max(lengths), max(lengths), causal=True,
                                 schedule="spt", deterministic=True)
    packed = (o.detach(), *torch.autograd.grad(o, leaves, do))
    bad, start = [], 0
    for n in lengths:
        rows = slice(start, start + n)
        alone = out_and_grads(lambda *t: dashgen.attention(*t, causal=True, schedule="spt",
                                                           deterministic=True),
                              q[None, rows], k[None, rows], v[None, rows], do[None, rows])
        bad += [f"{name} of the sequence of {n}"
                for name, x, y in zip(("o", "dq", "dk", "dv"), packed, alone)
                if not torch.equal(x[rows], y[0])]
        start += n
    return bad


@pytest.mark.parametrize("head_dim, heads_kv", [(256, 8), (256, 2), (192, 2)])
def test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed):
    make = lambda h: torch.randn(sum(PACK_LENGTHS), h, head_dim, device="cuda",  # noqa: E731
                                 dtype=torch.bfloat16)
    q, do, k, v = make(8), make(8), make(heads_kv), make(heads_kv)
    bad = pack_mismatches(q, k, v, do, PACK_LENGTHS)
    assert not bad, ", ".join(bad)


# -- q/k 192 with v 128 (DeepSeek-V3/R1's MLA): the swapped backward with V's 2 column blocks ---


@LENGTHS
@MASKS
def test_mla_matches_float64_under_every_schedule(causal, seqlen_q, seqlen_k, sm_count, seed):
    case = Case(2, 4, 4, seqlen_q, seqlen_k, 192, causal, head_dim_v=128)
    plans = serving_plans(case.problem, sm_count) + [dict(deterministic=False)]
    bad = [msg for plan in plans for msg in case.failures(**plan)]
    assert case.v.shape[-1] == 128 and not bad, "\n".join(bad)


@MASKS
def test_mla_fp16_matches_float64(causal, sm_count, seed):
    case = Case(1, 8, 8, 700, 333, 192, causal, dtype=torch.float16, head_dim_v=128)
    bad = [msg for plan in serving_plans(case.problem, sm_count) for msg in case.failures(**plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("causal, schedule", [(False, "shift"), (True, "spt_listed"),
                                              (True, "symmetric_shift")])
def test_mla_backward_is_bitwise_reproducible_beside_a_busy_stream(causal, schedule, sm_count,
                                                                    seed):
    q, k = (torch.randn(2, 1000, 8, 192, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    v = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    o = dashgen.attention(q, k, v, causal=causal, schedule=schedule, deterministic=True,
                          num_workers=sm_count if schedule == "shift" else None)
    assert o.shape == do.shape
    grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
    mismatches = busy_mismatches(grad, grad(), REPEATS)
    assert not mismatches, f"{len(mismatches)} of {REPEATS} calls differed, first {mismatches[:5]}"


def test_mla_through_fa3s_interface_matches_dashgen_attention(seed):
    from dashgen.interfaces.flash_attn_interface import flash_attn_func
    q, k = (torch.randn(2, 513, 4, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(2, 513, 4, 128, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(2, 513, 4, 128, device="cuda", dtype=torch.bfloat16)
    ours = out_and_grads(lambda *t: flash_attn_func(*t, causal=True, deterministic=True),
                         q, k, v, do)
    direct = out_and_grads(lambda *t: dashgen.attention(*t, causal=True, deterministic=True),
                           q, k, v, do)
    for name, x, y in zip(("o", "dq", "dk", "dv"), ours, direct):
        assert torch.equal(x, y), name


def test_mla_pack_gives_each_sequence_its_bits_alone(seed):
    """The packed MLA kernels: each sequence's o, dq, dk, dv are its own fixed-length call's,
    bit for bit, whose accuracy the tests above hold."""
    make = lambda d: torch.randn(sum(PACK_LENGTHS), 8, d, device="cuda",  # noqa: E731
                                 dtype=torch.bfloat16)
    q, k, v, do = make(192), make(192), make(128), make(128)
    bad = pack_mismatches(q, k, v, do, PACK_LENGTHS)
    assert not bad, ", ".join(bad)
