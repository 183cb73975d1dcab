// dashgen/ptx/regs.cuh: warpgroup register reallocation (sm_90a). Every warp of the warpgroup
// executes the same call. Takes effect only when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)); otherwise ptxas ignores it with warning C7508.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// Raises this warpgroup's per-thread register count to kRegisters (blocks until the registers
// released by other warpgroups are available).
template <u32 kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(kRegisters));
}

// Lowers this warpgroup's per-thread register count to kRegisters, releasing the rest.
template <u32 kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(kRegisters));
}

}  // namespace dashgen
