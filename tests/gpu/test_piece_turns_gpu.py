"""A dQ turn a piece (Overrides(piece_turns=True), BwdDqWriter::land_pieces_in_turns) on an
sm_90 GPU: the same adds in the same order as one turn a tile, so the same bits as the served
kernel, at 192 and 256, both masks, GQA, several schedules and worker counts, and across repeats
beside a busy stream. A candidate: no policy picks it until these pass and it is timed
(`lab/time_kernels.py --compare piece_turns`).

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_piece_turns_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.runtime.select import Overrides  # noqa: E402

from test_attention_gpu import REPEATS, Case, busy_mismatches  # noqa: E402

pytestmark = pytest.mark.gpu

TURNS = Overrides(piece_turns=True)


@pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (8, 2)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_a_turn_a_piece_gives_the_served_bits(head_dim, causal, heads_q, heads_kv, sm_count,
                                              seed):
    case = Case(2, heads_q, heads_kv, 1500, 1500, head_dim, causal)
    plans = [("spt_listed", sm_count), ("fa3", 7),
             ("symmetric_shift" if causal else "shift", sm_count)]
    for schedule, workers in plans:
        served = case.run(Overrides(), schedule, workers)
        turns = case.run(TURNS, schedule, workers)
        differ = [name for name, a, b in zip(("o", "dq", "dk", "dv"), served, turns)
                  if not torch.equal(a, b)]
        assert not differ, f"{schedule} on {workers} workers: {differ} differ"
    assert not case.errors(turns, dict(piece_turns=True))


@pytest.mark.parametrize("head_dim", [192, 256])
def test_a_turn_a_piece_keeps_its_bits_beside_a_busy_stream(head_dim, sm_count, seed):
    case = Case(1, 8, 8, 4096, 4096, head_dim, True)
    first = case.run(TURNS, "spt_listed", sm_count)
    mismatches = busy_mismatches(lambda: case.run(TURNS, "spt_listed", sm_count), first,
                                 REPEATS // 10)
    assert not mismatches, f"calls {mismatches[:10]} of {REPEATS // 10} changed bits"
