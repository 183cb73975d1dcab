// dashgen/sched/tiling.cuh: one sequence's tiles as the schedule policies see them, and the
// task a policy yields. Plain integer code with no CUDA builtins: it compiles as host C++ too
// (tests/test_policy_header.py builds the policies with g++ and checks them against the Python
// IR, task for task and rank for rank).
#ifndef DASHGEN_SCHED_TILING_CUH
#define DASHGEN_SCHED_TILING_CUH

#include "dashgen/host_device.cuh"

namespace dashgen {
namespace sched {

// Q tiles of kBlockM rows, KV tiles of kBlockN rows, a full or a causal mask aligned
// bottom-right (query row i sees keys up to i + seqlen_k - seqlen_q). Under both masks the Q
// tiles of a KV tile are a suffix first_m(n) .. num_m - 1 and the KV tiles of a Q tile a prefix
// 0 .. count(m) - 1 (first_n and last_m are constants: the policies read them as WindowTiling's).
template <int kBlockM, int kBlockN, bool kCausal>
struct Tiling {
  int seqlen_q, seqlen_k;  // the tile counts are computed where used: fewer live registers

  DASHGEN_HD Tiling(int sq, int sk) : seqlen_q(sq), seqlen_k(sk) {}
  // The tiling of a walk's shape (seqlen_q(), seqlen_k(); WindowTiling also reads its window),
  // or of a pack's sequence b (seqlen_q(b), seqlen_k(b)).
  template <class Shape>
  DASHGEN_HD static Tiling of(const Shape& shape) {
    return Tiling(shape.seqlen_q(), shape.seqlen_k());
  }
  template <class Pack>
  DASHGEN_HD static Tiling of(const Pack& pack, int b) {
    return Tiling(pack.seqlen_q(b), pack.seqlen_k(b));
  }
  DASHGEN_HD int num_m() const { return (seqlen_q + kBlockM - 1) / kBlockM; }
  DASHGEN_HD int num_n() const { return (seqlen_k + kBlockN - 1) / kBlockN; }

  // The first Q tile KV tile n contributes to: the first whose last row sees key n * kBlockN.
  DASHGEN_HD int first_m(int n) const {
    if (!kCausal) return 0;
    const int x = n * kBlockN - (seqlen_k - seqlen_q);
    const int m = x < 0 ? 0 : x / kBlockM;
    return m < num_m() - 1 ? m : num_m() - 1;
  }
  DASHGEN_HD int rows(int n) const { return num_m() - first_m(n); }
  // Contributions to the dQ sum of Q tile m: the KV tiles up to the one holding its last key.
  DASHGEN_HD int count(int m) const {
    if (!kCausal) return num_n();
    const int end = (m + 1) * kBlockM < seqlen_q ? (m + 1) * kBlockM : seqlen_q;
    const int last_key = end - 1 + seqlen_k - seqlen_q;
    if (last_key < 0) return 0;
    return (last_key / kBlockN < num_n() - 1 ? last_key / kBlockN : num_n() - 1) + 1;
  }
  DASHGEN_HD int last_m(int) const { return num_m() - 1; }
  DASHGEN_HD int first_n(int) const { return 0; }
  // The Q tiles with a contribution: first_receiving() .. num_m - 1.
  DASHGEN_HD int first_receiving() const { return first_m(0); }
};

// A sliding window (FlashAttention's window_size), bottom-right aligned: query row i sees keys
// i + off - left .. i + off + right, off = seqlen_k - seqlen_q (an unbounded side holds a
// bound past any sequence: runtime.select.WINDOW_UNBOUNDED). A KV tile's Q tiles are a run
// first_m(n) .. last_m(n) (none: rows(n) = 0, a run of such KV tiles from 0 where keys lie
// left of every row's window), a Q tile's KV tiles a run first_n(m) .. first_n(m) + count(m)
// - 1 (none: a run of Q tiles from 0 whose rows see no key). dashgen.schedule.builders.base's
// Tiling is the same tiles, from the Problem's lists.
template <int kBlockM, int kBlockN>
struct WindowTiling {
  int seqlen_q, seqlen_k, left, right;

  DASHGEN_HD WindowTiling(int sq, int sk, int l, int r)
      : seqlen_q(sq), seqlen_k(sk), left(l), right(r) {}
  template <class Shape>
  DASHGEN_HD static WindowTiling of(const Shape& shape) {
    return WindowTiling(shape.seqlen_q(), shape.seqlen_k(), shape.window_left(),
                        shape.window_right());
  }
  template <class Pack>
  DASHGEN_HD static WindowTiling of(const Pack& pack, int b) {
    return WindowTiling(pack.seqlen_q(b), pack.seqlen_k(b), pack.window_left(),
                        pack.window_right());
  }
  DASHGEN_HD int num_m() const { return (seqlen_q + kBlockM - 1) / kBlockM; }
  DASHGEN_HD int num_n() const { return (seqlen_k + kBlockN - 1) / kBlockN; }

  // The query rows that see a key of KV tile n: lo_row(n) .. hi_row(n) (none if lo > hi).
  DASHGEN_HD int lo_row(int n) const {
    const int row = n * kBlockN - (seqlen_k - seqlen_q) - right;
    return row < 0 ? 0 : row;
  }
  DASHGEN_HD int hi_row(int n) const {
    const int last_key = (n + 1) * kBlockN < seqlen_k ? (n + 1) * kBlockN - 1 : seqlen_k - 1;
    const int row = last_key - (seqlen_k - seqlen_q) + left;
    return row < seqlen_q - 1 ? row : seqlen_q - 1;
  }
  DASHGEN_HD int first_m(int n) const {
    return lo_row(n) <= hi_row(n) ? lo_row(n) / kBlockM : 0;
  }
  DASHGEN_HD int last_m(int n) const {
    return lo_row(n) <= hi_row(n) ? hi_row(n) / kBlockM : -1;
  }
  DASHGEN_HD int rows(int n) const { return last_m(n) - first_m(n) + 1; }

  // The keys any row of Q tile m sees: lo_key(m) .. hi_key(m) (none if lo > hi).
  DASHGEN_HD int lo_key(int m) const {
    const int key = m * kBlockM + (seqlen_k - seqlen_q) - left;
    return key < 0 ? 0 : key;
  }
  DASHGEN_HD int hi_key(int m) const {
    const int last_row = (m + 1) * kBlockM < seqlen_q ? (m + 1) * kBlockM - 1 : seqlen_q - 1;
    const int key = last_row + (seqlen_k - seqlen_q) + right;
    return key < seqlen_k - 1 ? key : seqlen_k - 1;
  }
  DASHGEN_HD int first_n(int m) const {
    return lo_key(m) <= hi_key(m) ? lo_key(m) / kBlockN : 0;
  }
  DASHGEN_HD int count(int m) const {
    return lo_key(m) <= hi_key(m) ? hi_key(m) / kBlockN - lo_key(m) / kBlockN + 1 : 0;
  }
  // The first Q tile with a contribution: row i sees a key unless i + off + right < 0 (no row
  // sees none past the last key: the last row sees seqlen_k - 1), so the first row that does is
  // max(0, -off - right); num_m if there is none.
  DASHGEN_HD int first_receiving() const {
    const int row = (seqlen_q - seqlen_k) - right;
    return row <= 0 ? 0 : row < seqlen_q ? row / kBlockM : num_m();
  }
};

// The tiling of a kernel's mask: WindowTiling under a sliding window, else Tiling.
template <int kBlockM, int kBlockN, bool kCausal, bool kWindow>
struct TilingOf {
  using type = Tiling<kBlockM, kBlockN, kCausal>;
};
template <int kBlockM, int kBlockN, bool kCausal>
struct TilingOf<kBlockM, kBlockN, kCausal, true> {
  using type = WindowTiling<kBlockM, kBlockN>;
};

// A task as a worker's walk yields it: the tile (query head h), its dQ and dK/dV ranks (-1
// without GQA) and its segment boundaries.
struct Task {
  int b, h, n, m, dq_rank, dkv_rank;
  bool seg_start, seg_end;
};

// Step i of a unit: its tile, its place in the dQ tile's sum, and whether it starts or ends a
// segment (the K/V load and the dK/dV store).
struct Step {
  int n, m, dq_rank;
  bool seg_start, seg_end;
};

// What a pack's deal (pack.cuh) asks a policy: whether all its sequences' units run at once
// (kHeadsTogether), whether some may (kMayRunTogether), and whether this one does (together).
// A policy is one kind or the other; Hybrid (hybrid.cuh) decides per sequence.
struct RunsIndependently {
  static constexpr bool kHeadsTogether = false, kMayRunTogether = false;
  template <class Tl>
  DASHGEN_HD static bool together(const Tl&) { return false; }
};
struct RunsTogether {
  static constexpr bool kHeadsTogether = true, kMayRunTogether = true;
  template <class Tl>
  DASHGEN_HD static bool together(const Tl&) { return true; }
};

// The arrival rank under a cyclic shift: `units` start together, unit a visiting row
// (a + t) mod rows at step t, the adds into a row ranked by (step, unit). Unit `slot` at step
// `step`: the adds at earlier steps (units with residues slot + 1 .. slot + step mod rows,
// `per_row` each plus one below `extra`), then the lower units at the same step.
DASHGEN_HD int shift_rank(int units, int rows, int slot, int step) {
  const int per_row = units / rows, extra = units % rows;
  const int lo = (slot + 1) % rows;
  const int lo_c = lo < extra ? lo : extra;
  int below;
  if (lo + step <= rows) {
    const int hi_c = lo + step < extra ? lo + step : extra;
    below = hi_c - lo_c;
  } else {
    const int wrap = lo + step - rows;
    below = (extra - lo_c) + (wrap < extra ? wrap : extra);
  }
  return per_row * step + below + slot / rows;
}

// The fused dQ converter's deal: the Q tiles that receive a contribution (first_m(0) on; under
// a causal mask with more query rows than keys the first ones receive none: the convert kernel
// writes their zeros) of `seqs` sequences, numbered sequence-major, dealt round-robin: worker w
// converts numbers w, w + workers, ... (the order the sequences launch in).
template <class Tl>
struct ConvertDeal {
  DASHGEN_HD static int per_seq(const Tl& t) { return t.num_m() - t.first_receiving(); }
  // How many tiles `worker` converts.
  DASHGEN_HD static int share(const Tl& t, int seqs, int worker, int workers) {
    const int tiles = seqs * per_seq(t);
    return worker < tiles ? (tiles - 1 - worker) / workers + 1 : 0;
  }
  // Its k-th: the sequence (batch * heads_q + head) and the Q tile.
  DASHGEN_HD static int seq_of(const Tl& t, int worker, int workers, int k) {
    return (worker + k * workers) / per_seq(t);
  }
  DASHGEN_HD static int m_of(const Tl& t, int worker, int workers, int k) {
    return t.first_receiving() + (worker + k * workers) % per_seq(t);
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_TILING_CUH
