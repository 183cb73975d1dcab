"""The backward's workspace (zeroed by the preprocess kernel, not by separate memsets): the
GQA dK/dV sums and the ordering counters, disjoint views of one buffer of whole 16-byte vectors."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen import Problem  # noqa: E402
from dashgen.runtime import _workspace  # noqa: E402


@pytest.mark.parametrize("heads_kv,seqlen_k,head_dim", [(8, 300, 64), (2, 257, 128), (1, 1, 64)])
def test_workspace_parts_are_disjoint_views_of_whole_vectors(heads_kv, seqlen_k, head_dim):
    p = Problem(batch=2, heads_q=8, heads_kv=heads_kv, seqlen_q=300, seqlen_k=seqlen_k,
                head_dim=head_dim, mask="causal", block_m=64, block_n=128)
    workspace, dk, dv, dq_counters, dkv_counters = _workspace(p, torch.device("cpu"))
    assert workspace.dtype == torch.int32 and workspace.numel() % 4 == 0
    assert dq_counters.shape == (2, 8, p.num_m_blocks)
    if p.gqa:
        assert dk.shape == dv.shape == (2, heads_kv, p.num_n_blocks * 128, head_dim)
        assert dk.dtype == dv.dtype == torch.float32
        assert dkv_counters.shape == (2, heads_kv, p.num_n_blocks)
    else:
        assert dk.numel() == dv.numel() == dkv_counters.numel() == 0
    parts = [dk, dv, dq_counters, dkv_counters]
    assert sum(t.numel() for t in parts) <= workspace.numel() < sum(t.numel() for t in parts) + 4
    # Every part lives inside the one buffer, with no overlap: filling each with its index
    # leaves exactly its own words set.
    workspace.zero_()
    for index, t in enumerate(parts, start=1):
        t.view(torch.int32).fill_(index)
    counts = torch.bincount(workspace, minlength=5).tolist()
    assert counts[1:] == [t.numel() for t in parts]
