// dashgen/ptx/barrier.cuh: named CTA barriers, for syncing a subset of warps (the MMA
// warpgroups) without stalling the producer and writer warps. IDs come from the kernels' barrier
// enums (AttnBwdSm90::Barrier, FwdBarrier); 0 is __syncthreads'.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// All `threads` (a multiple of 32) threads of the CTA that use barrier `id` meet here.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Counts this thread toward barrier `id`'s `threads` without waiting: the other side of a
// named_barrier_sync that waits for these threads.
__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

}  // namespace dashgen
