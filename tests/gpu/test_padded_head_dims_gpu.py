"""The padded head dims beside 96 (variants.KERNEL_HEAD_DIMS: 32 and 48 in the 64 kernels, 80
and 112 in the 128 ones) on an sm_90 GPU: against float64 under every schedule that serves the
problem, both masks, GQA/MQA, fp16, the unordered mode, a window and soft-capping; bits across
repeats beside a busy stream; a pack gives each sequence its bits alone; FA3's interface.
These tests passing (H100, 2026-12-07: 93 passed) moved them from BACKWARD_BUILT_HEAD_DIMS into
HEAD_DIMS.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_padded_head_dims_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.codegen import variants  # noqa: E402

import test_wide_head_dims_gpu as wide  # noqa: E402

pytestmark = pytest.mark.gpu

PADDED = tuple(d for d in variants.KERNEL_HEAD_DIMS if d != 96)  # 96: test_wide_head_dims_gpu


def test_the_padded_head_dims_are_served():
    assert PADDED == (32, 48, 80, 112) and set(PADDED) <= set(variants.served_head_dims())


@wide.LENGTHS
@wide.HEADS
@wide.MASKS
@pytest.mark.parametrize("head_dim", PADDED)
def test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q, seqlen_k,
                                        sm_count, seed):
    wide.test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q,
                                             seqlen_k, sm_count, seed)


@wide.MASKS
@pytest.mark.parametrize("head_dim", PADDED)
def test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed):
    wide.test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed)


@pytest.mark.parametrize("head_dim", PADDED)
def test_a_window_and_soft_capping_match_float64(head_dim, seed):
    wide.test_a_window_and_soft_capping_match_float64(head_dim, seed)


@pytest.mark.parametrize("head_dim, causal, schedule",
                         [(80, False, "shift"), (80, True, "spt_listed"), (32, True, "spt"),
                          (112, True, "symmetric_shift")])
def test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                sm_count, seed):
    wide.test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                     sm_count, seed)


@pytest.mark.parametrize("heads_kv", [8, 2])
@pytest.mark.parametrize("head_dim", PADDED)
def test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed):
    wide.test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed)


@pytest.mark.parametrize("head_dim", PADDED)
def test_fa3s_interface_gives_dashgen_attentions_bits(head_dim, seed):
    """FA3 pads these head dims into its own kernels (80 into 96); through its interface dashgen
    gives dashgen.attention's bits, deterministic, with the lse FA3 returns."""
    import dashgen
    from dashgen.interfaces import flash_attn_interface as fa3
    from test_attention_gpu import out_and_grads
    q, k, v = (torch.randn(2, 500, h, head_dim, device="cuda", dtype=torch.bfloat16)
               for h in (4, 2, 2))
    do = torch.randn_like(q)
    ours = out_and_grads(lambda *t: fa3.flash_attn_func(*t, causal=True, deterministic=True),
                         q, k, v, do)
    ref = out_and_grads(lambda *t: dashgen.attention(*t, causal=True, deterministic=True),
                        q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
