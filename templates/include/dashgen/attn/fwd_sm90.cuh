// dashgen/attn/fwd_sm90.cuh: the Hopper-native attention forward, O and the logsumexp, as the
// composition of its roles. One CTA per 128 query rows of one head (the persistent kernel,
// fwd_sm90_persistent.cuh, runs the same roles on CTAs that walk several query tiles). This
// header says which roles run on which warps, which named barriers and mbarriers join them, the
// pipeline's stages and the shared-memory layout, and holds the kernel entries (run,
// run_packed) that start each role; each role is a struct of its own header, templated on this
// kernel for its constants:
//   warpgroup 0, thread 0: FwdProducer (attn/fwd_producer.cuh): TMA loads of the query tile's
//                          Q, then its K/V tiles through kStages stages;
//   warpgroups 1, 2:       FwdMainloop (attn/fwd_mainloop.cuh): MMA, each owning 64 query rows:
//                          S = Q K^T with wgmma (K-major operands), online softmax in registers,
//                          O += P V with P as the register A operand and V read MN-major; at the
//                          query tile's end FwdEpilogue (attn/fwd_epilogue.cuh): O, normalized,
//                          and the logsumexp to global memory.
// Pipelined within each MMA warpgroup: S of tile n + 1 is issued before P V of tile n, and its
// softmax is placed while P V of tile n is on the tensor cores (ptxas moves the wait for P V
// ahead of most of it; the other warpgroup's matmuls fill that time). K and V stages are
// released separately (K once its S is done, V once its P V is), so K of tile n + 1 can land
// while V of tile n is still read. Where it pays (kOneTileTurns, the persistent kernels), the
// two MMA warpgroups take turns issuing their wgmmas (named barriers), so one warpgroup's
// softmax runs while the other's matmuls hold the tensor cores. Deterministic by construction:
// no cross-CTA reduction.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/head_dim.cuh"
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
#include "dashgen/attn/fwd_mainloop.cuh"
#include "dashgen/attn/fwd_producer.cuh"

namespace dashgen {

// Named barrier ids of the forward (bar.sync; 0 is __syncthreads'): each MMA warpgroup's turn
// (turn_barrier), consecutive so that warpgroup wg's is kTurnWg0 + wg.
enum class FwdBarrier : u32 { kTurnWg0 = 1, kTurnWg1 = 2 };
static_assert(static_cast<u32>(FwdBarrier::kTurnWg1) == static_cast<u32>(FwdBarrier::kTurnWg0) + 1,
              "turn_barrier adds the warpgroup to kTurnWg0");

// Cfg: the configuration the entry template renders (attn_fwd_sm90.cu.j2); its members are
// named here as the kernel uses them.
template <class Cfg>
struct AttnFwdSm90 {
  using Config = Cfg;
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
    kWindow = has_window<Cfg>(0),        // a sliding window (attn/mask.cuh)
    kHeadDimV = head_dim_v<Cfg>(0),  // columns of V and O (attn/head_dim.cuh)
    kColBlocksV = kHeadDimV / 64,
    kVBytes = kBlockN * kHeadDimV * 2,   // a V stage
    kOBytes = kBlockM * kHeadDimV * 2,   // O's staging tile (kStagedO)
  };

  // ---- warps ----------------------------------------------------------------------------------
  static constexpr WgmmaInput kIn = Element<T>::kWgmma;
  static constexpr int kThreads = 384;
  // setmaxnreg split of the SM's 65536 registers: the producer warpgroup only issues TMA loads
  // from one lane and fits the minimum, which leaves each MMA warpgroup the largest multiple of
  // 8 that fits beside it, for O and the S/P tiles.
  static constexpr int kProducerRegs = 24;
  static constexpr int kMmaRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kMmaRegs <= 65536, "register file");

  // ---- named barriers: the MMA warpgroups' turns ----------------------------------------------
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

  // ---- pipeline and shared memory -------------------------------------------------------------
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

  struct Bars {
    u64 q_full;
    u64 k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
  };

  // ---- roles ----------------------------------------------------------------------------------
  using Producer = FwdProducer<AttnFwdSm90>;
  using Mainloop = FwdMainloop<AttnFwdSm90>;
  using Epilogue = FwdEpilogue<AttnFwdSm90>;

  // ---- the kernel entries ---------------------------------------------------------------------
  // The one-CTA-a-tile kernels' query tile. The hardware hands out CTAs x fastest; under a
  // causal mask x counts from the last tile, so each head's longest tiles start first and the
  // grid ends on short tiles instead of a head's longest.
  __device__ static int query_tile() {
    return kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  }

  // Keys past the last one any row of this CTA sees are skipped (causal: bottom-right aligned).
  // A sliding window's: the K/V tiles from first_kv_tile on.
  __device__ static int num_kv_tiles(const FwdParams& p, int m) {
    int key_end = p.seqlen_k;
    if (kCausal) key_end = min(key_end, max(0, (m + 1) * kBlockM + p.seqlen_k - p.seqlen_q));
    if constexpr (kWindow != 0) {
      key_end = min(key_end, max(0, (m + 1) * kBlockM + p.seqlen_k - p.seqlen_q +
                                        window_params(p).window_right));
      return max(0, (key_end + kBlockN - 1) / kBlockN - first_kv_tile(p, m));
    }
    return (key_end + kBlockN - 1) / kBlockN;
  }
  // The first K/V tile any row of query tile m sees: 0 but under a sliding window, whose left
  // bound skips the keys before the tile's first row's window.
  __device__ static int first_kv_tile(const FwdParams& p, int m) {
    if constexpr (kWindow != 0) {
      return max(0, m * kBlockM + p.seqlen_k - p.seqlen_q - window_params(p).window_left) /
             kBlockN;
    }
    return 0;
  }

  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k, const TensorMap* tm_v,
                             const FwdParams& p, char* smem_raw) {
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    const int m = query_tile(), h = blockIdx.y, b = blockIdx.z;
    const int n_tiles = num_kv_tiles(p, m), n0 = first_kv_tile(p, m);
    if (threadIdx.x == 0) init_barriers<false>(bars);
    __syncthreads();

    if (threadIdx.x / 128 == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x == 0) {
        Producer::template produce<false>(tm_q, tm_k, tm_v, p, smem, bars, m, h, b, n_tiles,
                                          0, 0, 0, 0, n0);
      }
      return;
    }
    setmaxnreg_inc<kMmaRegs>();
    if constexpr (kOneTileTurns) start_turns(threadIdx.x / 128 - 1);
    Mainloop::template consume<false, kOneTileTurns>(p, smem, bars, m, h, b, n_tiles, 0, 0,
                                                     threadIdx.x / 128 - 1, threadIdx.x % 128,
                                                     n0);
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
    using Block = typename FwdBlock<kWindow != 0>::type;  // a window's block keeps its bounds
    Block seq = static_cast<const Block&>(p);
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
        // (The first K/V tile passed only under a window: a literal 0 left the packed kernels'
        // address arithmetic as it was.)
        if constexpr (kWindow != 0) {
          Producer::template produce<false>(tm_q, tm_k, tm_v, seq, smem, bars, m, h, 0, n_tiles,
                                            0, 0, q0, k0, first_kv_tile(seq, m));
        } else {
          Producer::template produce<false>(tm_q, tm_k, tm_v, seq, smem, bars, m, h, 0, n_tiles,
                                            0, 0, q0, k0);
        }
      }
      return;
    }
    setmaxnreg_inc<kMmaRegs>();
    if constexpr (kWindow != 0) {
      Mainloop::template consume<false, false>(seq, smem, bars, m, h, 0, n_tiles, 0, 0,
                                               threadIdx.x / 128 - 1, threadIdx.x % 128,
                                               first_kv_tile(seq, m));
    } else {
      Mainloop::template consume<false, false>(seq, smem, bars, m, h, 0, n_tiles, 0, 0,
                                               threadIdx.x / 128 - 1, threadIdx.x % 128);
    }
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
};

}  // namespace dashgen
