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
// K/V in L2. Causal mask (the grid is a whole number of heads' tiles,
// dashgen.runtime.forward.forward_ctas): round i gives each group of num_m CTAs one head, all
// of its tiles at once, and rotates which CTA of the group takes which tile by `stride` a
// round, so that over its rounds every CTA visits long and short tiles alike. The grid is read
// through `grid` (unsigned, like blockIdx and gridDim) where it is used, in the order the
// kernel was measured with.
template <bool kCausal, int kBlockM, class Params, class Grid>
__host__ __device__ inline FwdTile fwd_persistent_tile(const Params& p, const Grid& grid, int i) {
  const int num_m = (p.seqlen_q + kBlockM - 1) / kBlockM;
  if constexpr (kCausal) {
    const int heads = p.heads_q * p.batch, per_round = grid.num_ctas() / num_m;
    const int bh = i * per_round + grid.cta() / num_m;
    if (bh >= heads) return FwdTile{-1, 0, 0};
    const int rounds = (heads + per_round - 1) / per_round;
    const int stride = num_m / rounds > 1 ? num_m / rounds : 1;
    const int pos = (grid.cta() + i * stride) % num_m;
    return FwdTile{num_m - 1 - pos, bh % p.heads_q, bh / p.heads_q};
  }
  const int t = grid.cta() + i * grid.num_ctas();
  if (t >= num_m * p.heads_q * p.batch) return FwdTile{-1, 0, 0};
  const int bh = t / num_m, m = t % num_m;
  return FwdTile{m, bh % p.heads_q, bh / p.heads_q};
}

}  // namespace dashgen
