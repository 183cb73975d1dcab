"""The backward's candidates (dashgen.codegen.variants.BACKWARD_CANDIDATES: built and compiled,
not yet served) on an sm_90 GPU, each in place of the served constants in its turn:
against float64 under every schedule that serves the problem, both masks, GQA/MQA, fp16, a
window and soft-capping; bits across repeats beside a busy stream; a pack gives each sequence
its bits alone. Passing here is what lets a candidate replace its BACKWARD_CONSTANTS entry.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_candidate_tiles_gpu.py -q [-k 256-64x80]
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.caches import clear_caches  # noqa: E402
from dashgen.codegen import variants  # noqa: E402

import test_wide_head_dims_gpu as wide  # noqa: E402

pytestmark = pytest.mark.gpu

SERVED = dict(variants.BACKWARD_CONSTANTS)  # before any candidate takes their place
CANDIDATE_HEAD_DIMS = sorted({d for table in variants.BACKWARD_CANDIDATES.values()
                              for d, _ in table})


@pytest.fixture(autouse=True, params=sorted(variants.BACKWARD_CANDIDATES))
def candidate(request, monkeypatch):
    """One candidate in BACKWARD_CONSTANTS' place (selections, schedules and kernels follow
    it), every in-process memo emptied before and after."""
    for key, constants in variants.BACKWARD_CANDIDATES[request.param].items():
        monkeypatch.setitem(variants.BACKWARD_CONSTANTS, key, constants)
    clear_caches()
    yield request.param
    clear_caches()


def covered(candidate: str, head_dim: int) -> None:
    """Skip a head_dim the candidate leaves to the served constants (the served kernels have
    their own tests)."""
    if not any(d == head_dim for d, _ in variants.BACKWARD_CANDIDATES[candidate]):
        pytest.skip(f"{candidate} does not cover head_dim {head_dim}")


def test_the_candidates_are_in_place(candidate):
    from dashgen.runtime.select import problem_for
    for (head_dim, causal), constants in variants.BACKWARD_CANDIDATES[candidate].items():
        problem = problem_for(1, 2, 2, 300, 300, head_dim, causal)
        assert (problem.block_m, problem.block_n) == (constants.block_m, constants.block_n)
        assert variants.BACKWARD_CONSTANTS[head_dim, causal] == constants


@wide.LENGTHS
@wide.HEADS
@wide.MASKS
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_every_schedule_matches_float64(candidate, head_dim, causal, heads_q, heads_kv,
                                        seqlen_q, seqlen_k, sm_count, seed):
    covered(candidate, head_dim)
    wide.test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q,
                                             seqlen_k, sm_count, seed)


@wide.MASKS
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_fp16_and_mqa_match_float64(candidate, head_dim, causal, sm_count, seed):
    covered(candidate, head_dim)
    wide.test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed)


@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_a_window_and_soft_capping_match_float64(candidate, head_dim, seed):
    covered(candidate, head_dim)
    wide.test_a_window_and_soft_capping_match_float64(head_dim, seed)


@pytest.mark.parametrize("causal, schedule", [(False, "shift"), (True, "spt_listed")])
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_backward_is_bitwise_reproducible_beside_a_busy_stream(candidate, head_dim, causal,
                                                                schedule, sm_count, seed):
    covered(candidate, head_dim)
    wide.test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                     sm_count, seed)


@pytest.mark.parametrize("heads_kv", [8, 2])
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_a_pack_gives_each_sequence_its_bits_alone(candidate, head_dim, heads_kv, seed):
    covered(candidate, head_dim)
    wide.test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed)


@pytest.mark.parametrize("causal, schedule", [(False, "shift"), (True, "spt_listed")])
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_a_candidate_with_the_served_tiles_gives_the_served_bits(candidate, head_dim, causal,
                                                                 schedule, monkeypatch, seed):
    """Where a candidate keeps the served tiles (a change of how, not what, it adds), o, dQ,
    dK and dV equal the served kernel's bit for bit, GQA included."""
    import dashgen
    from test_attention_gpu import out_and_grads
    covered(candidate, head_dim)
    key = (head_dim, causal)
    mine, served = variants.BACKWARD_CANDIDATES[candidate][key], SERVED[key]
    if (mine.block_m, mine.block_n) != (served.block_m, served.block_n):
        pytest.skip(f"{candidate} changes the tiles at {key}: other bits by the contract")
    q, k, v = (torch.randn(2, 700, h, head_dim, device="cuda", dtype=torch.bfloat16)
               for h in (8, 2, 2))
    do = torch.randn_like(q)
    run = lambda: out_and_grads(  # noqa: E731
        lambda *t: dashgen.attention(*t, causal=causal, schedule=schedule, deterministic=True),
        q, k, v, do)
    with_candidate = run()
    monkeypatch.setitem(variants.BACKWARD_CONSTANTS, key, served)
    clear_caches()
    with_served = run()
    differ = [name for name, a, b in zip(("o", "dq", "dk", "dv"), with_candidate, with_served)
              if not torch.equal(a, b)]
    assert not differ, f"{candidate} against the served kernel: {differ} differ"
