"""One definition, two readings, for packs: the pack walk of templates/include/dashgen/sched/
pack.cuh (compiled here as host code with g++) enumerates exactly the Python IR of a pack
(dashgen.schedule.builders.base.pack_deal): task for task, rank for rank, segment for segment,
on hypothesis-drawn packs (empty and one-token sequences, other key lengths, GQA) and every
worker count from the schedule's minimum to 132."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dashgen import Problem
from dashgen.schedule.problem import Mask
from dashgen.schedule.builders import BUILDERS
from test_policy_header import (COMMON, PACK_POLICIES, POLICY_OBJECTS, TILES, WINDOW_POLICIES,
                                build, build_driver, ir_tasks, mask_arg, needs_gxx, run_walks,
                                window_masks)

# argv: policy id, block_m, mask (0 full, 1 causal, 2 a window), heads_q, heads_kv, the window's
# left and right (read under mask 2), sequences, their seqlen_q, their seqlen_k, then worker
# counts; for each count "W <count>", then per worker its tasks
# "b,h,n,m,dq_rank,dkv_rank,seg_start,seg_end" in order.
DRIVER = COMMON + r"""
#include <algorithm>
#include <type_traits>
#include <vector>
#include "dashgen/sched/pack.cuh"

struct Pack {
  int heads_q_, heads_kv_, workers_, left_, right_;
  std::vector<int> seqlen_q_, seqlen_k_, order_, unit_seq_, unit_index_;
  int heads_q() const { return heads_q_; }
  int window_left() const { return left_; }
  int window_right() const { return right_; }
  int group() const { return heads_q_ / heads_kv_; }
  int workers() const { return workers_; }
  int seqlen_q(int b) const { return seqlen_q_[b]; }
  int seqlen_k(int b) const { return seqlen_k_[b]; }
  int dealt() const { return static_cast<int>(order_.size()); }
  int order(int k) const { return order_[k]; }
  int units_dealt() const { return static_cast<int>(unit_seq_.size()); }
  int unit_seq(int k) const { return unit_seq_[k]; }
  int unit_index(int k) const { return unit_index_[k]; }
};

template <class Policy, class Tl>
static void walk(Pack pack, int workers) {
  // The launch's order: the sequences with tasks, sorted by sched::dealt_before.
  std::vector<int> tasks(pack.seqlen_q_.size());
  pack.order_.clear();
  for (size_t b = 0; b < tasks.size(); ++b) {
    tasks[b] = sequence_tasks<Policy>(Tl::of(pack, static_cast<int>(b)));
    if (tasks[b] > 0) pack.order_.push_back(static_cast<int>(b));
  }
  std::sort(pack.order_.begin(), pack.order_.end(),
            [&](int a, int b) { return dealt_before(tasks[a], a, tasks[b], b); });
  // The units with tasks of the sequences that do not run together, sorted by
  // sched::unit_dealt_before (the plan kernel's order, tests/test_pack_plan_header.py).
  struct Unit { int key, place, u, b; };
  std::vector<Unit> units;
  for (int place = 0; place < pack.dealt(); ++place) {
    const int b = pack.order_[place];
    const Tl t = Tl::of(pack, b);
    if (Policy::together(t)) continue;
    for (int u = 0; u < Policy::units(t); ++u) {
      if (Policy::unit_tasks(t, u) > 0) units.push_back({deal_key<Policy>(t, u), place, u, b});
    }
  }
  std::sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) {
    return unit_dealt_before<Policy, Tl>(x.key, x.place, x.u, y.key, y.place, y.u);
  });
  pack.unit_seq_.clear();
  pack.unit_index_.clear();
  for (const Unit& x : units) {
    pack.unit_seq_.push_back(x.b);
    pack.unit_index_.push_back(x.u);
  }
  pack.workers_ = workers;
  std::printf("W %d\n", workers);
  for (int w = 0; w < workers; ++w) {
    PackWalk<Policy, Tl, Pack> walk(pack, w);
    print_walk(walk);
  }
}

template <class Tl>
static int run(int id, int argc, char** argv) {
  Pack pack{std::atoi(argv[4]), std::atoi(argv[5]), 0, std::atoi(argv[6]), std::atoi(argv[7]),
            {}, {}, {}, {}, {}};
  const int seqs = std::atoi(argv[8]);
  int a = 9;
  for (int b = 0; b < seqs; ++b) pack.seqlen_q_.push_back(std::atoi(argv[a++]));
  for (int b = 0; b < seqs; ++b) pack.seqlen_k_.push_back(std::atoi(argv[a++]));
  for (; a < argc; ++a) {
    const int workers = std::atoi(argv[a]);
    auto f = [&](auto policy) { walk<decltype(policy), Tl>(pack, workers); };
    int status;
    if constexpr (std::is_same_v<Tl, WindowTiling<64, 128>> ||
                  std::is_same_v<Tl, WindowTiling<128, 128>>) {
      status = with_ordered_policy<Tl>(id, f);  // the policies a window kernel runs
    } else {
      status = with_policy<Tl>(id, f);
    }
    if (status) return status;
  }
  return 0;
}

template <int kBlockM>
static int run_mask(int mask, int id, int argc, char** argv) {
  if (mask == 2) return run<WindowTiling<kBlockM, 128>>(id, argc, argv);
  if (mask == 1) return run<Tiling<kBlockM, 128, true>>(id, argc, argv);
  return run<Tiling<kBlockM, 128, false>>(id, argc, argv);
}

int main(int argc, char** argv) {
  if (argc < 10) return 2;
  const int id = std::atoi(argv[1]), block_m = std::atoi(argv[2]), mask = std::atoi(argv[3]);
  if (block_m == 64) return run_mask<64>(mask, id, argc, argv);
  if (block_m == 128) return run_mask<128>(mask, id, argc, argv);
  return 4;
}
"""

@pytest.fixture(scope="module")
def walk_pack(tmp_path_factory):
    """walk(name, pack, worker_counts) -> {count: per worker its task tuples}, from pack.cuh."""
    binary = build_driver(tmp_path_factory, "pack", DRIVER)

    def walk(name, problem, counts):
        return run_walks([str(binary), str(POLICY_OBJECTS[name].kernel_id), str(problem.block_m),
                          mask_arg(problem), str(problem.heads_q), str(problem.heads_kv),
                          *map(str, problem.mask.kernel_bounds()), str(problem.batch),
                          *map(str, problem.seqlens_q), *map(str, problem.seqlens_k),
                          *map(str, counts)])
    return walk


def compare(walk_pack, name, problem, counts=None):
    policy = POLICY_OBJECTS[name]
    if policy.supports(problem) is not None:
        return 0
    counts = counts or list(range(policy.min_workers(problem), 133))
    used = {c: policy.workers_used(problem, c) for c in counts}
    walked = walk_pack(name, problem, sorted(set(used.values())))
    for c in counts:
        expected = ir_tasks(build(name, problem, c))
        assert walked[used[c]] == expected, (name, problem.describe(), c)
    return len(counts)


length = st.one_of(st.sampled_from([0, 1, 63, 64, 65, 127, 128, 129]), st.integers(0, 1100))


@st.composite
def packs(draw):
    seqlens_q = draw(st.lists(length, min_size=1, max_size=5))
    seqlens_k = draw(st.one_of(st.none(), st.lists(length, min_size=len(seqlens_q),
                                                   max_size=len(seqlens_q))))
    heads_kv = draw(st.integers(1, 2))
    tiles = draw(st.sampled_from(TILES))
    return Problem.pack(seqlens_q, seqlens_k, heads_q=heads_kv * draw(st.integers(1, 2)),
                        heads_kv=heads_kv, head_dim=128 if tiles == (64, 128) else 64,
                        mask=draw(st.sampled_from(["full", "causal"])), block_m=tiles[0],
                        block_n=tiles[1])


@needs_gxx
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(problem=packs())
def test_the_pack_walk_enumerates_the_packs_ir(walk_pack, problem):
    checked = sum(compare(walk_pack, name, problem) for name in PACK_POLICIES)
    assert checked > 0


@st.composite
def window_packs(draw):
    """Packs under a sliding window: KV tiles and Q tiles without tasks inside sequences."""
    problem = draw(packs())
    text = draw(window_masks)
    left, right = (None if x == "None" else int(x) for x in text[7:].split(","))
    return Problem.pack(problem.seqlens_q, problem.seqlens_k, heads_q=problem.heads_q,
                        heads_kv=problem.heads_kv, head_dim=problem.head_dim,
                        mask=Mask(left, right), block_m=problem.block_m, block_n=problem.block_n)


@needs_gxx
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(problem=window_packs())
def test_the_pack_walk_enumerates_a_windowed_packs_ir(walk_pack, problem):
    """sched::PackWalk over WindowTiling: the deal's keys made monotone (deal_key's running
    minimum or maximum), task for task the IR's pack deal."""
    for name in WINDOW_POLICIES:
        if name in PACK_POLICIES:
            assert compare(walk_pack, name, problem) > 0, name


@needs_gxx
@pytest.mark.parametrize("name, mask", [("shift", "full"), ("symmetric_shift", "causal"),
                                        ("spt", "causal"), ("fa3", "full"), ("hybrid", "full"),
                                        ("hybrid", "causal")])
def test_a_long_tailed_pack_of_16k_tokens(walk_pack, name, mask):
    """A pack like the benchmark's: one long document, a few mid-sized, many short ones (9,000
    keys are past hybrid's 64 KV tiles, 5,000 within them: both of its orders)."""
    lengths = [9000, 5000, 1200, 1100, 700, 500, 300, 300, 200, 100, 100, 60, 30, 1, 0]
    problem = Problem.pack(lengths, heads_q=2, head_dim=128, mask=mask, block_m=64, block_n=128)
    compare(walk_pack, name, problem,
            counts=[BUILDERS[name].min_workers(problem), 100, 128, 132])
