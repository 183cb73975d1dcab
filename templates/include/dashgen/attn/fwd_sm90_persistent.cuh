// dashgen/attn/fwd_sm90_persistent.cuh: the Hopper forward on persistent CTAs (full masks).
// The one-CTA-a-tile kernel's warp roles and pipeline (fwd_sm90.cuh), on a grid of fewer CTAs,
// each walking query tiles blockIdx.x, + gridDim.x, ... The producer loads the next tile's Q
// as soon as both MMA warpgroups have issued their last S, and streams its K/V on through the
// same stages, so the loads overlap the previous tile's last P V and its O/lse stores instead of
// starting cold in a new CTA. It shares fwd_sm90.cuh's code but not its barrier layout (Q's
// empty barrier is its own): with one layout for both, the one-tile kernel measured 5-14%
// slower on the H200 under causal masks, though its PTX differed only in barrier offsets and
// where the KV tile count is computed (docs/design.md, `fwd-persistent-layout`). So the
// one-tile kernel's PTX stays what it was.
#pragma once
#include "dashgen/attn/fwd_sm90.cuh"
#include "dashgen/attn/fwd_tile_order.cuh"

namespace dashgen {

template <class Cfg>
struct AttnFwdSm90Persistent : AttnFwdSm90<Cfg> {
  using Base = AttnFwdSm90<Cfg>;
  using Base::kBlockM;
  using Base::kCausal;
  using Base::kMmaRegs;
  using Base::kOffBar;
  using Base::kProducerRegs;
  using Base::kStages;
  using Base::num_kv_tiles;

  static constexpr int kNumBars = 2 + 4 * kStages;
  static constexpr int kSmemBytes = kOffBar + kNumBars * 8 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= kSm90MaxSmemBytes, "shared memory exceeds what an sm_90 block may use");

  struct Bars {
    u64 q_full, q_empty;
    u64 k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
  };

  struct Tile {
    int m, h, b;
  };

  // The CTA's place in the grid, read where fwd_persistent_tile uses it; unsigned like the
  // builtins, so its divisions are the unsigned ones the kernel was measured with.
  struct Grid {
    __device__ unsigned cta() const { return blockIdx.x; }
    __device__ unsigned num_ctas() const { return gridDim.x; }
  };

  // The CTA's i-th query tile, or m < 0 past its last (fwd_tile_order.cuh).
  __device__ static Tile tile_at(const FwdParams& p, int i) {
    const FwdTile t = fwd_persistent_tile<kCausal, kBlockM>(p, Grid{}, i);
    return Tile{t.m, t.h, t.b};
  }

  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k, const TensorMap* tm_v,
                             const FwdParams& p, char* smem_raw) {
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    if (threadIdx.x == 0) Base::template init_barriers<true>(bars);
    __syncthreads();

    if (threadIdx.x / 128 == 0) {
      setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x == 0) {
        // K/V tiles loaded so far: their stages and phases run on from one query tile to the
        // next.
        int kv = 0;
        for (int i = 0;; ++i) {
          const Tile t = tile_at(p, i);
          if (t.m < 0) break;
          Base::Producer::template produce<true>(tm_q, tm_k, tm_v, p, smem, bars, t.m, t.h, t.b,
                                                 num_kv_tiles(p, t.m), i, kv);
          kv += num_kv_tiles(p, t.m);
        }
      }
      return;
    }
    setmaxnreg_inc<kMmaRegs>();
    const int wg = threadIdx.x / 128 - 1, tid = threadIdx.x % 128;
    Base::start_turns(wg);
    int kv = 0;
    for (int i = 0;; ++i) {
      const Tile t = tile_at(p, i);
      if (t.m < 0) break;
      const int n_tiles = num_kv_tiles(p, t.m);
      Base::Mainloop::template consume<true, true>(p, smem, bars, t.m, t.h, t.b, n_tiles, kv, i,
                                                   wg, tid);
      kv += n_tiles;
    }
  }
};

}  // namespace dashgen
