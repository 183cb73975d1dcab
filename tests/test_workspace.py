"""The backward's scratch (one allocation; the preprocess kernel zeroes its `zeroed` part, no
separate memsets): the fp32 dQ accumulator, rowsum(dO * O), the staged statistics, GQA's dK/dV
sums and the ordering counters, disjoint views, each starting on a 16-byte boundary."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from dashgen import Problem  # noqa: E402
from dashgen.runtime.workspace import WorkspaceLayout  # noqa: E402


@pytest.mark.parametrize("heads_kv,seqlen_q,seqlen_k,head_dim", [
    (8, 300, 300, 64), (2, 301, 257, 128), (1, 1, 1, 64), (8, 3, 7, 128)])
def test_workspace_parts_are_disjoint_aligned_views(heads_kv, seqlen_q, seqlen_k, head_dim):
    p = Problem(batch=2, heads_q=8, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                head_dim=head_dim, mask="causal", block_m=64, block_n=128)
    layout = WorkspaceLayout(p)
    buffer = torch.empty(layout.floats, dtype=torch.float32)
    ws = SimpleNamespace(buffer=buffer, zeroed=buffer[layout.zeroed_offset:],
                         **layout.views(buffer))
    assert ws.dq_accum.shape == (2, 8, p.num_m_blocks * 64, head_dim)
    assert ws.dpsum.shape == (2, 8, seqlen_q)
    # Staged statistics: one 2 x 64-float chunk per query tile, each a whole number of 16-byte
    # vectors from an aligned start, as the producer's bulk copy needs.
    assert ws.stats.shape == (2, 8, p.num_m_blocks, 2, 64)
    assert ws.dq_counters.shape == (2, 8, p.num_m_blocks)
    assert ws.dq_counters.dtype == ws.dkv_counters.dtype == torch.int32
    if p.gqa:
        assert ws.dk_accum.shape == ws.dv_accum.shape == (2, heads_kv, p.num_n_blocks * 128,
                                                          head_dim)
        assert ws.dkv_counters.shape == (2, heads_kv, p.num_n_blocks)
    else:
        assert ws.dk_accum.numel() == ws.dv_accum.numel() == ws.dkv_counters.numel() == 0
    parts = [ws.dq_accum, ws.dpsum, ws.stats, ws.dk_accum, ws.dv_accum, ws.dq_counters,
             ws.dkv_counters]
    base = ws.buffer.data_ptr()
    filled = [t for t in parts if t.numel()]  # an empty view has no address (data_ptr 0)
    for t in filled:
        assert (t.data_ptr() - base) % 16 == 0
    # What the preprocess kernel zeroes as 16-byte vectors covers the sums and the counters.
    assert ws.zeroed.numel() % 4 == 0 and (ws.zeroed.data_ptr() - base) % 16 == 0
    zeroed_end = ws.zeroed.data_ptr() + 4 * ws.zeroed.numel()
    for t in (t for t in parts[3:] if t.numel()):
        assert ws.zeroed.data_ptr() <= t.data_ptr() <= t.data_ptr() + 4 * t.numel() <= zeroed_end
    for t in (t for t in parts[:3] if t.numel()):  # written by the kernels, not zeroed
        assert t.data_ptr() + 4 * t.numel() <= ws.zeroed.data_ptr()
    # No two parts overlap: writing each its index leaves exactly its own words set.
    ws.buffer.view(torch.int32).zero_()
    for index, t in enumerate(parts, start=1):
        t.view(torch.int32).fill_(index)
    counts = torch.bincount(ws.buffer.view(torch.int32), minlength=len(parts) + 1).tolist()
    assert counts[1:] == [t.numel() for t in parts]
