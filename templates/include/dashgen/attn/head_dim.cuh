// dashgen/attn/head_dim.cuh: the head_dim of the tensors against the kernel's. A head_dim without
// 128-byte swizzle blocks of its own (96: one and a half) runs in the next wider kernel (128),
// and the entry template then renders Cfg::kTensorHeadDim. The TMA descriptors carry the
// tensors' width, so the loads read zeros past it and each product with those columns adds 0
// to its sum; the fp32 scratch (dQ, GQA's dK/dV sums) keeps the kernel's width. What addresses the
// tensors directly uses the tensors' width for a head's offset and stores no column from it on.
#pragma once

namespace dashgen {

// Cfg::kTensorHeadDim where the entry template renders one, else kKernel (the kernel's width,
// or the forward's V width). Call with 0.
template <class Cfg, int kKernel>
__host__ __device__ constexpr auto tensor_head_dim(int) -> decltype(Cfg::kTensorHeadDim + 0) {
  return Cfg::kTensorHeadDim;
}
template <class Cfg, int kKernel>
__host__ __device__ constexpr int tensor_head_dim(long) {
  return kKernel;
}

// The columns of V, O and dO: Cfg::kHeadDimV where the entry template renders one (V narrower
// than Q and K: 128 under 192, DeepSeek's MLA), else Cfg::kHeadDim. Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto head_dim_v(int) -> decltype(Cfg::kHeadDimV + 0) {
  return Cfg::kHeadDimV;
}
template <class Cfg>
__host__ __device__ constexpr int head_dim_v(long) {
  return Cfg::kHeadDim;
}

// Cfg::kDkvSwapped where the entry template renders one, else 0: the backward at a head_dim
// whose dK/dV over 64 KV rows do not fit a warpgroup's registers (256) runs the swapped
// mainloop (attn/bwd_mainloop_swapped.cuh), and its fp32 dQ sum is column-block-major per tile
// (AttnConvert). Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto dkv_swapped(int) -> decltype(Cfg::kDkvSwapped + 0) {
  return Cfg::kDkvSwapped;
}
template <class Cfg>
__host__ __device__ constexpr int dkv_swapped(long) {
  return 0;
}

// Cfg::kDqPerWarpgroup where the entry template renders one, else 0: swapped (256), each MMA
// warpgroup hands its dQ pieces over through a buffer of its own
// (AttnBwdSm90::kDqPerWg; at 256 dO on one stage to make room). Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto dq_per_warpgroup(int) -> decltype(Cfg::kDqPerWarpgroup + 0) {
  return Cfg::kDqPerWarpgroup;
}
template <class Cfg>
__host__ __device__ constexpr int dq_per_warpgroup(long) {
  return 0;
}

// Cfg::kDqWriters where the entry template renders one (two dQ writer lanes, a buffer each:
// AttnBwdSm90::kDqWriters), else 1. Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto dq_writers(int) -> decltype(Cfg::kDqWriters + 0) {
  return Cfg::kDqWriters;
}
template <class Cfg>
__host__ __device__ constexpr int dq_writers(long) {
  return 1;
}

}  // namespace dashgen
