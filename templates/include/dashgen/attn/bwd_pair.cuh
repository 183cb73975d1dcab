// dashgen/attn/bwd_pair.cuh: the backward's cluster pair (Cfg::kClusterPair, head_dim 256).
// Two CTAs of a cluster run KV tiles 2n and 2n + 1 of one head against the same Q tile at the
// same time: to the schedule they are one worker and one task of 128 keys (the walk runs over
// pairs, AttnBwdSm90::Tiling), each CTA computing its own 64 keys. Q and dO arrive once for
// both (each CTA multicasts half of the column blocks into both), and dQ's partials meet in
// shared memory: CTA w owns the pieces of its warpgroup w; the peer's warpgroup w stores its
// own into the owner's receive buffer, and the owner adds the two before its writer lands
// them. So a dQ tile takes half the global bytes a FLOP that one CTA's 64 keys take
// (lab/notes/cluster-pair-plan.md). Two addends, one rounding: the same sum in either order,
// and the sums over pairs land in the schedule's dq_rank order, a counter per (dQ tile, owned
// half). The bits are fixed by the tiles and the pairing (KV tile 2n + r's partial onto 2n's),
// never by the workers.
#pragma once
#include "dashgen/ptx/cluster.cuh"
#include "dashgen/ptx/mbarrier.cuh"

namespace dashgen {

// Cfg::kClusterPair where the entry template renders one, else 0. Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto cluster_pair(int) -> decltype(Cfg::kClusterPair + 0) {
  return Cfg::kClusterPair;
}
template <class Cfg>
__host__ __device__ constexpr int cluster_pair(long) {
  return 0;
}

// Cfg::kPairLateAdd where the entry template renders one, else 0: the owner's last dQ piece of
// a task staged alone, the peer's added under the next task's first wgmmas
// (BwdMainloopSwapped::finish_late_piece). Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto pair_late_add(int) -> decltype(Cfg::kPairLateAdd + 0) {
  return Cfg::kPairLateAdd;
}
template <class Cfg>
__host__ __device__ constexpr int pair_late_add(long) {
  return 0;
}

// A float pair into a peer CTA's shared memory at `cluster_address` (map_to_rank), 8 bytes
// aligned.
__device__ __forceinline__ void st_shared_cluster_v2_f32(u32 cluster_address, float lo,
                                                         float hi) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" :: "r"(cluster_address), "f"(lo),
               "f"(hi) : "memory");
}

// The pair's view of the launch: a cluster of two CTAs is one worker.
// (No static data members: NVRTC emits them as module globals, which move the addresses the
// pack plan's kernels load.)
struct ClusterPair {
  __device__ static __forceinline__ u32 rank() { return cluster_cta_rank(); }
  __device__ static __forceinline__ int worker() { return static_cast<int>(blockIdx.x / 2); }
  __device__ static __forceinline__ int workers() { return static_cast<int>(gridDim.x / 2); }
  // This CTA's 64-key KV tile of the pair's tile n.
  __device__ static __forceinline__ int own_tile(int n) {
    return 2 * n + static_cast<int>(rank());
  }
  // `bar`'s twin in the peer CTA (the same offset in its shared memory).
  __device__ static __forceinline__ u32 peer(const void* bar) {
    return map_to_rank(shared_address(bar), rank() ^ 1u);
  }
  // One arrival here and one on the peer's twin: a stage both CTAs' multicasts fill is free
  // once the consumers of both have released it.
  __device__ static __forceinline__ void arrive_both(u64* bar) {
    mbarrier_arrive(bar);
    mbarrier_arrive_remote(peer(bar));
  }
};

}  // namespace dashgen
