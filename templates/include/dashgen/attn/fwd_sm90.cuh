// dashgen/attn/fwd_sm90.cuh: the Hopper-native attention forward, O and the logsumexp.
// One CTA per 128 query rows of one head: warpgroup 0's first thread streams K/V tiles with TMA
// through 2 stages; warpgroups 1 and 2 each own 64 query rows: S = Q K^T with wgmma (K-major
// operands), online softmax in registers, O += P V with P as the register A operand and V read
// MN-major. Pipelined within each MMA warpgroup: S of tile n + 1 is issued before P V of tile n,
// and its softmax is placed while P V of tile n is on the tensor cores (ptxas moves the wait
// for P V ahead of most of it; the other warpgroup's matmuls fill that time). K and V stages
// are released separately (K once its S is done, V once its P V is), so K of tile n + 1 can
// land while V of tile n is still read. Where it pays
// (kOneTileTurns, the persistent kernels), the two MMA warpgroups take turns issuing their
// wgmmas (named barriers), so one warpgroup's softmax runs while the other's matmuls hold the
// tensor cores. Deterministic by construction: no cross-CTA reduction.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/pack_check.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softmax.cuh"
#include "dashgen/ptx/barrier.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/regs.cuh"
#include "dashgen/ptx/stmatrix.cuh"
#include "dashgen/ptx/tma.cuh"
#include "dashgen/ptx/wgmma.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
// The roles last: the headers above come first in the order they always did, since the globals
// they define are emitted in that order (the packs' fault flag among them, pack_check.cuh).
#include "dashgen/attn/fwd_epilogue.cuh"
#include "dashgen/attn/fwd_producer.cuh"

namespace dashgen {

// Named barrier ids of the forward (bar.sync; 0 is __syncthreads'): each MMA warpgroup's turn
// (turn_barrier), consecutive so that warpgroup wg's is kTurnWg0 + wg.
enum class FwdBarrier : u32 { kTurnWg0 = 1, kTurnWg1 = 2 };
static_assert(static_cast<u32>(FwdBarrier::kTurnWg1) == static_cast<u32>(FwdBarrier::kTurnWg0) + 1,
              "turn_barrier adds the warpgroup to kTurnWg0");

// The columns of V and O: Cfg::kHeadDimV where the entry template renders one (V narrower than Q
// and K), else Cfg::kHeadDim. Call with 0.
template <class Cfg>
__host__ __device__ constexpr auto fwd_head_dim_v(int) -> decltype(Cfg::kHeadDimV + 0) {
  return Cfg::kHeadDimV;
}
template <class Cfg>
__host__ __device__ constexpr int fwd_head_dim_v(long) {
  return Cfg::kHeadDim;
}

// Cfg: the configuration the entry template renders (attn_fwd_sm90.cu.j2); its members are
// named here as the kernel uses them.
template <class Cfg>
struct AttnFwdSm90 {
  using T = typename Cfg::Element;
  static constexpr int kHeadDim = Cfg::kHeadDim;  // columns of Q and K
  static constexpr bool kCausal = Cfg::kCausal;
  static constexpr int kBlockM = Cfg::kBlockM;  // query rows per CTA: 64 per MMA warpgroup
  static constexpr int kBlockN = Cfg::kBlockN;  // keys per K/V tile
  static_assert(kBlockM == 128, "128 query rows: 64 per MMA warpgroup");
  // S = Q K^T is one wgmma of N = kBlockN a k16 step (the shapes wgmma_ss has: 80, 112, 128),
  // and P V takes kBlockN keys in k16 steps, P's registers 16 keys a step.
  static_assert(kBlockN == 80 || kBlockN == 112 || kBlockN == 128, "key tiles of 80, 112 or 128");
  // V's and O's sizes are enumerators, not static members: NVRTC emits each static constexpr
  // member as a global of the module, and each one more moves the globals emitted after them
  // (the packs' fault flag, pack_check.cuh) to another constant-bank slot in the kernels'
  // code.
  enum : int {
    kHeadDimV = fwd_head_dim_v<Cfg>(0),  // columns of V and O
    kColBlocksV = kHeadDimV / 64,
    kVBytes = kBlockN * kHeadDimV * 2,   // a V stage
    kOBytes = kBlockM * kHeadDimV * 2,   // O's staging tile (kStagedO)
  };

  static constexpr WgmmaInput kIn = Element<T>::kWgmma;
  static constexpr int kThreads = 384;
  // setmaxnreg split of the SM's 65536 registers: the producer warpgroup only issues TMA loads
  // from one lane and fits the minimum, which leaves each MMA warpgroup the largest multiple of
  // 8 that fits beside it, for O and the S/P tiles.
  static constexpr int kProducerRegs = 24;
  static constexpr int kMmaRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kMmaRegs <= 65536, "register file");
  static constexpr int kStages = 2;
  // Tiles are loaded and read as 64-column blocks, one 128-byte swizzle row each (TMA boxes of
  // 64 columns, wgmma's 128B-swizzled operands): head_dims of whole blocks. 96 would be one and
  // a half, which the 128-byte swizzle cannot lay out.
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "head_dim 64, 128, 192 or 256");
  static_assert(kHeadDimV == kHeadDim || (kHeadDim == 192 && kHeadDimV == 128),
                "V as wide as Q and K, or 128 columns under head_dim 192");
  static constexpr int kColBlocks = kHeadDim / 64;

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  // O leaves through a staging tile at head_dim 128 (FwdEpilogue); at 64 it gained nothing
  // (docs/design.md, `fwd-o-staging`), so the head_dim-64 kernels keep their layout and stores.
  // Past 128 the tile does not fit beside Q and the K/V stages (227 KB), so those kernels store
  // O from the accumulator too.
  static constexpr bool kStagedO = kHeadDim == 128;
  static constexpr int kOffO = kOffV + kStages * kVBytes;
  // 16-byte chunks in a row of O (FwdEpilogue). A static member where V's sizes are
  // enumerators: the module keeps as many globals as before, and so the fault flag its slot.
  static constexpr int kChunks = kHeadDimV / 8;
  static constexpr int kOffBar = kOffO + (kStagedO ? kOBytes : 0);
  static constexpr int kNumBars = 1 + 4 * kStages;
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= kSm90MaxSmemBytes,
                "shared memory exceeds what an sm_90 block may use");

  // Turns: MMA warpgroup wg issues its wgmmas after its turn barrier completes (its own
  // 128 threads waiting, the other warpgroup's 128 arriving) and then passes the turn. Both
  // warpgroups of a query tile issue equally often, so the alternation carries over from one
  // tile to the next (persistent CTAs); warpgroup 1 hands warpgroup 0 the first turn once per
  // CTA (start_turns). 0 is __syncthreads'. Where they pay (H200, docs/design.md `fwd-turns`):
  // the persistent kernels and the one-tile kernel at head_dim 128. The one-tile kernel at
  // head_dim 64 measured 3-5% slower with them (why is not known: it too runs one CTA an SM).
  // Packs keep the kernel without. Past 128 the one-tile kernel runs without them until a GPU
  // measures both (FA3 orders its warpgroups only up to head_dim 128).
  static constexpr bool kOneTileTurns = kHeadDim == 128;
  // Warpgroup wg's turn barrier (FwdBarrier: kTurnWg0 + wg, consecutive ids). A select between
  // the two ids instead compiled to other kernels (each persistent one 8 instructions longer).
  __device__ static u32 turn_barrier(int wg) {
    return static_cast<u32>(FwdBarrier::kTurnWg0) + static_cast<u32>(wg);
  }
  __device__ static void start_turns(int wg) {
    if (wg == 1) named_barrier_arrive(static_cast<u32>(FwdBarrier::kTurnWg0), 256);
  }
  __device__ static void wait_turn(int wg) { named_barrier_sync(turn_barrier(wg), 256); }
  __device__ static void pass_turn(int wg) { named_barrier_arrive(turn_barrier(wg ^ 1), 256); }

  using Producer = FwdProducer<AttnFwdSm90>;
  using Epilogue = FwdEpilogue<AttnFwdSm90>;

  struct Bars {
    u64 q_full;
    u64 k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
  };

  // The one-CTA-a-tile kernels' query tile. The hardware hands out CTAs x fastest; under a
  // causal mask x counts from the last tile, so each head's longest tiles start first and the
  // grid ends on short tiles instead of a head's longest.
  __device__ static int query_tile() {
    return kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  }

  // Keys past the last one any row of this CTA sees are skipped (causal: bottom-right aligned).
  __device__ static int num_kv_tiles(const FwdParams& p, int m) {
    int key_end = p.seqlen_k;
    if (kCausal) key_end = min(key_end, max(0, (m + 1) * kBlockM + p.seqlen_k - p.seqlen_q));
    return (key_end + kBlockN - 1) / kBlockN;
  }

  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k, const TensorMap* tm_v,
                             const FwdParams& p, char* smem_raw) {
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    const int m = query_tile(), h = blockIdx.y, b = blockIdx.z;
    const int n_tiles = num_kv_tiles(p, m);
    if (threadIdx.x == 0) init_barriers<false>(bars);
    __syncthreads();

    if (threadIdx.x / 128 == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x == 0) {
        Producer::template produce<false>(tm_q, tm_k, tm_v, p, smem, bars, m, h, b, n_tiles,
                                          0, 0);
      }
      return;
    }
    setmaxnreg_inc<kMmaRegs>();
    if constexpr (kOneTileTurns) start_turns(threadIdx.x / 128 - 1);
    consume<false, kOneTileTurns>(p, smem, bars, m, h, b, n_tiles, 0, 0, threadIdx.x / 128 - 1,
                                  threadIdx.x % 128);
  }

  // A pack (Cfg::kVarlen; FwdParams::cu_seqlens_q/k): CTA (m, h, b) is query tile m of
  // sequence b, and exits at once past the sequence's last tile. It runs the one-tile code on
  // the sequence as a batch of one: its rows and keys are the packed tensors' from the
  // sequence's first, its lse rows a (heads_q, seqlen_q) block. Loads past its end read the next
  // sequence's rows (finite, so their P = 0 adds exact zeros), which the key mask (keys past
  // seqlen_k) and the stores' row bound leave out: the sequence's bits are those it has alone.
  // Every CTA checks its sequence's offsets first (attn/pack_check.cuh).
  __device__ static void run_packed(const TensorMap* tm_q, const TensorMap* tm_k,
                                    const TensorMap* tm_v, const FwdParams& p, char* smem_raw) {
    const int m = query_tile(), h = blockIdx.y, b = blockIdx.z;
    if (pack_faulted(p, 1, b)) return;
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    FwdParams seq = p;
    seq.seqlen_q = p.cu_seqlens_q[b + 1] - q0;
    seq.seqlen_k = p.cu_seqlens_k[b + 1] - k0;
    if (m * kBlockM >= seq.seqlen_q) return;
    seq.o = static_cast<T*>(p.o) + static_cast<i64>(q0) * p.o_row_stride;
    seq.lse = p.lse + static_cast<i64>(p.heads_q) * q0;
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    const int n_tiles = num_kv_tiles(seq, m);
    if (threadIdx.x == 0) init_barriers<false>(bars);
    __syncthreads();

    if (threadIdx.x / 128 == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x == 0) {
        Producer::template produce<false>(tm_q, tm_k, tm_v, seq, smem, bars, m, h, 0, n_tiles,
                                          0, 0, q0, k0);
      }
      return;
    }
    setmaxnreg_inc<kMmaRegs>();
    consume<false, false>(seq, smem, bars, m, h, 0, n_tiles, 0, 0, threadIdx.x / 128 - 1,
                          threadIdx.x % 128);
  }

  // kQEmpty: the barriers include Q's empty one (persistent CTAs).
  template <bool kQEmpty, class B>
  __device__ static void init_barriers(B* bars) {
    mbarrier_init(&bars->q_full, 1);
    if constexpr (kQEmpty) mbarrier_init(&bars->q_empty, 2);  // one arrive per MMA warpgroup
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bars->k_full[s], 1);
      mbarrier_init(&bars->v_full[s], 1);
      mbarrier_init(&bars->k_empty[s], 2);  // one arrive per MMA warpgroup
      mbarrier_init(&bars->v_empty[s], 2);
    }
    fence_barrier_init();
  }

  // O += P V: one k16 step, P from registers, N = V's head_dim, V MN-major.
  __device__ static void pv_mma(float (&o)[kHeadDimV / 2], const u32 (&a)[4], u64 desc_b) {
    wgmma_rs<kIn, kHeadDimV, 1>(o, a, desc_b, true);
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
    for (int k = 0; k < kHeadDim / 16; ++k) {
      wgmma_ss<kIn, kBlockN>(sc, tile_desc_k_major(q_tile, 64, 0, k),
                             tile_desc_k_major(k_tile, kBlockN, 0, k), k > 0);
    }
    wgmma_commit_group();
  }

  // The scores of tile n (complete in sc) become unnormalized probabilities in place (fp32);
  // the running max/sum move on, and `correction` is what O must be scaled by before P V.
  __device__ static void softmax_tile(float (&sc)[kBlockN / 2], float (&row_max)[2],
                                      float (&row_sum)[2], float (&correction)[2],
                                      const FwdParams& p, int n, int row0, int t4) {
    const float scale_log2 = p.softmax_scale * kLog2e;
    const int causal_offset = p.seqlen_k - p.seqlen_q;
    float tile_max[2] = {-DASHGEN_INF, -DASHGEN_INF};
    // The maxima of the raw scores (the scale is positive, so the max of the scaled scores is
    // the scaled max, bit for bit), and the mask only where it removes a key of this warp's
    // rows: a tile short of the sequence's end and (causal) of the warp's first row's diagonal
    // skips the per-element test. The warp's 16 rows start at row0 rounded down to 8.
    if (mask_reaches<kCausal>(n * kBlockN + kBlockN - 1, row0 & ~7, p.seqlen_k, causal_offset)) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int half = (i / 2) % 2;
        const int key = n * kBlockN + 8 * (i / 4) + 2 * t4 + (i % 2);
        if (masked<kCausal>(key, row0 + 8 * half, p.seqlen_k, causal_offset)) sc[i] = -DASHGEN_INF;
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
  // probabilities in pa. kReleaseQ: Q is released once S of the last of n_tiles is done.
  template <bool kNext, bool kReleaseQ, bool kTurns, class B>
  __device__ static void step(float (&sc)[kBlockN / 2], u32 (&pa)[kBlockN / 16][4],
                              float (&o)[kHeadDimV / 2], float (&row_max)[2], float (&row_sum)[2],
                              float (&correction)[2], const FwdParams& p, char* smem, B* bars,
                              const char* q_tile, int n, int g, int n_tiles, int row0, int t4,
                              int wg, int tid) {
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
      wait_turn(wg);
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
    if constexpr (kTurns) pass_turn(wg);
    if constexpr (kNext) {
      // S of tile n + 1 (committed first) is done; P V of tile n may still run.
      wgmma_wait_group<1>();
      if (tid == 0) {
        mbarrier_arrive(&bars->k_empty[(g + 1) % kStages]);
        if constexpr (kReleaseQ) {
          if (n + 2 == n_tiles) mbarrier_arrive(&bars->q_empty);
        }
      }
      softmax_tile(sc, row_max, row_sum, correction, p, n + 1, row0, t4);
    }
    wgmma_wait_group<0>();  // P V of tile n: pa and V's stage are free
    if (tid == 0) mbarrier_arrive(&bars->v_empty[s]);
    if constexpr (kNext) pack_probs(sc, pa);
  }

  // Query tile (m, h, b), whose K/V tiles the CTA loads as its kv-th onwards; it is the CTA's
  // i-th. kReleaseQ (persistent CTAs): release Q's buffer once its last S is issued. kTurns:
  // the warpgroups take turns issuing (start_turns ran once in the CTA).
  template <bool kReleaseQ, bool kTurns, class B>
  __device__ static void consume(const FwdParams& p, char* smem, B* bars, int m, int h, int b,
                                 int n_tiles, int kv, int i, int wg, int tid) {
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
      if constexpr (kTurns) wait_turn(wg);
      issue_s(sc, q_tile, smem, kv);
      if constexpr (kTurns) pass_turn(wg);
      wgmma_wait_group<0>();
      if (tid == 0) {
        mbarrier_arrive(&bars->k_empty[kv % kStages]);
        if constexpr (kReleaseQ) {
          if (n_tiles == 1) mbarrier_arrive(&bars->q_empty);
        }
      }
      softmax_tile(sc, row_max, row_sum, correction, p, 0, row0, t4);
      pack_probs(sc, pa);
    } else if constexpr (kReleaseQ) {
      if (tid == 0) mbarrier_arrive(&bars->q_empty);  // a tile that sees no key never reads Q
    }
    // Every tile but the last has a successor; the last runs the same step without it. Both
    // are straight-line code: ptxas follows which wgmma group a wait retires only there, and
    // would serialize the wgmmas otherwise.
    for (int n = 0; n + 1 < n_tiles; ++n) {
      step<true, kReleaseQ, kTurns>(sc, pa, o, row_max, row_sum, correction, p, smem, bars,
                                    q_tile, n, kv + n, n_tiles, row0, t4, wg, tid);
    }
    if (n_tiles > 0) {
      step<false, kReleaseQ, kTurns>(sc, pa, o, row_max, row_sum, correction, p, smem, bars,
                                     q_tile, n_tiles - 1, kv + n_tiles - 1, n_tiles, row0, t4,
                                     wg, tid);
    }

    Epilogue::store_o_lse(p, o, row_max, row_sum, h, b, row0, smem + kOffO + wg * (kOBytes / 2),
                          warp, lane);
  }
};

}  // namespace dashgen
