// dashgen/attn/mask.cuh: which (key, query row) pairs of a task the mask removes, and whether it
// removes any, so that a task it does not reach skips the per-element test. Plain integer code:
// it compiles as host C++ too (tests/test_mask_header.py checks mask_reaches against every pair).
#ifndef DASHGEN_ATTN_MASK_CUH
#define DASHGEN_ATTN_MASK_CUH

#include "dashgen/host_device.cuh"

namespace dashgen {

// Keys at or past keys_end (the sequence's end) are masked; under the causal mask, bottom-right
// aligned, so are keys after query row + diagonal (diagonal = seqlen_k - seqlen_q).
template <bool kCausal>
DASHGEN_HD bool masked(int key, int qrow, int keys_end, int diagonal) {
  return key >= keys_end || (kCausal && key > qrow + diagonal);
}

// Whether the mask removes any pair of keys first_key .. last_key and query rows from
// first_row on: the last key against the sequence's end and against the first row's diagonal.
template <bool kCausal>
DASHGEN_HD bool mask_reaches(int last_key, int first_row, int keys_end, int diagonal) {
  return masked<kCausal>(last_key, first_row, keys_end, diagonal);
}

// A sliding window (FlashAttention's window_size; sched::WindowTiling): query row qrow sees
// keys qrow + diagonal - left .. qrow + diagonal + right, and none at or past keys_end. The two
// window bounds are one unsigned range compare: key - (qrow + diagonal - left) wraps past
// left + right when the key lies left of the band. Unsigned throughout, as left + right can
// reach 2^31 with an open side (UNBOUNDED); this form compiles the GQA kernels without spills.
DASHGEN_HD bool window_masked(int key, int qrow, int keys_end, int diagonal, int left,
                              int right) {
  return key >= keys_end || static_cast<unsigned>(key - qrow - diagonal) +
                                    static_cast<unsigned>(left) >
                                static_cast<unsigned>(left) + static_cast<unsigned>(right);
}

// Whether the window removes any pair of keys first_key .. last_key and query rows first_row ..
// last_row: the last key against the end and the first row's right bound, the first key
// against the last row's left bound.
DASHGEN_HD bool window_reaches(int first_key, int last_key, int first_row, int last_row,
                               int keys_end, int diagonal, int left, int right) {
  return last_key >= keys_end || last_key > first_row + diagonal + right ||
         first_key < last_row + diagonal - left;
}

// Cfg::kWindow where the entry template renders one (a sliding-window variant), else 0. Call
// with 0.
template <class Cfg>
DASHGEN_HD constexpr auto has_window(int) -> decltype(Cfg::kWindow + 0) {
  return Cfg::kWindow;
}
template <class Cfg>
DASHGEN_HD constexpr int has_window(long) {
  return 0;
}

}  // namespace dashgen

#endif  // DASHGEN_ATTN_MASK_CUH
