// dashgen/attn/fwd.cuh: the attention forward, O and the logsumexp the backward needs. One CTA per
// (Q tile, head, batch); each warp owns 16 query rows and keeps scores, softmax state and O in
// registers (online softmax). Deterministic by construction: no cross-CTA reduction.
#pragma once
#include "dashgen/attn/fragments.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softmax.cuh"
#include "dashgen/attn/tile_io.cuh"

namespace dashgen {

template <class T, int kHeadDim, int kBlockM, int kBlockN, bool kCausal>
struct AttnFwd {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kBlockM == 16 * kWarps, "one 16-row strip per warp");
  static constexpr int kLdT = kHeadDim + 8;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kBlockM * kLdT * 2;
  static constexpr int kOffV = kOffK + kBlockN * kLdT * 2;
  static constexpr int kSmemBytes = kOffV + kBlockN * kLdT * 2;

  __device__ static void run(const FwdParams& p, char* smem) {
    T* s_q = reinterpret_cast<T*>(smem + kOffQ);
    T* s_k = reinterpret_cast<T*>(smem + kOffK);
    T* s_v = reinterpret_cast<T*>(smem + kOffV);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (p.heads_q / p.heads_kv);
    const i64 q_base = (static_cast<i64>(b) * p.seqlen_q * p.heads_q + h) * kHeadDim;
    const i64 kv_base = (static_cast<i64>(b) * p.seqlen_k * p.heads_kv + hk) * kHeadDim;
    const int causal_offset = p.seqlen_k - p.seqlen_q;
    const float scale_log2 = p.softmax_scale * kLog2e;

    load_rows<T, kBlockM, kHeadDim, kLdT, kThreads>(s_q, static_cast<const T*>(p.q) + q_base,
                                                    m * kBlockM, p.seqlen_q, p.q_row_stride, tid);
    // Keys past the last one any row of this tile sees are skipped (causal: bottom-right aligned).
    int key_end = p.seqlen_k;
    if (kCausal) key_end = min(key_end, max(0, (m + 1) * kBlockM - 1 + causal_offset + 1));
    const int n_blocks = (key_end + kBlockN - 1) / kBlockN;

    const int r0 = 16 * warp;
    float o[kHeadDim / 8][4];
    zero_acc(o);
    float row_max[2] = {-DASHGEN_INF, -DASHGEN_INF}, row_sum[2] = {0.f, 0.f};

    for (int n = 0; n < n_blocks; ++n) {
      __syncthreads();  // the previous K/V tiles are no longer read
      load_rows<T, kBlockN, kHeadDim, kLdT, kThreads>(s_k, static_cast<const T*>(p.k) + kv_base,
                                                      n * kBlockN, p.seqlen_k, p.k_row_stride, tid);
      load_rows<T, kBlockN, kHeadDim, kLdT, kThreads>(s_v, static_cast<const T*>(p.v) + kv_base,
                                                      n * kBlockN, p.seqlen_k, p.k_row_stride, tid);
      __syncthreads();

      float s[kBlockN / 8][4];
      zero_acc(s);
      warp_strip_mma<T, kBlockN, kHeadDim>(s, row_major(s_q, kLdT), col_major(s_k, kLdT), r0, lane);
      float tile_max[2] = {-DASHGEN_INF, -DASHGEN_INF};
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m * kBlockM + r0 + g + 8 * (e / 2), key = n * kBlockN + 8 * j + 2 * t + (e % 2);
          const bool masked = key >= p.seqlen_k || (kCausal && key > row + causal_offset);
          s[j][e] = masked ? -DASHGEN_INF : s[j][e] * scale_log2;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
        }
      }
      float correction[2];
      online_softmax_rescale(tile_max, row_max, row_sum, correction);
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float base = softmax_base(row_max[e / 2]);
          s[j][e] = exp2f(s[j][e] - base);
          row_sum[e / 2] += s[j][e];
        }
      }
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        o[j][0] *= correction[0]; o[j][1] *= correction[0];
        o[j][2] *= correction[1]; o[j][3] *= correction[1];
      }
      // P as the A operand straight from the accumulator registers: the C layout of two adjacent
      // n8 tiles is the A layout of one k16 step.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        u32 a[4];
        a[0] = Element<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        a[1] = Element<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        a[2] = Element<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = Element<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const auto vv = row_major(s_v, kLdT);
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; j += 2) {
          u32 bf[4];
          load_b2(bf, vv, 16 * kk, 8 * j, lane);
          mma_pair<T>(o[j], o[j + 1], a, bf);
        }
      }
    }

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 1);
      row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 2);
    }
    T* out = static_cast<T*>(p.o) + q_base;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m * kBlockM + r0 + g + 8 * half;
      if (row >= p.seqlen_q) continue;
      const float inv = row_sum[half] > 0.f ? 1.f / row_sum[half] : 0.f;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        *reinterpret_cast<u32*>(out + static_cast<i64>(row) * p.o_row_stride + 8 * j + 2 * t) =
            Element<T>::pack(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
      }
      if (t == 0) {
        // lse in natural-log units of the scaled scores; -inf for a row that sees no key.
        const float lse = row_sum[half] > 0.f ? (row_max[half] + log2f(row_sum[half])) / kLog2e
                                              : -DASHGEN_INF;
        p.lse[(static_cast<i64>(b) * p.heads_q + h) * p.seqlen_q + row] = lse;
      }
    }
  }
};

}  // namespace dashgen
