"""The built padded head dims (variants.BACKWARD_BUILT_HEAD_DIMS: 32 and 48 in the 64 kernels,
80 and 112 in the 128 ones, as 96 runs in the 128 ones) on an sm_90 GPU, opened for these tests
only (variants.OPENED_HEAD_DIMS): against float64 under every schedule that serves the problem,
both masks, GQA/MQA, fp16, the unordered mode, a window and soft-capping; bits across repeats
beside a busy stream; a pack gives each sequence its bits alone; FA3's interface. Passing here
is what lets a head_dim move from BACKWARD_BUILT_HEAD_DIMS to HEAD_DIMS.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_padded_head_dims_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.caches import clear_caches  # noqa: E402
from dashgen.codegen import variants  # noqa: E402

import test_wide_head_dims_gpu as wide  # noqa: E402

pytestmark = pytest.mark.gpu

BUILT = variants.BACKWARD_BUILT_HEAD_DIMS


@pytest.fixture(autouse=True)
def opened(monkeypatch):
    """The built head dims served for the test, every in-process memo emptied around it."""
    monkeypatch.setattr(variants, "OPENED_HEAD_DIMS", BUILT)
    clear_caches()
    yield
    clear_caches()


def test_the_built_head_dims_are_opened_and_refused_otherwise(monkeypatch):
    assert set(BUILT) <= set(variants.served_head_dims())
    monkeypatch.setattr(variants, "OPENED_HEAD_DIMS", ())
    import dashgen
    q = torch.randn(1, 64, 2, BUILT[0], device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^q has head_dim {BUILT[0]}; supported head_dims"):
        dashgen.attention(q, q, q)


@wide.LENGTHS
@wide.HEADS
@wide.MASKS
@pytest.mark.parametrize("head_dim", BUILT)
def test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q, seqlen_k,
                                        sm_count, seed):
    wide.test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q,
                                             seqlen_k, sm_count, seed)


@wide.MASKS
@pytest.mark.parametrize("head_dim", BUILT)
def test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed):
    wide.test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed)


@pytest.mark.parametrize("head_dim", BUILT)
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
@pytest.mark.parametrize("head_dim", BUILT)
def test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed):
    wide.test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed)


@pytest.mark.parametrize("head_dim", BUILT)
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
