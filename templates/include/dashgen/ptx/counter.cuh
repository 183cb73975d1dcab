// dashgen/ptx/counter.cuh: gpu-scope acquire/release counters in global memory, the hand-off
// between writers of one dQ tile in dq_rank order.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// Longest sleep between polls of a counter: short enough that a writer wakes within a fraction
// of one tile's work, long enough to keep spinning writers off the L2 when the wait is long.
constexpr u32 kCounterMaxBackoffNs = 256;

__device__ __forceinline__ u32 ld_acquire_gpu(const u32* ptr) {
  u32 value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

// Adds `value` with release semantics at gpu scope: every write this thread has observed
// (including completed bulk reductions, see bulk_wait_group) is visible to an acquirer first.
__device__ __forceinline__ void red_release_gpu_add(u32* ptr, u32 value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(ptr), "r"(value) : "memory");
}

// Relaxed atomic fetch-add at gpu scope (work counters, the non-deterministic mode); returns the
// old value.
__device__ __forceinline__ u32 atomic_fetch_add_relaxed_gpu(u32* ptr, u32 value) {
  u32 old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old) : "l"(ptr), "r"(value) : "memory");
  return old;
}

// Spins until *ptr == value; the load that sees it is an acquire, ordering the caller's later
// reads after the writes released together with that value. Polls with exponential backoff.
__device__ __forceinline__ void wait_counter_equals(const u32* ptr, u32 value) {
  u32 sleep_ns = 8;
  while (ld_acquire_gpu(ptr) != value) {
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < kCounterMaxBackoffNs ? sleep_ns * 2 : kCounterMaxBackoffNs;
  }
}

}  // namespace dashgen
