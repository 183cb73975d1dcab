"""One definition, two readings, for the pack deal's orders: the plan kernel a packed backward
launches first (templates/include/dashgen/attn/pack_plan.cuh, AttnPackPlan) computes the
sequences' and units' deal orders on the GPU from cu_seqlens; compiled here as host code with
g++ (its 512 threads as std::threads meeting at a barrier for each __syncthreads), it
must give exactly the orders of the Python IR (dashgen.schedule.builders.base.pack_order and
pack_units), which tests/test_pack_header.py walks task for task. Hypothesis-drawn packs: empty
and one-token sequences, other key lengths, both masks and tiles."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import HealthCheck, given, settings

from dashgen import Problem
from dashgen.codegen.render import include_dir
from dashgen.schedule.builders.base import pack_order, pack_tilings, pack_units
from dashgen.runtime.varlen import pack_tiles
from test_pack_header import packs, window_packs
from test_varlen import tile_slots
from test_policy_header import (PACK_POLICIES, POLICY_OBJECTS, WINDOW_POLICIES, mask_arg,
                                needs_gxx)

# argv: policy id, block_m, mask (0 full, 1 causal, 2 a window), left, right (mask 2),
# sequences, their seqlen_q, their seqlen_k. Prints
# "S <dealt> <sequences in deal order>" and "U <units dealt> <b,u of each in deal order>".
DRIVER = r"""
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

// A reusable barrier for n threads (C++17: no std::barrier).
class Block {
 public:
  explicit Block(int n) : n_(n) {}
  void sync() {
    std::unique_lock<std::mutex> lock(m_);
    const long phase = phase_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++phase_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return phase_ != phase; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, waiting_ = 0;
  long phase_ = 0;
};

// The CUDA the plan kernel uses, on host threads.
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __cvta_generic_to_shared(p) reinterpret_cast<unsigned long>(p)
struct Dim3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };  // a parameter block's vector type
static thread_local Dim3 threadIdx;
static Block* g_block;
inline void __syncthreads() { g_block->sync(); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

#include "dashgen/sched/ordered.cuh"
#include "dashgen/sched/shift.cuh"
#include "dashgen/sched/hybrid.cuh"
#include "dashgen/attn/pack_plan.cuh"

using namespace dashgen;
template <class Tl> using Hybrid64 = sched::Hybrid<Tl>;
template <class Tl> using Hybrid3 = sched::Hybrid<Tl, 3>;  // tests only (id 106)

template <int kBlockM_, bool kCausal_, template <class> class P>
struct Cfg {
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 128;
  static constexpr bool kCausal = kCausal_;
  using Element = unsigned short;  // 16-bit, as the kernels' bf16/fp16
  template <class Tl> using Policy = P<Tl>;
};
// A window variant's configuration renders kWindow as well.
template <int kBlockM_, template <class> class P>
struct WindowCfg : Cfg<kBlockM_, false, P> {
  static constexpr int kWindow = 1;
};
static int g_left, g_right;

template <class C>
static int plan(int seqs, char** lengths) {
  constexpr int kBlockM = C::kBlockM;
  std::vector<int> cu_q{0}, cu_k{0};
  for (int b = 0; b < seqs; ++b) cu_q.push_back(cu_q.back() + std::atoi(lengths[b]));
  for (int b = 0; b < seqs; ++b) cu_k.push_back(cu_k.back() + std::atoi(lengths[seqs + b]));
  BwdParams p{};
  p.cu_seqlens_q = cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  p.batch = seqs;
  p.total_q = cu_q.back();
  p.total_k = cu_k.back();
  p.max_units = cu_k.back() / 128 + seqs;  // dashgen.runtime.varlen.pack_tiles
  // dK/dV of one head of 64 (k_row_stride elements a key row), all ones before the plan.
  p.k_row_stride = 64;
  std::vector<unsigned short> dk(static_cast<size_t>(p.total_k) * 64 + 8, 0xffff), dv = dk;
  p.dk = dk.data();
  p.dv = dv.data();
  const int q_tiles = p.total_q / kBlockM + seqs, k_tiles = p.total_k / 128 + seqs;
  const int maps = 3 + 4 * seqs + 6 * p.max_units;  // plan_words without the maps
  std::vector<int> words(maps + q_tiles + k_tiles, -7);
  p.pack_plan = words.data();
  p.window_left = g_left;
  p.window_right = g_right;
  using Plan = AttnPackPlan<C>;
  Block block(Plan::kThreads);
  g_block = &block;
  std::vector<std::thread> threads;
  for (int t = 0; t < Plan::kThreads; ++t) {
    threads.emplace_back([&p, t] {
      threadIdx.x = static_cast<unsigned>(t);
      Plan::run(p);
      Plan::zero_unseen_keys(p);
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("S %d", words[0]);
  for (int k = 0; k < words[0]; ++k) std::printf(" %d", words[kPlanHeader + k]);
  std::printf("\nU %d", words[1]);
  for (int k = 0; k < words[1]; ++k) {
    std::printf(" %d,%d", words[kPlanHeader + seqs + k], words[kPlanHeader + seqs + p.max_units + k]);
  }
  std::printf("\nQ");
  for (int t = 0; t < q_tiles; ++t) std::printf(" %d", words[maps + t]);
  std::printf("\nK");
  for (int t = 0; t < k_tiles; ++t) std::printf(" %d", words[maps + q_tiles + t]);
  // The CTAs of the packed preprocess / convert grids (16 rows each) and where each lands.
  std::printf("\nCQ");
  for (int cta = 0; cta < q_tiles * kBlockM / 16; ++cta) {
    const PackedTile at(words.data() + maps, cu_q.data(), kBlockM, 16, cta);
    std::printf(" %d,%d", at.b, at.row_block);
  }
  std::printf("\nCK");
  for (int cta = 0; cta < k_tiles * 128 / 16; ++cta) {
    const PackedTile at(words.data() + maps + q_tiles, cu_k.data(), 128, 16, cta);
    std::printf(" %d,%d", at.b, at.row_block);
  }
  // Per key row: 0 zeroed in dK and dV, 1 untouched in both, 2 anything else; then the tail.
  std::printf("\nZ");
  for (int row = 0; row <= p.total_k; ++row) {
    const int width = row < p.total_k ? 64 : 8;
    int zeros = 0, ones = 0;
    for (int e = 0; e < width; ++e) {
      zeros += dk[row * 64 + e] == 0 && dv[row * 64 + e] == 0;
      ones += dk[row * 64 + e] == 0xffff && dv[row * 64 + e] == 0xffff;
    }
    std::printf(" %d", zeros == width ? 0 : ones == width ? 1 : 2);
  }
  std::printf("\n");
  return 0;
}

template <int kBlockM, bool kCausal>
static int run(int id, int seqs, char** lengths) {
  using Tl = sched::Tiling<kBlockM, 128, kCausal>;
  switch (id) {
    case sched::Fa3<Tl>::kId: return plan<Cfg<kBlockM, kCausal, sched::Fa3>>(seqs, lengths);
    case sched::Spt<Tl>::kId: return plan<Cfg<kBlockM, kCausal, sched::Spt>>(seqs, lengths);
    case sched::Descending<Tl>::kId:
      return plan<Cfg<kBlockM, kCausal, sched::Descending>>(seqs, lengths);
    case sched::Shift<Tl>::kId: return plan<Cfg<kBlockM, kCausal, sched::Shift>>(seqs, lengths);
    case sched::SymmetricShift<Tl>::kId:
      return plan<Cfg<kBlockM, kCausal, sched::SymmetricShift>>(seqs, lengths);
    case sched::Hybrid<Tl>::kId: return plan<Cfg<kBlockM, kCausal, Hybrid64>>(seqs, lengths);
    case 106: return plan<Cfg<kBlockM, kCausal, Hybrid3>>(seqs, lengths);
    default: return 3;
  }
}

// The launch-ordered policies under a sliding window.
template <int kBlockM>
static int run_window(int id, int seqs, char** lengths) {
  using Tl = sched::WindowTiling<kBlockM, 128>;
  switch (id) {
    case sched::Fa3<Tl>::kId: return plan<WindowCfg<kBlockM, sched::Fa3>>(seqs, lengths);
    case sched::Spt<Tl>::kId: return plan<WindowCfg<kBlockM, sched::Spt>>(seqs, lengths);
    case sched::Descending<Tl>::kId:
      return plan<WindowCfg<kBlockM, sched::Descending>>(seqs, lengths);
    default: return 3;
  }
}

int main(int argc, char** argv) {
  if (argc < 7) return 2;
  const int id = std::atoi(argv[1]), block_m = std::atoi(argv[2]), mask = std::atoi(argv[3]);
  g_left = std::atoi(argv[4]);
  g_right = std::atoi(argv[5]);
  const int seqs = std::atoi(argv[6]);
  if (argc != 7 + 2 * seqs) return 2;
  char** lengths = argv + 7;
  if (mask == 2) {
    return block_m == 64 ? run_window<64>(id, seqs, lengths) : run_window<128>(id, seqs, lengths);
  }
  if (block_m == 64) return mask ? run<64, true>(id, seqs, lengths) : run<64, false>(id, seqs, lengths);
  if (block_m == 128) return mask ? run<128, true>(id, seqs, lengths) : run<128, false>(id, seqs, lengths);
  return 4;
}
"""


@pytest.fixture(scope="module")
def plan_driver(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    (folder / "plan.cpp").write_text(DRIVER)
    binary = folder / "plan"
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
                           f"-I{include_dir()}", str(folder / "plan.cpp"), "-o", str(binary)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"pack_plan.cuh does not compile as host code:\n{proc.stderr}"

    def run(name: str, problem: Problem):
        out = subprocess.run([str(binary), str(POLICY_OBJECTS[name].kernel_id), str(problem.block_m),
                              mask_arg(problem), *map(str, problem.mask.kernel_bounds()),
                              str(problem.batch),
                              *map(str, problem.seqlens_q), *map(str, problem.seqlens_k)],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        seqs_line, units_line, q_line, k_line, cq_line, ck_line, z_line = out.splitlines()
        _, dealt, *order = seqs_line.split()
        _, units_dealt, *units = units_line.split()
        maps = ([int(x) for x in q_line.split()[1:]], [int(x) for x in k_line.split()[1:]],
                [tuple(map(int, x.split(","))) for x in cq_line.split()[1:]],
                [tuple(map(int, x.split(","))) for x in ck_line.split()[1:]],
                [int(x) for x in z_line.split()[1:]])
        return (list(map(int, order)), int(dealt),
                [tuple(map(int, x.split(","))) for x in units], int(units_dealt), maps)
    return run


def expected_map(lengths: list[int], block: int) -> list[int]:
    """Each packed tile's sequence (tests/test_varlen.py's tile_slots: PackedRows), -1 between."""
    tiles = pack_tiles(sum(lengths), len(lengths), block)
    owner = [-1] * tiles
    for b, slots in enumerate(tile_slots(lengths, 1, block)):
        for t in slots:
            owner[t] = b
    return owner


def check(plan_driver, name: str, problem: Problem) -> bool:
    policy = POLICY_OBJECTS[name]
    if policy.supports(problem) is not None:
        return False
    order, dealt, units, units_dealt, (map_q, map_k, ctas_q, ctas_k, zeroed) = plan_driver(
        name, problem)
    # dK/dV rows the plan zeroes: the keys no query row of their sequence sees (all of a
    # sequence without queries; under a window those left of every row's), nothing else (the
    # last entry is past the packed rows: never touched).
    left = problem.mask.left if problem.mask.kind == "window" else None
    unseen = [nk if nq == 0 else 0 if left is None else max(0, min(nk, nk - nq - left))
              for nq, nk in zip(problem.seqlens_q, problem.seqlens_k)]
    assert zeroed == [0 if j < u else 1 for u, nk in zip(unseen, problem.seqlens_k)
                      for j in range(nk)] + [1], problem.describe()
    # The tile maps the preprocess and convert kernels walk the pack by, and where their CTAs
    # land (PackedTile): every row block of every sequence's tiles exactly once.
    for lengths, block, tile_map, ctas in ((problem.seqlens_q, problem.block_m, map_q, ctas_q),
                                           (problem.seqlens_k, problem.block_n, map_k, ctas_k)):
        assert tile_map == expected_map(list(lengths), block), problem.describe()
        landed = sorted((b, rb) for b, rb in ctas if b >= 0)
        assert landed == [(b, rb) for b, n in enumerate(lengths)
                          for rb in range(-(-n // block) * block // 16)], problem.describe()
    expected = pack_order(policy, pack_tilings(problem))
    assert (dealt, order) == (len(expected), expected), (name, problem.describe())
    if not policy.heads_together:
        expected_units = pack_units(policy, problem)
        assert (units_dealt, units) == (len(expected_units), expected_units), (
            name, problem.describe())
    else:
        assert units_dealt == 0 and units == []  # the shift orders deal whole sequences
    return True


@needs_gxx
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(problem=packs())
def test_the_plan_kernel_orders_the_pack_as_the_ir(plan_driver, problem):
    assert sum(check(plan_driver, name, problem) for name in PACK_POLICIES) > 0


@needs_gxx
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(problem=window_packs())
def test_the_plan_kernel_orders_a_windowed_pack_and_zeroes_its_unseen_keys(plan_driver, problem):
    assert all(check(plan_driver, name, problem) for name in WINDOW_POLICIES
               if name in PACK_POLICIES)


@needs_gxx
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_a_long_tailed_pack_of_16k_tokens_is_ordered_as_the_ir(plan_driver, mask):
    lengths = [9000, 2500, 1200, 1100, 700, 500, 300, 300, 200, 100, 100, 60, 30, 1, 0]
    problem = Problem.pack(lengths, heads_q=2, head_dim=128, mask=mask, block_m=64, block_n=128)
    assert sum(check(plan_driver, name, problem) for name in PACK_POLICIES) >= 4
