// dashgen/ptx/mbarrier.cuh: one wrapper per mbarrier instruction (shared::cta, 64-bit barrier).
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// `expected_arrivals` threads must arrive (plus all expected transaction bytes) per phase.
__device__ __forceinline__ void mbarrier_init(u64* bar, u32 expected_arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
               :: "r"(shared_address(bar)), "r"(expected_arrivals) : "memory");
}

// Makes barrier initialisation visible to the async proxy (TMA) and to other CTAs of the cluster;
// follow it with a CTA barrier (__syncthreads) before any thread or copy uses the barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of transactions (the TMA copies completing on `bar`).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(shared_address(bar)), "r"(bytes) : "memory");
}

// One plain arrival (release.cta by default); the returned state token is discarded.
__device__ __forceinline__ void mbarrier_arrive(u64* bar) {
  asm volatile("{\n\t"
               ".reg .b64 state;\n\t"
               "mbarrier.arrive.shared::cta.b64 state, [%0];\n\t"
               "}"
               :: "r"(shared_address(bar)) : "memory");
}

// True once the phase with parity `phase_parity` has completed (acquire.cta). The hardware may
// suspend the thread for a system-dependent time before returning false.
__device__ __forceinline__ bool mbarrier_try_wait_parity(u64* bar, u32 phase_parity) {
  u32 done;
  asm volatile("{\n\t"
               ".reg .pred p;\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t"
               "}"
               : "=r"(done) : "r"(shared_address(bar)), "r"(phase_parity) : "memory");
  return done != 0;
}

// Blocks until the phase with parity `phase_parity` has completed.
__device__ __forceinline__ void mbarrier_wait_parity(u64* bar, u32 phase_parity) {
  while (!mbarrier_try_wait_parity(bar, phase_parity)) {
  }
}

}  // namespace dashgen
