"""One definition, two readings: the kernel's schedule policies (templates/include/dashgen/sched,
compiled here as host code with g++) enumerate exactly the Python IR that show, plan, verify
and simulate read: task for task (worker, order, tile, dq_rank, dkv_rank, segment boundaries),
on hypothesis-drawn problems and every worker count from the schedule's minimum to 132."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dashgen import Problem
from dashgen.schedule.problem import Mask
from dashgen.codegen.render import include_dir
from dashgen.schedule.builders import BUILDERS, hybrid_policy, build_schedule
from dashgen.schedule.builders.base import assemble, deal_words, list_deal

HEADERS = ("dashgen/sched/walk.cuh", "dashgen/sched/ordered.cuh", "dashgen/sched/shift.cuh",
           "dashgen/sched/hybrid.cuh")
# The policies the drivers run (name -> the Policy the IR reads): the named schedules, and
# hybrid with a bound of 3 KV tiles (the drivers' id 106, Hybrid<Tl, 3>), so that the small
# drawn problems take both of hybrid's orders.
POLICY_OBJECTS = {**BUILDERS, "hybrid3": hybrid_policy(3, 106)}
POLICIES = {"fa3": "Fa3", "spt": "Spt", "spt_listed": "Spt (DealtWalk)",
            "descending": "Descending", "shift": "Shift",
            "symmetric_shift": "SymmetricShift", "hybrid": "Hybrid", "hybrid3": "Hybrid<Tl, 3>"}

# The policies a pack can run: a listed deal is one fixed shape's (a pack has its own deal).
PACK_POLICIES = {name: cls for name, cls in POLICIES.items() if not POLICY_OBJECTS[name].listed}


def build(name, problem, workers):
    """The IR of POLICY_OBJECTS[name] (build_schedule for the named ones)."""
    if name in BUILDERS:
        return build_schedule(name, problem, workers)
    return assemble(POLICY_OBJECTS[name], problem, workers)
TILES = ((64, 128), (128, 128))  # the backward's (block_m, block_n) at head_dim 128 and 64

# argv: policy id, block_m, mask (0 full, 1 causal, 2 a window), batch, heads_q, heads_kv,
# seqlen_q, seqlen_k, the window's left and right (read under mask 2), then worker counts. For each count: "W <count>", then per worker one line of tasks
# "b,h,n,m,dq_rank,dkv_rank,seg_start,seg_end" in its order.
# What both host drivers share (this one and tests/test_pack_header.py's): one worker's walk as a
# line of tasks, and a call with the policy of a kernel id.
COMMON = r"""
#include <cstdio>
#include <cstdlib>
#include <string>
#include "dashgen/sched/walk.cuh"
#include "dashgen/sched/ordered.cuh"
#include "dashgen/sched/shift.cuh"
#include "dashgen/sched/hybrid.cuh"

using namespace dashgen::sched;

template <class Walk>
static void print_walk(Walk& walk) {
  const int count = walk.count();
  std::printf("w");
  for (int k = 0; k < count; ++k) {
    const Task x = walk.next();
    std::printf(" %d,%d,%d,%d,%d,%d,%d,%d", x.b, x.h, x.n, x.m, x.dq_rank, x.dkv_rank,
                x.seg_start ? 1 : 0, x.seg_end ? 1 : 0);
  }
  std::printf("\n");
}

// f(Policy{}) for the launch-ordered policy with kernel id `id` (the ones a window kernel
// runs); 3 for another id.
template <class Tl, class F>
static int with_ordered_policy(int id, F&& f) {
  switch (id) {
    case Fa3<Tl>::kId: f(Fa3<Tl>{}); return 0;
    case Spt<Tl>::kId: f(Spt<Tl>{}); return 0;
    case Descending<Tl>::kId: f(Descending<Tl>{}); return 0;
    default: return 3;
  }
}

// f(Policy{}) for the policy with kernel id `id`; 3 for an unknown id.
template <class Tl, class F>
static int with_policy(int id, F&& f) {
  switch (id) {
    case Shift<Tl>::kId: f(Shift<Tl>{}); return 0;
    case SymmetricShift<Tl>::kId: f(SymmetricShift<Tl>{}); return 0;
    case Hybrid<Tl>::kId: f(Hybrid<Tl>{}); return 0;
    case 106: f(Hybrid<Tl, 3>{}); return 0;  // tests only: small problems take both orders
    default: return with_ordered_policy<Tl>(id, f);
  }
}
"""

DRIVER = COMMON + r"""

struct Shape {
  int batch_, heads_q_, heads_kv_, workers_, seqlen_q_, seqlen_k_, left_, right_;
  int batch() const { return batch_; }
  int heads_q() const { return heads_q_; }
  int group() const { return heads_q_ / heads_kv_; }
  int workers() const { return workers_; }
  int seqlen_q() const { return seqlen_q_; }
  int seqlen_k() const { return seqlen_k_; }
  int window_left() const { return left_; }
  int window_right() const { return right_; }
};

template <class Tl>
struct is_window {
  static constexpr bool value = false;
};
template <int kM, int kN>
struct is_window<WindowTiling<kM, kN>> {
  static constexpr bool value = true;
};

// The window of a tiling (WindowTiling's; the others ignore it).
template <int kM, int kN>
static int window_of(const WindowTiling<kM, kN>& t, int side) { return side ? t.right : t.left; }
template <int kM, int kN, bool kC>
static int window_of(const Tiling<kM, kN, kC>&, int) { return 0; }
template <class Tl>
static int left_of(const Tl& t) { return window_of(t, 0); }
template <class Tl>
static int right_of(const Tl& t) { return window_of(t, 1); }

template <class Policy, class Tl>
static void walk(const Tl& t, int batch, int heads_q, int heads_kv, int workers) {
  std::printf("W %d\n", workers);
  const Shape shape{batch, heads_q, heads_kv, workers, t.seqlen_q, t.seqlen_k, left_of(t),
                    right_of(t)};
  for (int w = 0; w < workers; ++w) {
    UnitWalk<Policy, Tl, Shape> walk(shape, w);
    print_walk(walk);
  }
}

// A listed deal (kListed): per worker count, one stdin line "<n> <n words>" holding the
// BwdParams::unit_deal array the runtime uploads.
static constexpr int kListed = 7;
template <class Policy, class Tl>
static void walk_dealt(const Tl& t, int batch, int heads_q, int heads_kv, int workers) {
  int n = 0;
  if (std::scanf("%d", &n) != 1) std::exit(5);
  int* deal = new int[n > 0 ? n : 1];
  for (int j = 0; j < n; ++j) {
    if (std::scanf("%d", &deal[j]) != 1) std::exit(5);
  }
  std::printf("W %d\n", workers);
  const Shape shape{batch, heads_q, heads_kv, workers, t.seqlen_q, t.seqlen_k, left_of(t),
                    right_of(t)};
  for (int w = 0; w < workers; ++w) {
    DealtWalk<Policy, Tl, Shape> walk(shape, deal, w);
    print_walk(walk);
  }
  delete[] deal;
}

template <class Tl>
static int run(const Tl& t, int id, int argc, char** argv) {
  const int batch = std::atoi(argv[4]), heads_q = std::atoi(argv[5]), heads_kv = std::atoi(argv[6]);
  for (int a = 11; a < argc; ++a) {
    const int workers = std::atoi(argv[a]);
    if (id == kListed) {
      walk_dealt<Spt<Tl>>(t, batch, heads_q, heads_kv, workers);
      continue;
    }
    auto f = [&](auto policy) { walk<decltype(policy)>(t, batch, heads_q, heads_kv, workers); };
    int status;
    if constexpr (is_window<Tl>::value) {
      status = with_ordered_policy<Tl>(id, f);
    } else {
      status = with_policy<Tl>(id, f);
    }
    if (status) return status;
  }
  return 0;
}

// argv: "convert", block_m, mask, seqs, seqlen_q, seqlen_k, workers, left, right: "count <m>
// <count>" per Q tile, then per worker "w" and its converted tiles "seq,m".
template <class Tl>
static int convert(const Tl& t, char** argv) {
  const int seqs = std::atoi(argv[4]), workers = std::atoi(argv[7]);
  for (int m = 0; m < t.num_m(); ++m) std::printf("count %d %d\n", m, t.count(m));
  for (int w = 0; w < workers; ++w) {
    std::printf("w");
    const int share = ConvertDeal<Tl>::share(t, seqs, w, workers);
    for (int k = 0; k < share; ++k) {
      std::printf(" %d,%d", ConvertDeal<Tl>::seq_of(t, w, workers, k),
                  ConvertDeal<Tl>::m_of(t, w, workers, k));
    }
    std::printf("\n");
  }
  return 0;
}

// f(tiling) for block_m, the mask (0 full, 1 causal, 2 a window) and the lengths and window.
template <int kBlockM, class F>
static int with_tiling(int mask, int sq, int sk, int left, int right, F&& f) {
  if (mask == 2) return f(WindowTiling<kBlockM, 128>(sq, sk, left, right));
  if (mask == 1) return f(Tiling<kBlockM, 128, true>(sq, sk));
  return f(Tiling<kBlockM, 128, false>(sq, sk));
}

int main(int argc, char** argv) {
  if (argc == 10 && std::string(argv[1]) == "convert") {
    const int block_m = std::atoi(argv[2]), mask = std::atoi(argv[3]);
    const int sq = std::atoi(argv[5]), sk = std::atoi(argv[6]);
    const int left = std::atoi(argv[8]), right = std::atoi(argv[9]);
    auto f = [&](const auto& t) { return convert(t, argv); };
    if (block_m == 64) return with_tiling<64>(mask, sq, sk, left, right, f);
    return with_tiling<128>(mask, sq, sk, left, right, f);
  }
  if (argc < 12) return 2;
  const int id = std::atoi(argv[1]), block_m = std::atoi(argv[2]), mask = std::atoi(argv[3]);
  const int sq = std::atoi(argv[7]), sk = std::atoi(argv[8]);
  const int left = std::atoi(argv[9]), right = std::atoi(argv[10]);
  auto f = [&](const auto& t) { return run(t, id, argc, argv); };
  if (block_m == 64) return with_tiling<64>(mask, sq, sk, left, right, f);
  if (block_m == 128) return with_tiling<128>(mask, sq, sk, left, right, f);
  return 4;
}
"""

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (host C++)")


def build_driver(tmp_path_factory, name: str, source: str):
    """A host driver compiled with g++ against the kernel's headers (warnings are errors)."""
    folder = tmp_path_factory.mktemp(name)
    (folder / "walk.cpp").write_text(source)
    binary = folder / "walk"
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror",
                           f"-I{include_dir()}", str(folder / "walk.cpp"), "-o", str(binary)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"the headers do not compile as host code:\n{proc.stderr}"
    return binary


def run_walks(args: list[str], stdin: str = "") -> dict[int, list[list[tuple]]]:
    """Run a driver: {worker count: per worker its task tuples}."""
    out = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    result, current = {}, None
    for line in out.splitlines():
        if line.startswith("W "):
            current = result.setdefault(int(line[2:]), [])
        else:
            current.append([tuple(map(int, x.split(","))) for x in line.split()[1:]])
    return result


def mask_arg(problem) -> str:
    """The drivers' mask: 0 full, 1 causal, 2 a window (sched::WindowTiling)."""
    return str({"full": 0, "causal": 1, "window": 2}[problem.mask.kind])


@pytest.fixture(scope="module")
def walk_policy(tmp_path_factory):
    """walk(name, problem, worker_counts) -> {count: per worker its task tuples}, from the
    kernel's headers."""
    binary = build_driver(tmp_path_factory, "policies", DRIVER)

    def convert(problem, workers):
        """(count per Q tile, per worker its (sequence, Q tile) list) from the header."""
        out = subprocess.run([str(binary), "convert", str(problem.block_m), mask_arg(problem),
                              str(problem.batch * problem.heads_q), str(problem.seqlen_q),
                              str(problem.seqlen_k), str(workers),
                              *map(str, problem.mask.kernel_bounds())],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        counts, shares = [], []
        for line in out.splitlines():
            if line.startswith("count "):
                counts.append(int(line.split()[2]))
            else:
                shares.append([tuple(map(int, x.split(","))) for x in line.split()[1:]])
        return counts, shares

    def walk(name, problem, counts):
        policy = POLICY_OBJECTS[name]
        stdin = ""
        if policy.listed:  # the deal the runtime uploads (runtime.plans.device_deal's words)
            for c in counts:
                words = deal_words(list_deal(policy, problem, c))
                stdin += " ".join(map(str, [len(words), *words])) + "\n"
        return run_walks([str(binary), str(policy.kernel_id), str(problem.block_m),
                          mask_arg(problem), str(problem.batch), str(problem.heads_q),
                          str(problem.heads_kv), str(problem.seqlen_q), str(problem.seqlen_k),
                          *map(str, problem.mask.kernel_bounds())] + [str(c) for c in counts],
                         stdin)
    walk.convert = convert
    return walk


def ir_tasks(schedule) -> list[list[tuple]]:
    """The IR in the driver's tuples: segment boundaries from the runs of one KV tile."""
    out = []
    for w in range(schedule.num_workers):
        tasks = []
        for seg in schedule.segments(w):
            for i, t in enumerate(seg):
                tasks.append((t.batch, t.head, t.n_block, t.m_block, t.dq_rank,
                              -1 if t.dkv_rank is None else t.dkv_rank, int(i == 0),
                              int(i + 1 == len(seg))))
        out.append(tasks)
    return out


def compare(walk_policy, name, problem):
    policy = POLICY_OBJECTS[name]
    if policy.supports(problem) is not None:
        return 0
    lo = policy.min_workers(problem)
    counts = list(range(lo, 133))
    used = {c: policy.workers_used(problem, c) for c in counts}
    walked = walk_policy(name, problem, sorted(set(used.values())))
    for c in counts:
        expected = ir_tasks(build(name, problem, c))
        assert walked[used[c]] == expected, (name, problem.describe(), c)
    return len(counts)


problems = st.builds(
    lambda batch, heads_kv, group, seqlen_q, seqlen_k, causal, tiles: Problem(
        batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv, seqlen_q=seqlen_q,
        seqlen_k=seqlen_k if seqlen_k else seqlen_q, mask="causal" if causal else "full",
        head_dim=128 if tiles == (64, 128) else 64, block_m=tiles[0], block_n=tiles[1]),
    batch=st.integers(1, 2), heads_kv=st.integers(1, 2), group=st.integers(1, 2),
    seqlen_q=st.integers(1, 1100), seqlen_k=st.one_of(st.just(0), st.integers(1, 1100)),
    causal=st.booleans(), tiles=st.sampled_from(TILES))


@needs_gxx
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems)
def test_every_policy_enumerates_its_ir(walk_policy, problem):
    checked = sum(compare(walk_policy, name, problem) for name in POLICIES)
    assert checked > 0  # every problem has at least fa3, spt and descending


# Sliding windows (sched::WindowTiling): narrower and wider than a tile and than the sequence,
# one side open, seqlen_q above and below seqlen_k (KV tiles and Q tiles without a task).
window_masks = st.builds(
    lambda left, right: f"window:{left},{right}",
    left=st.one_of(st.integers(0, 300), st.just(None)),
    right=st.one_of(st.integers(0, 300), st.just(None))).filter(
        lambda text: text not in ("window:None,None", "window:None,0"))
window_problems = st.builds(
    lambda batch, heads_kv, group, seqlen_q, seqlen_k, mask, tiles: Problem(
        batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv, seqlen_q=seqlen_q,
        seqlen_k=seqlen_k if seqlen_k else seqlen_q,
        mask=Mask(*(None if x == "None" else int(x) for x in mask[7:].split(","))),
        head_dim=128 if tiles == (64, 128) else 64, block_m=tiles[0], block_n=tiles[1]),
    batch=st.integers(1, 2), heads_kv=st.integers(1, 2), group=st.integers(1, 2),
    seqlen_q=st.integers(1, 1100), seqlen_k=st.one_of(st.just(0), st.integers(1, 1100)),
    mask=window_masks, tiles=st.sampled_from(TILES))
WINDOW_POLICIES = ("fa3", "spt", "spt_listed", "descending")


@needs_gxx
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=window_problems)
def test_window_policies_enumerate_their_ir(walk_policy, problem):
    """The policies a window kernel runs, over sched::WindowTiling, task for task the IR's
    (whose tiles come from the Problem's lists, not the header's formulas)."""
    assert problem.mask.kind == "window"
    for name in WINDOW_POLICIES:
        assert compare(walk_policy, name, problem) > 0, name
    for name in set(POLICIES) - set(WINDOW_POLICIES):
        assert POLICY_OBJECTS[name].supports(problem) is not None, name


@needs_gxx
@pytest.mark.parametrize("name, mask, seqlen, head_dim", [
    ("shift", "full", 16384, 64), ("symmetric_shift", "causal", 16384, 128),
    ("spt", "causal", 4096, 64), ("fa3", "full", 2048, 128), ("descending", "causal", 1024, 128),
    ("spt_listed", "causal", 8192, 128),
    ("symmetric_shift", "causal", 5 * 128 + 7, 64),  # an odd KV tile count: a middle unit
])
def test_benchmark_sizes_match(walk_policy, name, mask, seqlen, head_dim):
    """The benchmark's shapes (one sequence, 2 heads; the ranks never read the others)."""
    tiles = TILES[0] if head_dim == 128 else TILES[1]
    problem = Problem(heads_q=2, seqlen_q=seqlen, head_dim=head_dim, mask=mask,
                      block_m=tiles[0], block_n=tiles[1])
    counts = sorted({BUILDERS[name].workers_used(problem, c)
                     for c in (BUILDERS[name].min_workers(problem), 128, 132)})
    walked = walk_policy(name, problem, counts)
    for c in counts:
        assert walked[c] == ir_tasks(build_schedule(name, problem, c)), (name, c)


def test_the_kernel_includes_the_walk():
    text = (include_dir() / "dashgen/attn/bwd_sm90.cuh").read_text()
    assert '#include "dashgen/sched/walk.cuh"' in text
    for header in HEADERS:
        assert (include_dir() / header).is_file()


@needs_gxx
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=st.one_of(problems, window_problems), workers=st.integers(1, 132))
def test_the_fused_converter_takes_every_finished_tile_once(walk_policy, problem, workers):
    """The converter's deal (sched::ConvertDeal) and the counts it waits for (Tiling::count,
    WindowTiling::count under a window): a Q tile's dQ sum gets one contribution per KV tile the
    mask keeps with it; every tile with any is converted by exactly one worker, in
    sequence-major order, shares within one."""
    counts, shares = walk_policy.convert(problem, workers)
    assert counts == [sum(problem.tile_kept(n, m) for n in range(problem.num_n_blocks))
                      for m in range(problem.num_m_blocks)]
    seqs = problem.batch * problem.heads_q
    reached = [(s, m) for s in range(seqs) for m in range(problem.num_m_blocks) if counts[m]]
    assert sorted(t for share in shares for t in share) == reached
    assert all(share == sorted(share) for share in shares)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
