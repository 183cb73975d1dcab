// dashgen/ptx/counter.cuh: gpu-scope acquire/release counters in global memory, the hand-off
// between writers of one dQ tile in dq_rank order, and the reductions a turn's holder makes.
#pragma once
#include "dashgen/ptx/timer.cuh"
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

// Two adjacent floats added in one reduction (8-byte aligned): red.global.add.v2.f32 (sm_90).
__device__ __forceinline__ void red_add_v2_f32(float* ptr, float a, float b) {
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};"
               :: "l"(ptr), "f"(a), "f"(b) : "memory");
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

// The same, giving up after timeout_ns (false): the watchdog of a rank wait. The clock is read
// only once the first poll has failed, so a wait that is already over costs nothing more; its
// low 32 bits wrap after 4.29 s, which bounds timeout_ns (unsigned differences survive a wrap).
__device__ __forceinline__ bool wait_counter_equals_for(const u32* ptr, u32 value,
                                                        u32 timeout_ns) {
  u32 sleep_ns = 8, since = 0;  // the first sleep's length marks the first failed poll
  while (ld_acquire_gpu(ptr) != value) {
    if (sleep_ns == 8) {
      since = global_ns();
    } else if (global_ns() - since > timeout_ns) {
      return false;
    }
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < kCounterMaxBackoffNs ? sleep_ns * 2 : kCounterMaxBackoffNs;
  }
  return true;
}

}  // namespace dashgen
