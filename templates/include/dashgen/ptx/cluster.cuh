// dashgen/ptx/cluster.cuh: thread-block clusters (sm_90): the CTA's rank in its cluster, the
// cluster-wide barrier, another CTA's shared memory (distributed shared memory), and what writes
// it: an add into a peer's word, a bulk copy from this CTA's shared memory into a peer's,
// completing on the peer's mbarrier, and a TMA tile load multicast into several CTAs at once.
#pragma once
#include "dashgen/ptx/tma.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ u32 cluster_cta_rank() {
  u32 rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster: shared-memory writes before it (release) are seen
// by reads after it in any CTA of the cluster (acquire). Also what keeps a CTA's shared memory
// alive while a peer still reads or copies into it: a CTA must not exit before its peers are
// done with it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of the variable at this CTA's shared address `address` in the
// CTA of rank `rank`.
__device__ __forceinline__ u32 map_to_rank(u32 address, u32 rank) {
  u32 mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mapped) : "r"(address), "r"(rank));
  return mapped;
}

__device__ __forceinline__ float ld_shared_cluster_f32(u32 cluster_address) {
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(cluster_address)
               : "memory");
  return value;
}

// *cluster_address += value (relaxed), in whichever CTA of the cluster the address maps to.
// Two addends meeting at one address give the same bits in either order (one rounding of a
// commutative add): so a peer may add its value onto a word holding this CTA's own. ptxas
// compiles a peer's add to ATOM.E.ADD.F32.FTZ.RN (NVRTC 13): a denormal sum flushes to zero.
__device__ __forceinline__ void red_add_shared_cluster_f32(u32 cluster_address, float value) {
  asm volatile("red.shared::cluster.add.f32 [%0], %1;" :: "r"(cluster_address), "f"(value)
               : "memory");
}

// One arrival on the mbarrier at `cluster_bar` (map_to_rank) in a peer CTA, releasing this
// thread's prior writes at cluster scope (its adds into that CTA's shared memory among them).
__device__ __forceinline__ void mbarrier_arrive_remote(u32 cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(cluster_bar)
               : "memory");
}

// mbarrier_wait_parity (ptx/mbarrier.cuh) acquiring at cluster scope: what a peer CTA wrote
// before its mbarrier_arrive_remote on this barrier is seen after it.
__device__ __forceinline__ void mbarrier_wait_parity_cluster(u64* bar, u32 phase_parity) {
  u32 done = 0;
  while (!done) {
    asm volatile("{\n\t"
                 ".reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t"
                 "}"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(phase_parity) : "memory");
  }
}

// Peer smem [dst, dst + bytes) = this CTA's smem [src, src + bytes) through the async proxy;
// `dst` and `peer_bar` are shared::cluster addresses (map_to_rank) in the same peer CTA, whose
// mbarrier receives `bytes` of completed transactions. bytes: a multiple of 16, both addresses
// 16-byte aligned. The source was written by the generic proxy: fence_proxy_async_shared first.
__device__ __forceinline__ void bulk_copy_to_peer(u32 dst, const void* src, u32 bytes,
                                                  u32 peer_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(dst), "r"(shared_address(src)), "r"(bytes), "r"(peer_bar) : "memory");
}

// tma_load_2d (ptx/tma.cuh) into the same shared-memory offset of every CTA in `cta_mask` (bit
// r: cluster rank r), each completing on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_dst, const TensorMap* map,
                                                      u64* bar, i32 c0, i32 c1, u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, { %3, %4 }], [%2], %5;"
      :: "r"(shared_address(smem_dst)), "l"(reinterpret_cast<u64>(map)),
         "r"(shared_address(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// tma_load_4d (ptx/tma.cuh) multicast as tma_load_2d_multicast: the box lands at the same
// offset in every CTA of `cta_mask`, each counting its bytes on its own mbarrier at `bar`.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem_dst, const TensorMap* map,
                                                      u64* bar, i32 c0, i32 c1, i32 c2, i32 c3,
                                                      u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, { %3, %4, %5, %6 }], [%2], %7;"
      :: "r"(shared_address(smem_dst)), "l"(tensor_map_address(map)), "r"(shared_address(bar)),
         "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
      : "memory");
}

// This thread's generic-proxy writes into any CTA's shared memory of the cluster (its adds into
// a peer's among them) ordered before later async-proxy reads of them (a peer's bulk copy out
// of that memory, after the mbarrier this thread then arrives on).
__device__ __forceinline__ void fence_proxy_async_shared_cluster() {
  asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
}

}  // namespace dashgen
