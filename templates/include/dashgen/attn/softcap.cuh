// dashgen/attn/softcap.cuh: soft-capping, FlashAttention's softcap (Gemma 2's attention-logit
// cap): each scaled score s becomes softcap * tanh(s / softcap) before the softmax. The kernels
// form t = tanh(q.k * softmax_scale / softcap) in place of the score and run the softmax with
// softcap as its scale (P = exp(softcap * t - lse)); the backward multiplies dS by the
// derivative, 1 - t^2. The entry template renders Cfg::kSoftcap only for a soft-capped variant.
#pragma once

namespace dashgen {

// tanh as the hardware's approximation (tanh.approx.f32, one MUFU instruction, relative error
// about 2^-11): the forward and the backward form the same t from the same score, so the
// backward's P is the forward's.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Cfg::kSoftcap where the entry template renders one, else 0. Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto has_softcap(int) -> decltype(Cfg::kSoftcap + 0) {
  return Cfg::kSoftcap;
}
template <class Cfg>
__host__ __device__ constexpr int has_softcap(long) {
  return 0;
}

}  // namespace dashgen
