// dashgen/attn/params.cuh: kernel parameter blocks, passed by value. The host mirrors each one
// field for field (dashgen/codegen/variants.py; tests/test_params_layout.py compiles this header
// on the host and checks every field's offset and size against the mirror).
#pragma once
#include "dashgen/sched/walk.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

// Tensors are (batch, seqlen, heads, head_dim) with head_dim contiguous; strides in elements.
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // (batch, heads_q, seqlen_q)
  i32 batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  i32 q_row_stride, k_row_stride, o_row_stride;  // elements between consecutive sequence rows
  float softmax_scale;
  // A pack (varlen kernels; else null): sequence b's rows are [cu_seqlens[b], cu_seqlens[b + 1])
  // of (total, heads, head_dim) tensors, and its lse rows a (heads_q, seqlen) block from
  // heads_q * cu_seqlens_q[b] (PackedRows).
  const i32* cu_seqlens_q;
  const i32* cu_seqlens_k;
  // A pack: where a fault in its offsets is recorded (attn/pack_check.cuh), and the packed
  // tokens of q and of k/v, which the offsets must end at.
  u32* pack_fault;
  i32 total_q, total_k;
  // A soft-capped variant's cap and softmax_scale / softcap (attn/softcap.cuh), else unread.
  float softcap, tanh_scale;
};

// A sliding-window forward's block: FwdParams and the window's bounds (attn/mask.cuh), a block
// of its own so that every other forward's stays as it was (a packed forward copies its block,
// and a longer FwdParams changed that copy's code). window_params reads them.
struct FwdWindowParams : FwdParams {
  i32 window_left, window_right;
};
__device__ __forceinline__ const FwdWindowParams& window_params(const FwdParams& p) {
  return static_cast<const FwdWindowParams&>(p);
}
// A forward's block type: FwdWindowParams where kWindow, else FwdParams (a packed forward's
// per-sequence copy keeps the window).
template <bool kWindow>
struct FwdBlock {
  using type = FwdParams;
};
template <>
struct FwdBlock<true> {
  using type = FwdWindowParams;
};

// The watchdog's record of a rank wait that never ended: per worker and role (1 dQ writer,
// 3 dQ converter; 2 is the GQA dK/dV add's, which waits unbounded and never writes it)
// kStallWords words in host memory, word 0 kStallMagic once filled; then the schedule's kernel
// id, the role, the tile's counter index, the rank waited for, the count the counter showed, the
// worker.
// dashgen/runtime/watchdog.py reads it.
constexpr u32 kStallMagic = 0x57a11ed;
constexpr int kStallWords = 16;

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;      // (batch, heads_q, seqlen_q), from the forward
  const float* dpsum;    // (batch, heads_q, seqlen_q): rowsum(dO * O) * softmax_scale
  float* dq_accum;       // (batch, heads_q, num_m_blocks * block_m, head_dim), zeroed
  void* dk;              // (batch, seqlen_k, heads_kv, head_dim) when not GQA
  void* dv;
  float* dk_accum;       // (batch, heads_kv, num_n_blocks * block_n, head_dim) under GQA, zeroed
  float* dv_accum;
  u32* dq_counters;      // (batch, heads_q, num_m_blocks), zeroed
  u32* dkv_counters;     // (batch, heads_kv, num_n_blocks), zeroed, GQA only
  // A schedule file's table (named schedules: null), worker w's tasks at
  // tasks[worker_offsets[w] .. worker_offsets[w + 1]); the offsets also place each worker's
  // rows of the trace.
  const sched::TableEntry* tasks;
  const i32* worker_offsets;
  i32* trace;            // (total tasks, kTraceColumns) when tracing, else null
  u32* stall;            // the watchdog's record (workers * 4 * kStallWords), or null
  i32 batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  i32 q_row_stride, k_row_stride;  // q/dout/dq share one layout, k/v/dk/dv another
  i32 num_m_blocks, num_n_blocks;
  float softmax_scale;
  u32 watchdog_ms;       // a rank wait longer than this aborts the launch (report_stall)
  // (batch, heads_q, num_m_blocks, 2, block_m) when the statistics are staged: per query tile,
  // block_m lse rows as log2 (+inf where P = 0) then block_m D rows (0 past the end); else null.
  const float* stats;
  // With the fused convert (deterministic only), else null: the 16-bit dQ output, laid out like
  // q. Which worker converts which tile, and when a tile's sum is final, are formulas.
  void* dq;
  // A pack (varlen kernels; else null): every buffer holds sequence b as a batch of one
  // (PackedRows). pack_plan: the deal's orders (AttnPackPlan), max_units its unit slots.
  const i32* cu_seqlens_q;
  const i32* cu_seqlens_k;
  i32* pack_plan;
  i32 max_units;
  // A pack: as FwdParams (attn/pack_check.cuh; the plan kernel checks every sequence).
  u32* pack_fault;
  i32 total_q, total_k;
  // A listed deal (sched::DealtWalk; else null): the workers + 1 offsets, then the units.
  const i32* unit_deal;
  // A soft-capped variant's cap and softmax_scale / softcap (attn/softcap.cuh), else unread.
  float softcap, tanh_scale;
  // A sliding-window variant's bounds (attn/mask.cuh, sched::WindowTiling), else unread.
  i32 window_left, window_right;
};

// Where a pack keeps sequence b: in every buffer a batch of one, so the fixed-length code runs
// on it unchanged. Its rows [cu_seqlens[b], cu_seqlens[b + 1]) of the (total, heads, head_dim)
// tensors; its per-row values (lse, D) a (heads, seqlen) block from heads * cu_seqlens[b]; its
// per-tile buffers (fp32 sums, statistics, counters) a (heads, tiles) block from
// heads * tile0(b), tile0(b) = (cu_seqlens[b] + b * block) / block, which moves on by at least
// floor(seqlen / block) + 1 (the sequence's tiles or more) per sequence: total / block + batch
// tiles per head in all.
struct PackedRows {
  i32 row0, seqlen, tile0;
  __device__ __forceinline__ PackedRows(const i32* cu_seqlens, int b, int block)
      : row0(cu_seqlens[b]), seqlen(cu_seqlens[b + 1] - cu_seqlens[b]),
        tile0((cu_seqlens[b] + b * block) / block) {}
  __device__ __forceinline__ int tiles(int block) const { return (seqlen + block - 1) / block; }
};

// A pack's CTA `cta` (blockIdx.x) walks a head's packed tiles of `block` rows (total / block + batch,
// PackedRows), rows_per_block rows a CTA, so the grid follows the packed tokens, not batch times
// the longest sequence. tile_seq (the plan kernel's tile map) names each tile's sequence, -1
// in the gaps between sequences; row_block is the CTA's block of rows within its sequence.
struct PackedTile {
  int b, row_block;
  __device__ __forceinline__ PackedTile(const i32* tile_seq, const i32* cu_seqlens, int block,
                                        int rows_per_block, int cta) {
    const int per_tile = block / rows_per_block;
    const int t = cta / per_tile;
    b = tile_seq[t];
    row_block = b < 0 ? 0
                      : (t - PackedRows(cu_seqlens, b, block).tile0) * per_tile + cta % per_tile;
  }
};

// The pack plan's words (BwdParams::pack_plan): the sequences dealt, the units dealt, then the
// sequences in deal order (batch words), then the units' sequences and indices in deal order
// (max_units words each), then AttnPackPlan's scratch (4 * max_units + 2 * batch + 1 words),
// then the tile maps: the sequence of each of a head's packed query tiles (block_m rows, total_q /
// block_m + batch of them, PackedRows), then of its key tiles (block_n, total_k / block_n +
// batch), -1 in the gaps PackedRows leaves between sequences. The preprocess and convert kernels
// of a pack walk its tiles through them (PrepParams / ConvertParams::tile_seq).
constexpr int kPlanHeader = 2;

// Preprocess: D = rowsum(dO * O), zero the fp32 dQ accumulator and the workspace (the ordering
// counters; the fp32 dK/dV accumulators under GQA). Postprocess: fp32 -> 16 bit.
struct PrepParams {
  const void* o;
  const void* dout;
  float* dpsum;
  float* dq_accum;
  uint4* zero;     // 16-byte aligned workspace, zeroed by the whole grid
  i64 zero_vec4s;  // its length in 16-byte vectors
  i32 batch, heads, seqlen, row_stride, padded_rows;
  i32 zero_dq;     // 0 when the backward's first dQ writer of each tile stores instead of adding
  const float* lse;  // (batch, heads, seqlen), with `stats`
  float* stats;      // BwdParams::stats to fill, or null
  // A pack (varlen kernels; else null): PackedRows of the backward's query tiles, and the
  // sequence of each packed tile (the plan's query tile map), which blockIdx.x walks.
  const i32* cu_seqlens;
  const i32* tile_seq;
  // D is stored times this (the softmax scale), so the backward forms dS^T as one FFMA and one
  // FMUL an element: P^T (dP^T * scale - D * scale).
  float d_scale;
};

struct ConvertParams {
  const float* src;  // (batch, heads, padded_rows, head_dim)
  void* dst;         // (batch, seqlen, heads, head_dim), rows < seqlen only
  // With it, a tile whose counter (batch, heads, padded_rows / block_m) is 0 had no
  // contribution and was never written: its rows convert to zeros (src may hold garbage).
  const u32* counters;
  i32 batch, heads, seqlen, row_stride, padded_rows;
  i32 swizzled;      // src rows in the accum_col layout (the Hopper backward's dQ sums)
  i32 block_m;       // rows per counter, with `counters`; a pack's tiles (PackedRows)
  // A pack (varlen kernels; else null): PackedRows of tiles of block_m rows, and the sequence
  // of each packed tile (a plan tile map), which blockIdx.x walks.
  const i32* cu_seqlens;
  const i32* tile_seq;
};

}  // namespace dashgen
