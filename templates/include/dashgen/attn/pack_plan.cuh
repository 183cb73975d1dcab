// dashgen/attn/pack_plan.cuh: the pack deal's orders, computed on the GPU from cu_seqlens before
// a packed backward (one CTA), so a new pack costs the host nothing and no synchronization: the
// sequences with tasks sorted by sched::dealt_before, and for policies whose units run
// independently their units with tasks sorted by sched::unit_dealt_before (the orders
// sched::PackWalk reads, the ones dashgen.schedule.builders.base.pack_deal computes). Each item's
// place is the count of items that precede it (a comparison sort: both rules are strict total
// orders), O(batch^2 + units^2) comparisons over the CTA's threads. tests/test_pack_plan_header.py
// runs this kernel's code on host threads (g++) and checks its orders against the Python IR.
#pragma once
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/sched/pack.cuh"

namespace dashgen {

template <class Cfg>
struct AttnPackPlan {
  static constexpr int kThreads = 512;
  // A sliding window (attn/mask.cuh): its tiling reads BwdParams::window_left/right.
  enum : int { kWindow = has_window<Cfg>(0) };
  using Tl = typename sched::TilingOf<Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal, kWindow != 0>::type;
  using Policy = typename Cfg::template Policy<Tl>;

  // Where the tile maps start in p.pack_plan (params.cuh, kPlanHeader).
  __device__ static int map_offset(int batch, int max_units) {
    return 3 + 4 * batch + 6 * max_units;
  }

  __device__ static Tl tiling(const BwdParams& p, int b) {
    const int sq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int sk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    if constexpr (kWindow != 0) {
      return Tl(sq, sk, p.window_left, p.window_right);
    } else {
      return Tl(sq, sk);
    }
  }

  // p.pack_plan (BwdParams): the header, the orders, then the scratch: per unit slot its key
  // (-1 without tasks), its sequence's place, sequence and index; per sequence its tasks, place
  // and first unit slot (batch + 1 words).
  __device__ static void run(const BwdParams& p) {
    const int batch = p.batch, slots = p.max_units, tid = threadIdx.x;
    int* plan = p.pack_plan;
    int* order = plan + kPlanHeader;
    int* unit_seq = order + batch;
    int* unit_index = unit_seq + slots;
    int* key = unit_index + slots;
    int* place = key + slots;
    int* seq_of = place + slots;
    int* index_of = seq_of + slots;
    int* tasks = index_of + slots;
    int* seq_place = tasks + batch;
    int* first_slot = seq_place + batch;
    __shared__ int dealt, units;
    if (tid == 0) dealt = units = 0;
    for (int b = tid; b < batch; b += kThreads) {
      tasks[b] = sched::sequence_tasks<Policy>(tiling(p, b));
    }
    __syncthreads();
    for (int b = tid; b < batch; b += kThreads) {
      int before = 0;
      if (tasks[b] > 0) {
        for (int c = 0; c < batch; ++c) {
          before += tasks[c] > 0 && sched::dealt_before(tasks[c], c, tasks[b], b);
        }
        order[before] = b;
        atomicAdd(&dealt, 1);
      }
      seq_place[b] = before;
    }
    if (tid == 0) {
      // Unit slots in sequence order: a serial prefix over the sequences.
      int next = 0;
      for (int b = 0; b < batch; ++b) {
        first_slot[b] = next;
        if (tasks[b] > 0) next += Policy::units(tiling(p, b));
      }
      first_slot[batch] = next;
    }
    __syncthreads();
    const int total = first_slot[batch];
    for (int j = tid; j < total; j += kThreads) {
      int b = 0;  // the sequence of slot j: the last with first_slot <= j
      for (int lo = 0, hi = batch - 1; lo <= hi;) {
        const int mid = (lo + hi) / 2;
        if (first_slot[mid] <= j) { b = mid; lo = mid + 1; } else { hi = mid - 1; }
      }
      const int u = j - first_slot[b];
      const Tl t = tiling(p, b);
      // Units of sequences that run together are dealt in waves, not sorted (sched::PackWalk).
      key[j] = Policy::unit_tasks(t, u) > 0 && !Policy::together(t) ? sched::deal_key<Policy>(t, u)
                                                                     : -1;
      place[j] = seq_place[b];
      seq_of[j] = b;
      index_of[j] = u;
    }
    __syncthreads();
    if constexpr (!Policy::kHeadsTogether) {
      for (int j = tid; j < total; j += kThreads) {
        if (key[j] < 0) continue;
        int before = 0;
        for (int i = 0; i < total; ++i) {
          before += key[i] >= 0 && sched::unit_dealt_before<Policy, Tl>(
                                       key[i], place[i], index_of[i], key[j], place[j], index_of[j]);
        }
        unit_seq[before] = seq_of[j];
        unit_index[before] = index_of[j];
        atomicAdd(&units, 1);
      }
    }
    __syncthreads();
    if (tid == 0) {
      plan[0] = dealt;
      plan[1] = units;
    }
    int* map_q = plan + map_offset(batch, slots);
    tile_map(map_q, p.cu_seqlens_q, batch, p.total_q, Cfg::kBlockM);
    tile_map(map_q + p.total_q / Cfg::kBlockM + batch, p.cu_seqlens_k, batch, p.total_k,
             Cfg::kBlockN);
  }

  // dK and dV (p.dk / p.dv, without GQA: the main kernel writes them) of the sequences without
  // queries: they have no tasks, so nobody else writes their keys' rows, and zeros are their
  // gradients. Every other sequence's rows are stored by the one segment of each KV tile
  // (contiguity), so the host allocates dK/dV without zeroing them. Packs seldom hold such
  // sequences (keys without queries); one CTA zeroes them.
  __device__ static void zero_unseen_keys(const BwdParams& p) {
    const int vecs_per_row = p.k_row_stride * static_cast<int>(sizeof(typename Cfg::Element)) / 16;
    if constexpr (kWindow != 0) {
      // Under a sliding window also the keys left of every row's window, a run from the
      // sequence's first (sched::WindowTiling); a sequence without queries: all its keys.
      for (int b = 0; b < p.batch; ++b) {
        const int sq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
        const int sk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
        const int left_of_all = sk - sq - p.window_left;
        const int keys = sq == 0 ? sk : left_of_all < 0 ? 0 : left_of_all < sk ? left_of_all : sk;
        const i64 first = static_cast<i64>(p.cu_seqlens_k[b]) * vecs_per_row;
        const i64 count = static_cast<i64>(keys) * vecs_per_row;
        for (i64 i = threadIdx.x; i < count; i += kThreads) {
          static_cast<uint4*>(p.dk)[first + i] = uint4{0u, 0u, 0u, 0u};
          static_cast<uint4*>(p.dv)[first + i] = uint4{0u, 0u, 0u, 0u};
        }
      }
    } else {
      for (int b = 0; b < p.batch; ++b) {
        if (p.cu_seqlens_q[b + 1] > p.cu_seqlens_q[b]) continue;
        const i64 first = static_cast<i64>(p.cu_seqlens_k[b]) * vecs_per_row;
        const i64 count =
            static_cast<i64>(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]) * vecs_per_row;
        for (i64 i = threadIdx.x; i < count; i += kThreads) {
          static_cast<uint4*>(p.dk)[first + i] = uint4{0u, 0u, 0u, 0u};
          static_cast<uint4*>(p.dv)[first + i] = uint4{0u, 0u, 0u, 0u};
        }
      }
    }
  }



  // map[t] = the sequence whose PackedRows tiles of `block` rows hold tile t, -1 in the gaps
  // (a sequence's tiles start at tile0(b) and the next one's at tile0(b + 1), which is at least
  // as far on): total / block + batch words.
  __device__ static void tile_map(int* map, const i32* cu, int batch, int total, int block) {
    for (int b = threadIdx.x; b < batch; b += kThreads) {
      const PackedRows r(cu, b, block);
      const int next = b + 1 < batch ? PackedRows(cu, b + 1, block).tile0 : total / block + batch;
      const int tiles = r.tiles(block);
      for (int t = r.tile0; t < next; ++t) map[t] = t - r.tile0 < tiles ? b : -1;
    }
  }
};

}  // namespace dashgen
