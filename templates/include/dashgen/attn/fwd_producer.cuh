// dashgen/attn/fwd_producer.cuh: the forward's producer, the first thread of the producer
// warpgroup (AttnFwdSm90, K): a query tile's Q once, then its K and V tiles through the
// kStages stages, each stage's K and V on barriers of their own so that the MMA warpgroups
// free K (once its S is done) before V (once its P V is). All by TMA, completing on mbarriers.
// Tensor-map coordinates run innermost first over (batch, seqlen, heads, head_dim) tensors:
// (column, head, row, batch).
#pragma once
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/tma.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

template <class K>
struct FwdProducer {
  // K's sizes as enumerators: a static constexpr member here would be one more global of the
  // module and move the globals emitted after it (AttnFwdSm90's V sizes say why that matters).
  enum : int {
    kBlockM = K::kBlockM,
    kBlockN = K::kBlockN,
    kStages = K::kStages,
    kColBlocks = K::kColBlocks,
    kColBlocksV = K::kColBlocksV,
    kQBytes = K::kQBytes,
    kKBytes = K::kKBytes,
    kVBytes = K::kVBytes,
    kOffQ = K::kOffQ,
    kOffK = K::kOffK,
    kOffV = K::kOffV,
  };

  // The loads for query tile (m, h, b), the CTA's i-th, whose K/V tiles are its kv-th on (a
  // pack: b = 0, and the sequence's rows start at q_row0 and k_row0 of the packed tensors):
  // n_tiles K/V tiles from tile n0 (0 but under a sliding window).
  // kWaitQ (persistent CTAs, fwd_sm90_persistent.cuh): Q's buffer is reused, free once both
  // MMA warpgroups issued the previous tile's last S. B: the kernel's barriers.
  template <bool kWaitQ, class B>
  __device__ static void produce(const TensorMap* tm_q, const TensorMap* tm_k,
                                 const TensorMap* tm_v, const FwdParams& p, char* smem, B* bars,
                                 int m, int h, int b, int n_tiles, int i, int kv, int q_row0 = 0,
                                 int k_row0 = 0, int n0 = 0) {
    const int hk = h / (p.heads_q / p.heads_kv);
    if constexpr (kWaitQ) mbarrier_wait_parity(&bars->q_empty, (i & 1) ^ 1);
    mbarrier_arrive_expect_tx(&bars->q_full, kQBytes);
    for (int half = 0; half < 2; ++half) {
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffQ + half * (kQBytes / 2) + cb * 64 * 128, tm_q, &bars->q_full,
                    cb * 64, h, q_row0 + m * kBlockM + 64 * half, b);
      }
    }
    for (int n = 0; n < n_tiles; ++n) {
      const int s = (kv + n) % kStages, use = (kv + n) / kStages;
      mbarrier_wait_parity(&bars->k_empty[s], (use & 1) ^ 1);
      mbarrier_arrive_expect_tx(&bars->k_full[s], kKBytes);
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffK + s * kKBytes + cb * kBlockN * 128, tm_k, &bars->k_full[s],
                    cb * 64, hk, k_row0 + (n0 + n) * kBlockN, b);
      }
      mbarrier_wait_parity(&bars->v_empty[s], (use & 1) ^ 1);
      mbarrier_arrive_expect_tx(&bars->v_full[s], kVBytes);
      for (int cb = 0; cb < kColBlocksV; ++cb) {
        tma_load_4d(smem + kOffV + s * kVBytes + cb * kBlockN * 128, tm_v, &bars->v_full[s],
                    cb * 64, hk, k_row0 + (n0 + n) * kBlockN, b);
      }
    }
  }
};

}  // namespace dashgen
