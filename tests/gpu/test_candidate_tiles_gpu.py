"""The backward's candidate tiles (dashgen.codegen.variants.CANDIDATE_BACKWARD_CONSTANTS: built
and compiled, not yet served) on an sm_90 GPU, in place of the served ones for this module:
against float64 under every schedule that serves the problem, both masks, GQA/MQA, fp16, a
window and soft-capping; bits across repeats beside a busy stream; a pack gives each sequence
its bits alone. Passing here is what lets a candidate replace its BACKWARD_CONSTANTS entry.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_candidate_tiles_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.caches import clear_caches  # noqa: E402
from dashgen.codegen import variants  # noqa: E402

import test_wide_head_dims_gpu as wide  # noqa: E402

pytestmark = pytest.mark.gpu

CANDIDATE_HEAD_DIMS = sorted({d for d, _ in variants.CANDIDATE_BACKWARD_CONSTANTS})


@pytest.fixture(autouse=True)
def candidate_tiles(monkeypatch):
    """The candidates in BACKWARD_CONSTANTS' place (selections, schedules and kernels follow
    it), every in-process memo emptied before and after."""
    for key, constants in variants.CANDIDATE_BACKWARD_CONSTANTS.items():
        monkeypatch.setitem(variants.BACKWARD_CONSTANTS, key, constants)
    clear_caches()
    yield
    clear_caches()


def test_the_candidates_are_in_place():
    from dashgen.runtime.select import problem_for
    for (head_dim, causal), constants in variants.CANDIDATE_BACKWARD_CONSTANTS.items():
        problem = problem_for(1, 2, 2, 300, 300, head_dim, causal)
        assert (problem.block_m, problem.block_n) == (constants.block_m, constants.block_n)


@wide.LENGTHS
@wide.HEADS
@wide.MASKS
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q, seqlen_k,
                                        sm_count, seed):
    wide.test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q,
                                             seqlen_k, sm_count, seed)


@wide.MASKS
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed):
    wide.test_fp16_and_mqa_match_float64(head_dim, causal, sm_count, seed)


@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_a_window_and_soft_capping_match_float64(head_dim, seed):
    wide.test_a_window_and_soft_capping_match_float64(head_dim, seed)


@pytest.mark.parametrize("causal, schedule", [(False, "shift"), (True, "spt_listed")])
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                sm_count, seed):
    wide.test_backward_is_bitwise_reproducible_beside_a_busy_stream(head_dim, causal, schedule,
                                                                     sm_count, seed)


@pytest.mark.parametrize("heads_kv", [8, 2])
@pytest.mark.parametrize("head_dim", CANDIDATE_HEAD_DIMS)
def test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed):
    wide.test_a_pack_gives_each_sequence_its_bits_alone(head_dim, heads_kv, seed)
