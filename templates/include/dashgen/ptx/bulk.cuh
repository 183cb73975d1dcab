// dashgen/ptx/bulk.cuh: non-tensor bulk copies (cp.async.bulk family) and the proxy fences they
// need. Addresses must be 16-byte aligned and sizes a multiple of 16 bytes.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// gmem[i] += smem[i] for `bytes / 4` floats, performed in L2 by the async proxy (round to
// nearest, one add per element). Completion is tracked by bulk async-groups of this thread.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src,
                                                    u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :: "l"(gmem_dst), "r"(shared_address(smem_src)), "r"(bytes) : "memory");
}

// gmem[i] = smem[i] for `bytes / 4` floats through the async proxy: the dQ writer of rank 0,
// whose tile holds nothing yet, stores instead of adding onto zeros written for it.
__device__ __forceinline__ void bulk_store_f32(float* gmem_dst, const float* smem_src,
                                               u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(gmem_dst), "r"(shared_address(smem_src)), "r"(bytes) : "memory");
}

// smem[0, bytes) = gmem[0, bytes) through the async proxy; the copy completes `bytes` of
// transaction count on the mbarrier `bar` (whose expect_tx must include them), which is how
// waiters learn the data has landed.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, u32 bytes,
                                          u64* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :: "r"(shared_address(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// Closes the bulk async-group holding this thread's uncommitted bulk operations.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's bulk async-groups are pending, i.e. their writes are
// complete and visible to this thread. The deterministic dQ writer must use this full wait (N=0)
// before it releases the dQ counter: the next writer in dq_rank order reads the same gmem, so our
// additions must have landed in global memory, not merely finished reading shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}

// Waits only until the pending groups have finished READING their shared-memory sources, so the
// source buffer may be overwritten. Says nothing about the global writes: never use it to order
// the dQ reduction (see bulk_wait_group).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

// Orders this thread's generic-proxy shared-memory accesses with async-proxy (TMA, bulk copy,
// wgmma operand) accesses: every thread that wrote shared memory with ordinary stores executes it
// before the CTA barrier that precedes the async read.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The same for global memory: orders async-proxy global writes (bulk reduce) seen by this thread
// with its generic-proxy accesses (the counter release/acquire that hands dQ to the next writer).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace dashgen
