// dashgen/attn/fwd_mainloop.cuh: the forward's MMA mainloop, both MMA warpgroups (AttnFwdSm90,
// K), each owning 64 of the query tile's 128 rows. Per key tile, from the stages the producer
// filled: S = Q K^T (wgmma, K-major operands), the online softmax in registers, O += P V with P
// as the register A operand and V read MN-major. S of tile n + 1 is issued before P V of tile
// n and its softmax placed while P V is on the tensor cores; K's stage is released once its S
// is done, V's once its P V is. At the query tile's end the epilogue (K::Epilogue) takes O and
// the row statistics. K supplies the kernel's constants, its shared layout and its turns.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softcap.cuh"
#include "dashgen/attn/softmax.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/wgmma.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

template <class K>
struct FwdMainloop {
  using T = typename K::T;
  using Epilogue = typename K::Epilogue;
  // Enumerators, not static constexpr members, for the reason FwdProducer gives.
  enum : int {
    kHeadDim = K::kHeadDim,
    kHeadDimV = K::kHeadDimV,
    // S's k16 steps: Q's and K's columns in the tensors (attn/head_dim.cuh); past them both hold
    // zeros, whose steps would add exactly 0.
    kScoreSteps = tensor_head_dim<typename K::Config, K::kHeadDim>(0) / 16,
    kSoftcap = has_softcap<typename K::Config>(0),  // attn/softcap.cuh
    kWindow = K::kWindow,                           // a sliding window (attn/mask.cuh)
    kBlockM = K::kBlockM,
    kBlockN = K::kBlockN,
    kStages = K::kStages,
    kQBytes = K::kQBytes,
    kKBytes = K::kKBytes,
    kVBytes = K::kVBytes,
    kOBytes = K::kOBytes,
    kOffQ = K::kOffQ,
    kOffK = K::kOffK,
    kOffV = K::kOffV,
    kOffO = K::kOffO,
  };

  // O += P V: one k16 step, P from registers, N = V's head_dim, V MN-major.
  __device__ static void pv_mma(float (&o)[kHeadDimV / 2], const u32 (&a)[4], u64 desc_b) {
    wgmma_rs<K::kIn, kHeadDimV, 1>(o, a, desc_b, true);
  }

  // The K tile the CTA loaded g-th has landed.
  template <class B>
  __device__ static void wait_k(B* bars, int g) {
    mbarrier_wait_parity(&bars->k_full[g % kStages], (g / kStages) & 1);
  }

  // S = Q K^T into sc of the K tile the CTA loaded g-th (issued and committed, not waited for);
  // the caller waited for the tile (wait_k, before its turn where there are turns).
  __device__ static void issue_s(float (&sc)[kBlockN / 2], const char* q_tile, char* smem,
                                 int g) {
    const char* k_tile = smem + kOffK + (g % kStages) * kKBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kScoreSteps; ++k) {
      wgmma_ss<K::kIn, kBlockN>(sc, tile_desc_k_major(q_tile, 64, 0, k),
                                tile_desc_k_major(k_tile, kBlockN, 0, k), k > 0);
    }
    wgmma_commit_group();
  }

  // The scores of tile n (complete in sc) become unnormalized probabilities in place (fp32);
  // the running max/sum move on, and `correction` is what O must be scaled by before P V.
  __device__ static void softmax_tile(float (&sc)[kBlockN / 2], float (&row_max)[2],
                                      float (&row_sum)[2], float (&correction)[2],
                                      const FwdParams& p, int n, int row0, int t4) {
    // Soft-capped: the scores become t = tanh(score * scale / softcap), the softmax's scale
    // softcap (positive, so the max argument below holds for t too).
    const float scale_log2 = kSoftcap != 0 ? p.softcap * kLog2e : p.softmax_scale * kLog2e;
    if constexpr (kSoftcap != 0) {
      const float to_tanh = p.tanh_scale;
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) sc[i] = tanh_approx(sc[i] * to_tanh);
    }
    const int causal_offset = p.seqlen_k - p.seqlen_q;
    float tile_max[2] = {-DASHGEN_INF, -DASHGEN_INF};
    // The maxima of the raw scores (the scale is positive, so the max of the scaled scores is
    // the scaled max, bit for bit), and the mask only where it removes a key of this warp's
    // rows: a tile short of the sequence's end and (causal) of the warp's first row's diagonal
    // (a window: of both its bounds for all 16 rows) skips the per-element test. The warp's 16
    // rows start at row0 rounded down to 8.
    const bool edge =
        kWindow != 0 ? window_reaches(n * kBlockN, n * kBlockN + kBlockN - 1, row0 & ~7,
                                      (row0 & ~7) + 15, p.seqlen_k, causal_offset,
                                      window_params(p).window_left,
                                      window_params(p).window_right)
                     : mask_reaches<K::kCausal>(n * kBlockN + kBlockN - 1, row0 & ~7, p.seqlen_k,
                                                causal_offset);
    if (edge) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int half = (i / 2) % 2;
        const int key = n * kBlockN + 8 * (i / 4) + 2 * t4 + (i % 2);
        const int qrow = row0 + 8 * half;
        if (kWindow != 0 ? window_masked(key, qrow, p.seqlen_k, causal_offset,
                                         window_params(p).window_left,
                                         window_params(p).window_right)
                         : masked<K::kCausal>(key, qrow, p.seqlen_k, causal_offset)) {
          sc[i] = -DASHGEN_INF;
        }
        tile_max[half] = fmaxf(tile_max[half], sc[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        tile_max[(i / 2) % 2] = fmaxf(tile_max[(i / 2) % 2], sc[i]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) tile_max[half] *= scale_log2;
    online_softmax_rescale(tile_max, row_max, row_sum, correction);
    // exp2(score * scale - max) as one FFMA and the exponential.
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      const int half = (i / 2) % 2;
      sc[i] = exp2f(fmaf(sc[i], scale_log2, -softmax_base(row_max[half])));
      row_sum[half] += sc[i];
    }
  }

  __device__ static void pack_probs(const float (&sc)[kBlockN / 2], u32 (&pa)[kBlockN / 16][4]) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; i += 2) {
      pa[i / 8][(i % 8) / 2] = Element<T>::pack(sc[i], sc[i + 1]);
    }
  }

  // Tile n (the CTA's g-th K/V load): P V with the probabilities in pa; with kNext, S of tile
  // n + 1 goes first and its softmax runs while P V is on the tensor cores, leaving its
  // probabilities in pa. kReleaseQ: Q is released once S of the last of n_tiles is done. n
  // counts from the query tile's first K/V tile, n0 (0 but under a sliding window).
  template <bool kNext, bool kReleaseQ, bool kTurns, class B>
  __device__ static void step(float (&sc)[kBlockN / 2], u32 (&pa)[kBlockN / 16][4],
                              float (&o)[kHeadDimV / 2], float (&row_max)[2], float (&row_sum)[2],
                              float (&correction)[2], const FwdParams& p, char* smem, B* bars,
                              const char* q_tile, int n, int g, int n_tiles, int row0, int t4,
                              int wg, int tid, int n0) {
    // O is rescaled before any wgmma is in flight: ptxas serializes the pipeline if O is
    // touched between two wgmmas that are not separated by a wait.
#pragma unroll
    for (int j = 0; j < kHeadDimV / 2; ++j) o[j] *= correction[(j / 2) % 2];
    // S of tile n + 1 (sc's probabilities are in pa), then P V of tile n. With turns, both
    // tiles are waited for first: a warpgroup never holds the turn while a load is due.
    const int s = g % kStages;
    if constexpr (kNext) wait_k(bars, g + 1);
    if constexpr (kTurns) {
      mbarrier_wait_parity(&bars->v_full[s], (g / kStages) & 1);
      K::wait_turn(wg);
    }
    if constexpr (kNext) issue_s(sc, q_tile, smem, g + 1);
    if constexpr (!kTurns) mbarrier_wait_parity(&bars->v_full[s], (g / kStages) & 1);
    const char* v_tile = smem + kOffV + s * kVBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pv_mma(o, pa[kk], wgmma_desc_mn_major_sw128(v_tile + kk * kSw128MnMajorKStepBytes,
                                                  kBlockN * 128));
    }
    wgmma_commit_group();
    if constexpr (kTurns) K::pass_turn(wg);
    if constexpr (kNext) {
      // S of tile n + 1 (committed first) is done; P V of tile n may still run.
      wgmma_wait_group<1>();
      if (tid == 0) {
        mbarrier_arrive(&bars->k_empty[(g + 1) % kStages]);
        if constexpr (kReleaseQ) {
          if (n + 2 == n_tiles) mbarrier_arrive(&bars->q_empty);
        }
      }
      softmax_tile(sc, row_max, row_sum, correction, p, n0 + n + 1, row0, t4);
    }
    wgmma_wait_group<0>();  // P V of tile n: pa and V's stage are free
    if (tid == 0) mbarrier_arrive(&bars->v_empty[s]);
    if constexpr (kNext) pack_probs(sc, pa);
  }

  // Query tile (m, h, b), whose K/V tiles the CTA loads as its kv-th onwards; it is the CTA's
  // i-th. kReleaseQ (persistent CTAs): release Q's buffer once its last S is issued. kTurns:
  // the warpgroups take turns issuing (start_turns ran once in the CTA). Its n_tiles K/V tiles
  // start at tile n0 (0 but under a sliding window).
  template <bool kReleaseQ, bool kTurns, class B>
  __device__ static void consume(const FwdParams& p, char* smem, B* bars, int m, int h, int b,
                                 int n_tiles, int kv, int i, int wg, int tid, int n0 = 0) {
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    // This thread's two query rows (accumulator rows g and g + 8 of its warp).
    const int row0 = m * kBlockM + 64 * wg + 16 * warp + g;
    const char* q_tile = smem + kOffQ + wg * (kQBytes / 2);
    float o[kHeadDimV / 2];
#pragma unroll
    for (int j = 0; j < kHeadDimV / 2; ++j) o[j] = 0.f;
    float row_max[2] = {-DASHGEN_INF, -DASHGEN_INF}, row_sum[2] = {0.f, 0.f};

    mbarrier_wait_parity(&bars->q_full, i & 1);
    float sc[kBlockN / 2];        // S of the next tile, then its probabilities
    u32 pa[kBlockN / 16][4];      // P of the current tile, the A operand of P V
    float correction[2];
    if (n_tiles > 0) {
      wait_k(bars, kv);
      if constexpr (kTurns) K::wait_turn(wg);
      issue_s(sc, q_tile, smem, kv);
      if constexpr (kTurns) K::pass_turn(wg);
      wgmma_wait_group<0>();
      if (tid == 0) {
        mbarrier_arrive(&bars->k_empty[kv % kStages]);
        if constexpr (kReleaseQ) {
          if (n_tiles == 1) mbarrier_arrive(&bars->q_empty);
        }
      }
      softmax_tile(sc, row_max, row_sum, correction, p, n0, row0, t4);
      pack_probs(sc, pa);
    } else if constexpr (kReleaseQ) {
      if (tid == 0) mbarrier_arrive(&bars->q_empty);  // a tile that sees no key never reads Q
    }
    // Every tile but the last has a successor; the last runs the same step without it. Both
    // are straight-line code: ptxas follows which wgmma group a wait retires only there, and
    // would serialize the wgmmas otherwise.
    for (int n = 0; n + 1 < n_tiles; ++n) {
      step<true, kReleaseQ, kTurns>(sc, pa, o, row_max, row_sum, correction, p, smem, bars,
                                    q_tile, n, kv + n, n_tiles, row0, t4, wg, tid, n0);
    }
    if (n_tiles > 0) {
      step<false, kReleaseQ, kTurns>(sc, pa, o, row_max, row_sum, correction, p, smem, bars,
                                     q_tile, n_tiles - 1, kv + n_tiles - 1, n_tiles, row0, t4,
                                     wg, tid, n0);
    }

    Epilogue::store_o_lse(p, o, row_max, row_sum, h, b, row0, smem + kOffO + wg * (kOBytes / 2),
                          warp, lane);
  }
};

}  // namespace dashgen
