"""Packed batches on an sm_90 GPU: dashgen.attention_varlen's bits are each sequence's bits alone
(dashgen.attention, batch 1) for every schedule, its values are within 2x PyTorch's bf16 error
of float64, flash_attn_varlen_func returns the same bits and FlashAttention's lse layout, and
the op traces under torch.compile (dynamic shapes, one graph for packs of other lengths) and
replays in a CUDA graph with new lengths. lab/varlen_invariance.py runs the same checks
over many more packs.

Run: PYTHONPATH=. python3 -m pytest lab/tests/gpu/test_varlen_gpu.py -q
"""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402

import varlen_invariance as vi  # noqa: E402  (lab/ is on the path: the root conftest.py)

pytestmark = pytest.mark.gpu

CASES = [(64, 8, 2), (96, 6, 3), (128, 4, 4)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, heads_q, heads_kv", CASES)
def test_packed_bits_are_each_sequences_alone(causal, head_dim, heads_q, heads_kv, seed):
    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for schedule in vi.SCHEDULES[causal]:
        lq = [0, 1, 77, 128, 129, 700, 1500, 3]
        lk = [5, 0, 77, 300, 129, 700, 1400, 3]
        pool = vi.Pool(lq, lk, heads_q, heads_kv, head_dim, causal, schedule, gen)
        for _ in range(4):
            members = [rng.randrange(len(lq)) for _ in range(rng.randint(1, 9))]
            assert vi.check_pack(pool, members, causal, schedule) is None, (schedule, members)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hybrid_runs_each_sequence_in_the_order_its_size_picks(causal, seed):
    """hybrid (a pack's auto): a sequence of at most 64 KV tiles takes the bits of shift /
    symmetric_shift alone, a longer one those of fa3 / descending alone, inside packs of both
    kinds at every position."""
    from dashgen.schedule.builders import HYBRID_MAX_TILES
    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    longest = 128 * HYBRID_MAX_TILES  # 128-key tiles
    lengths = [longest + 77, longest, 700, 1, 0, 130]
    together, ordered = ("symmetric_shift", "descending") if causal else ("shift", "fa3")
    pool = vi.Pool(lengths, lengths, 4, 2, 128, causal, "hybrid", gen)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        (q, k, v, do), alone = pool.items[i]
        named = vi.grads(lambda a, c, d: dashgen.attention(
            a[None], c[None], d[None], causal=causal, deterministic=True,
            schedule=ordered if i == 0 else together)[0], q, k, v, do)
        for name, x, y in zip(("o", "dq", "dk", "dv"), alone, named):
            assert torch.equal(x, y), (n, name)
    for members in ([0, 2, 3, 5], [2, 0], [5, 1, 4, 0, 2], [1, 2, 5]):
        assert vi.check_pack(pool, members, causal, "hybrid") is None, members
    for _ in range(3):
        members = [rng.randrange(len(lengths)) for _ in range(rng.randint(1, 6))]
        assert vi.check_pack(pool, members, causal, "hybrid") is None, members


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp16_packs_are_each_sequences_alone_and_accurate(causal, seed, monkeypatch):
    monkeypatch.setattr(vi, "DTYPE", torch.float16)
    rng = random.Random(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool = vi.Pool([0, 1, 130, 700], [3, 0, 130, 650], 8, 2, 64, causal, "fa3", gen)
    for _ in range(3):
        members = [rng.randrange(4) for _ in range(rng.randint(1, 6))]
        assert vi.check_pack(pool, members, causal, "fa3") is None, members
    err = vi.float64_error([500, 1, 0, 900], 4, 4, 128, causal, gen)
    assert all(e["within_2x"] for e in err.values()), err


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, heads_q, heads_kv", CASES)
def test_packed_values_against_float64(causal, head_dim, heads_q, heads_kv, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    err = vi.float64_error([700, 0, 1, 129, 1000], heads_q, heads_kv, head_dim, causal, gen)
    assert all(e["within_2x"] for e in err.values()), err


def _pack(lengths, heads_q=4, heads_kv=2, head_dim=64, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return vi.pack(lengths, lengths, heads_q, heads_kv, head_dim, gen)


def test_flash_attn_varlen_func_bits_and_lse_layout():
    lengths = [300, 0, 1, 1000]
    q, k, v, do, cu, _ = _pack(lengths)
    out, lse, none = dashgen.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000, causal=True,
                                                    deterministic=True, return_attn_probs=True)
    assert none is None and lse.shape == (q.shape[1], q.shape[0])
    ref = dashgen.attention_varlen(q, k, v, cu, cu, 1000, 1000, causal=True, deterministic=True)
    assert torch.equal(out, ref)
    offsets = cu.tolist()
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        s = slice(offsets[b], offsets[b + 1])
        _, alone = dashgen.attention(q[s][None], k[s][None], v[s][None], causal=True,
                                     return_lse=True)
        assert torch.equal(lse[:, s], alone[0]), b


def test_cpu_offsets_are_checked_and_copied():
    q, k, v, _, cu, _ = _pack([200, 50])
    cpu = cu.cpu()
    assert torch.equal(dashgen.attention_varlen(q, k, v, cpu, cpu, 200, 200),
                       dashgen.attention_varlen(q, k, v, cu, cu, 200, 200))
    with pytest.raises(ValueError, match="max_seqlen"):
        dashgen.attention_varlen(q, k, v, cpu, cpu, 100, 200)
    with pytest.raises(ValueError, match="cu_seqlens_q must rise"):
        dashgen.attention_varlen(q, k, v, torch.tensor([0, 10, 200], dtype=torch.int32), cpu,
                                 200, 200)


def test_torch_compile_one_graph_for_new_lengths():
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v, cu, m: dashgen.attention_varlen(q, k, v, cu, cu, m, m, causal=True,
                                                        deterministic=True),
        fullgraph=True, dynamic=True)
    from torch._dynamo.utils import counters
    counters.clear()
    for lengths in ([300, 500, 7], [128, 1, 0, 900, 40], [64, 64]):
        q, k, v, do, cu, _ = _pack(lengths)
        m = max(lengths)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = compiled(*leaves, cu, m)
        got = (o, *torch.autograd.grad(o, leaves, do))
        eager = vi.grads(lambda a, b, c: dashgen.attention_varlen(
            a, b, c, cu, cu, m, m, causal=True, deterministic=True), q, k, v, do)
        for x, y in zip(got, eager):
            assert torch.equal(x, y)
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_cuda_graph_replays_new_lengths():
    total = 1200
    q, k, v, do, cu, _ = _pack([600, 600])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    # The captured launch's max_seqlen must bound every pack it replays (1100 tokens here).
    def step():
        o = dashgen.attention_varlen(*leaves, cu, cu, 1100, 1100, causal=True,
                                     deterministic=True)
        return (o, *torch.autograd.grad(o, leaves, do))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for lengths in ([100, 1100], [1024, 176], [600, 600]):
        cu.copy_(torch.tensor([0, lengths[0], total], dtype=torch.int32))
        graph.replay()
        eager = vi.grads(lambda a, b, c: dashgen.attention_varlen(
            a, b, c, cu, cu, 1100, 1100, causal=True, deterministic=True), q, k, v, do)
        for x, y in zip(captured, eager):
            assert torch.equal(x, y), lengths
