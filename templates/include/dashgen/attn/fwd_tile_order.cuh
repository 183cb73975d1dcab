// dashgen/attn/fwd_tile_order.cuh: which query tile the persistent forward's CTA takes at each
// step. Plain integer code with no CUDA builtins, so that it also compiles as host C++
// (tests/test_forward_order.py builds it with g++ and checks the order the kernel runs).
#pragma once

namespace dashgen {

struct FwdTile {
  int m, h, b;  // m < 0: past the CTA's last tile
};

// The i-th query tile of the CTA `grid.cta()` of `grid.num_ctas()`, for the batch * heads_q
// heads of ceil(seqlen_q / kBlockM) tiles of `p` (FwdParams in the kernel). Full mask: tile t of
// the batch * heads_q * num_m, m fastest, so that the CTAs running at once share their heads'
// K/V in L2. Causal mask: a head's tiles num_m - 1 - j and j (num_m + 1 KV tiles together,
// whatever j) travel as one unit, the long tile first; under an odd num_m the middle tiles of
// two heads make a unit of the same cost, after all the pairs (the last head's alone when the
// heads are odd too). Unit u of ceil(num_m * heads / 2) goes to CTA u mod grid
// (dashgen.runtime.forward.forward_ctas takes as few CTAs as deal them in as many rounds), so
// every CTA carries as many units as any other or one fewer, and the units dealt at once are
// consecutive: a few heads' K/V in L2. (Grouping each two heads' middle tiles with their pairs
// cost the 24-register producer a spilled register at head_dim 64.)
template <bool kCausal, int kBlockM, class Params, class Grid>
__host__ __device__ inline FwdTile fwd_persistent_tile(const Params& p, const Grid& grid, int i) {
  const int num_m = (p.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (kCausal) {
    const int heads = p.heads_q * p.batch;
    const unsigned u = grid.cta() + static_cast<unsigned>(i >> 1) * grid.num_ctas();
    if (u >= static_cast<unsigned>((num_m * heads + 1) >> 1)) return FwdTile{-1, 0, 0};
    // Units 0 .. heads * pairs - 1: the pairs, a head's consecutive; then the middle tiles.
    const unsigned pairs = static_cast<unsigned>(num_m >> 1);
    int bh, m;
    if (u < pairs * heads) {
      bh = static_cast<int>(u / pairs);
      const int j = static_cast<int>(u - bh * pairs);
      m = (i & 1) ? j : num_m - 1 - j;
    } else {
      bh = 2 * static_cast<int>(u - pairs * heads) + (i & 1);
      if (bh >= heads) return FwdTile{-1, 0, 0};
      m = static_cast<int>(pairs);
    }
    return FwdTile{m, bh % p.heads_q, bh / p.heads_q};
  }
  const int t = grid.cta() + i * grid.num_ctas();
  if (t >= num_m * p.heads_q * p.batch) return FwdTile{-1, 0, 0};
  const int bh = t / num_m, m = t % num_m;
  return FwdTile{m, bh % p.heads_q, bh / p.heads_q};
}

}  // namespace dashgen
