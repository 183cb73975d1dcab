// dashgen/attn/pack_check.cuh: whether a pack's offsets on the GPU keep the promises the host
// sized the launch by. The host cannot read them without a synchronization, but it sized the
// grids by max_seqlen and the buffers by the totals, so a sequence longer than max_seqlen would
// leave rows unwritten, and offsets past the totals would address rows that do not exist. Each
// packed forward CTA checks its own sequence and the backward's plan kernel checks all of
// them, before any load or store. A fault is recorded in host memory and the launch is aborted
// (dashgen/runtime/pack_faults.py raises the error that names the offsets). The check itself is
// plain integer code, so it compiles as host C++ too (tests/test_pack_check_header.py).
#ifndef DASHGEN_ATTN_PACK_CHECK_CUH
#define DASHGEN_ATTN_PACK_CHECK_CUH

#include "dashgen/host_device.cuh"

namespace dashgen {

// What is wrong with sequence b's offsets (0: nothing). The codes are PACK_FAULTS in
// dashgen/runtime/pack_faults.py.
enum PackFault : int {
  kPackFine = 0,
  kPackFirstNotZero = 1,  // cu[0] != 0
  kPackFalls = 2,         // cu[b + 1] < cu[b]
  kPackOutside = 3,       // cu[b] < 0 or cu[b + 1] > total
  kPackLastNotTotal = 4,  // cu[batch] != total
  kPackTooLong = 5,       // cu[b + 1] - cu[b] > max_seqlen
};

// One offsets array (cu_seqlens_q or _k) at sequence b of batch, against the packed tokens
// (total) and the longest length the host was given (longest). Every sequence checking its
// own two offsets covers the whole array: cu[0] is 0 and each step rises by 0 .. longest,
// ending at total.
DASHGEN_HD int pack_fault(int start, int end, int b, int batch, int total, int longest) {
  if (b == 0 && start != 0) return kPackFirstNotZero;
  if (end < start) return kPackFalls;
  if (start < 0 || end > total) return kPackOutside;
  if (b == batch - 1 && end != total) return kPackLastNotTotal;
  if (end - start > longest) return kPackTooLong;
  return kPackFine;
}

}  // namespace dashgen

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "dashgen/types.cuh"

namespace dashgen {

// The record (host memory, pack_faults.PACK_RECORD_WORDS words): word 0 kPackRecordMagic once
// filled, then the kernel (1 forward, 2 backward), the array (0 cu_seqlens_q, 1 cu_seqlens_k),
// the fault, b, cu[b], cu[b + 1], total, longest, batch.
constexpr u32 kPackRecordMagic = 0x0ff5e75;

// One writer per module: the first faulting thread claims it, the others leave the record to
// it (their own abort could end the launch before its record is complete).
__device__ u32 g_pack_fault_claimed = 0;

// One offsets array (array 0: cu_seqlens_q, 1: cu_seqlens_k) at sequence b. On a fault: the
// first thread to find one records it and aborts the launch; the others return true and must
// stop.
__device__ __forceinline__ bool pack_faulted(u32* record, int kernel, int b, int batch,
                                             const i32* cu, int total, int longest, int array) {
  const int start = cu[b], end = cu[b + 1];
  const int fault = pack_fault(start, end, b, batch, total, longest);
  if (fault == kPackFine) return false;
  if (atomicCAS(&g_pack_fault_claimed, 0u, 1u) == 0u) {
    if (record != nullptr) {
      volatile u32* row = record;
      row[1] = kernel; row[2] = array; row[3] = fault; row[4] = b; row[5] = start;
      row[6] = end; row[7] = total; row[8] = longest; row[9] = batch;
      __threadfence_system();
      row[0] = kPackRecordMagic;
      __threadfence_system();
    }
    __trap();
  }
  return true;
}

// Sequence b of a packed launch's parameters (FwdParams or BwdParams: seqlen_q/k are the
// max_seqlen the host sized it by), both arrays.
template <class P>
__device__ __forceinline__ bool pack_faulted(const P& p, int kernel, int b) {
  return pack_faulted(p.pack_fault, kernel, b, p.batch, p.cu_seqlens_q, p.total_q, p.seqlen_q,
                      0) ||
         pack_faulted(p.pack_fault, kernel, b, p.batch, p.cu_seqlens_k, p.total_k, p.seqlen_k, 1);
}

}  // namespace dashgen
#endif

#endif  // DASHGEN_ATTN_PACK_CHECK_CUH
