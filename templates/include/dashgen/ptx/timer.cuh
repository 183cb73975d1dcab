// dashgen/ptx/timer.cuh: the two clocks a traced backward stamps its dQ hand-offs with.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// This SM's cycle counter (low 32 bits): exact, but only comparable within one SM.
__device__ __forceinline__ u32 sm_clock() {
  u32 value;
  asm volatile("mov.u32 %0, %%clock;" : "=r"(value) :: "memory");
  return value;
}

// The GPU-wide nanosecond timer (low 32 bits, wraps after 4.3 s): comparable across SMs, so a
// writer's wake-up can be set against the release it waited for.
__device__ __forceinline__ u32 global_ns() {
  u32 value;
  asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(value) :: "memory");
  return value;
}

// A traced task's row (params.cuh: kTraceColumns): b, h, n, m, dq_rank, adds seen, then the
// SM clock and the global timer when the writer had the dQ partial, when the counter reached
// its rank, and when its add had landed.
enum TraceColumn : int { kTraceReady = 6, kTraceAcquired = 7, kTraceLanded = 8, kTraceClocks = 3 };
constexpr int kTraceColumns = 12;

__device__ __forceinline__ void trace_stamp(i32* row, int column) {
  row[column] = static_cast<i32>(sm_clock());
  row[column + kTraceClocks] = static_cast<i32>(global_ns());
}

}  // namespace dashgen
