"""The cluster-pair backward at head_dim 256 (attn/bwd_pair.cuh, Overrides(cluster_pair=True))
on an sm_90 GPU: against float64 (2x PyTorch's own error in the input dtype) under every
schedule that serves the pair's 128-key tiles, on the clusters the GPU holds and on a few,
both masks, odd tile counts (a pair whose second CTA has no keys), GQA, fp16, the unordered mode;
its bits across repeats beside a busy stream and across worker counts (fixed by the tiles and
the pairing, never by the workers). A candidate: no policy picks it until these pass and the
anchor kit times it (lab/notes/cluster-pair-plan.md).

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_cluster_pair_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen import list_schedules  # noqa: E402
from dashgen.codegen.variants import THREADS, BackwardVariant  # noqa: E402
from dashgen.runtime import launch  # noqa: E402
from dashgen.runtime.device import kernels  # noqa: E402
from dashgen.runtime.select import Overrides, pair_problem  # noqa: E402
from dashgen.schedule.builders import BUILDERS, unsupported_reason  # noqa: E402

from test_attention_gpu import REPEATS, Case, busy_mismatches  # noqa: E402

pytestmark = pytest.mark.gpu

PAIR = Overrides(cluster_pair=True)
FEW_WORKERS = 5  # fewer clusters than pair tiles: several waves


def clusters(causal: bool) -> int:
    """How many clusters of the pair's kernel this GPU holds at once (the most workers)."""
    variant = BackwardVariant("bf16", 256, causal, "fa3", cluster_pair=True)
    loaded = kernels(variant, torch.device("cuda"))
    return launch.max_active_clusters(loaded.main, 2, THREADS, loaded.smem_bytes)


def pair_plans(case: Case) -> list[tuple[str, int]]:
    """(schedule, workers) for every schedule that serves the pair's problem: on all the
    clusters, and on FEW_WORKERS where it is live there."""
    problem = pair_problem(case.problem)
    most = clusters(case.causal)
    plans = []
    for name in list_schedules():
        if unsupported_reason(name, problem) is not None:
            continue
        policy = BUILDERS[name]
        if policy.min_workers(problem) <= most:
            plans.append((name, policy.workers_used(problem, most)))
        if policy.min_workers(problem) <= FEW_WORKERS:
            plans.append((name, FEW_WORKERS))
    return plans


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(257, 257), (1000, 1000), (100, 257),
                                                (257, 100), (2048, 2048)], ids=str)
@pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (8, 2)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_schedule_on_the_pair_matches_float64(causal, heads_q, heads_kv, seqlen_q,
                                                    seqlen_k, seed):
    case = Case(2, heads_q, heads_kv, seqlen_q, seqlen_k, 256, causal)
    plans = pair_plans(case)
    assert plans
    bad = []
    for schedule, workers in plans:
        for deterministic in (True, False):
            ours = case.run(PAIR, schedule, workers, deterministic)
            bad += case.errors(ours, dict(schedule=schedule, num_workers=workers,
                                          deterministic=deterministic))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_pair_in_fp16_matches_float64(causal, seed):
    case = Case(1, 8, 8, 1000, 777, 256, causal, dtype=torch.float16)
    bad = [msg for schedule, workers in pair_plans(case)
           for msg in case.errors(case.run(PAIR, schedule, workers), dict(schedule=schedule))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_pairs_bits_hold_across_repeats_and_worker_counts(causal, seed):
    """The ordered pair: the same bits on every call beside a busy stream, and on any worker
    count of a schedule (the ranks are the 128-key tiles', the pairing the KV tiles')."""
    case = Case(1, 8, 8, 3000, 3000, 256, causal)
    schedule = "symmetric_shift" if causal else "shift"
    most = clusters(causal)
    fewest = BUILDERS[schedule].min_workers(pair_problem(case.problem))
    first = case.run(PAIR, schedule, most)
    for workers in sorted({max(FEW_WORKERS, fewest), most // 2 + 1}):
        other = case.run(PAIR, schedule, workers)
        assert all(torch.equal(a, b) for a, b in zip(first, other)), workers
    mismatches = busy_mismatches(lambda: case.run(PAIR, schedule, most), first, REPEATS // 10)
    assert not mismatches, f"calls {mismatches[:10]} of {REPEATS // 10} changed bits"


@pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (8, 2)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_late_add_gives_the_pairs_bits(causal, heads_q, heads_kv, seed):
    """Overrides(pair_late_add=True): the owner's last piece of a task gets the peer's added a
    task late, the same addition of the same two partials, so the pair's bits, ordered, on the
    clusters the GPU holds and on a few; and float64's accuracy in the unordered mode."""
    late = Overrides(cluster_pair=True, pair_late_add=True)
    case = Case(2, heads_q, heads_kv, 1000, 900, 256, causal)  # 15 KV tiles: a keyless CTA
    schedule = "symmetric_shift" if causal else "shift"
    few = max(FEW_WORKERS, BUILDERS[schedule].min_workers(pair_problem(case.problem)))
    for workers in (clusters(causal), few):
        pair = case.run(PAIR, schedule, workers)
        ours = case.run(late, schedule, workers)
        differ = [name for name, a, b in zip(("o", "dq", "dk", "dv"), pair, ours)
                  if not torch.equal(a, b)]
        assert not differ, f"{workers} workers: {differ} differ"
    assert not case.errors(ours, dict(pair_late_add=True))
    unordered = case.run(late, schedule, few, False)
    assert not case.errors(unordered, dict(pair_late_add=True, deterministic=False))
