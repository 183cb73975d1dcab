// dashgen/attn/bwd_mainloop.cuh: the backward's MMA mainloop, both MMA warpgroups
// (AttnBwdSm90, K), each owning 64 of a task's 128 KV rows. Per task, from the stage the producer
// filled: S^T = K Q^T and dP^T = V dO^T (wgmma), P^T and dS^T recomputed from the softmax
// statistics, dS through shared memory, dV += P^T dO and dK += dS^T Q from registers, this
// warpgroup's half of dQ = dS K handed to the dQ writer; at a segment's end the epilogue
// (K::Epilogue) takes the segment's dK/dV. K supplies the kernel's constants, its shared layout
// and barriers.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softcap.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
#include "dashgen/ptx/barrier.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/stmatrix.cuh"
#include "dashgen/ptx/wgmma.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

enum class DqSplit { kColumns, kRows };

template <class K>
struct BwdMainloop {
  using T = typename K::T;
  using Task = sched::Task;
  using Bars = typename K::Bars;
  using MmaThread = typename K::MmaThread;
  using Epilogue = typename K::Epilogue;
  static constexpr WgmmaInput kIn = K::kIn;
  static constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  static constexpr bool kCausal = K::kCausal, kGqa = K::kGqa, kVarlen = K::kVarlen;
  static constexpr bool kEarlyKv = K::kEarlyKv, kDqLast = K::kDqLast;
  static constexpr bool kDsInLoop = K::kDsInLoop;
  // S^T's and dP^T's k16 steps: the tensors' columns only (attn/head_dim.cuh); past them Q, K,
  // V and dO hold zeros, whose steps would add exactly 0.
  enum : int { kScoreSteps = tensor_head_dim<typename K::Config, K::kHeadDim>(0) / 16 };
  // Soft-capped (attn/softcap.cuh): S^T holds t = tanh(score * scale / softcap) from stage 3 on.
  enum : int { kSoftcap = has_softcap<typename K::Config>(0) };
  // A sliding window (attn/mask.cuh): both its bounds per element on edge tasks.
  enum : int { kWindow = K::kWindow };
  static constexpr int kStages = K::kStages, kDsStages = K::kDsStages;
  static constexpr int kMmaThreads = K::kMmaThreads;
  static constexpr int kQBytes = K::kQBytes, kDsBytes = K::kDsBytes, kDqBytes = K::kDqBytes;
  static constexpr int kOffK = K::kOffK, kOffV = K::kOffV, kOffQ = K::kOffQ, kOffDo = K::kOffDo;
  static constexpr int kOffDs = K::kOffDs, kOffDq = K::kOffDq, kOffStats = K::kOffStats;
  static constexpr int kOffTask = K::kOffTask;
  // How the MMA warpgroups share dQ = dS K: by its 64-column halves at head_dim 128, by query
  // rows at head_dim 64 (128 of them a task).
  static constexpr DqSplit kDqSplit = kHeadDim == 128 ? DqSplit::kColumns : DqSplit::kRows;

  // One copy into registers: volatile, so the compiler cannot re-read the slot after the
  // producer has reused it for a later task.
  __device__ static Task load_task_slot(const Task* slot) {
    const volatile Task* v = slot;
    Task t;
    t.b = v->b; t.h = v->h; t.n = v->n; t.m = v->m; t.dq_rank = v->dq_rank;
    t.dkv_rank = v->dkv_rank;
    t.seg_start = v->seg_start; t.seg_end = v->seg_end;
    return t;
  }

  // Whether the task in stage s's slot ends its segment, read again where it is needed (held in
  // a register through the task, it made ptxas spill at head_dim 64, causal). The slot is
  // rewritten only after this thread's arrive on q_empty[s].
  __device__ static bool seg_end_of(const char* smem, int s) {
    return reinterpret_cast<const volatile Task*>(smem + kOffTask)[s].seg_end;
  }

  // A task's stages, in order: 1 issue_scores, 2 task_stats, 3 recompute (P^T and dS^T), 4
  // store_ds (dS to shared memory), 5 and 6 dV, dQ, dK (rs_gemm, dq_mma) and 7 hand_off_dq in
  // one of two orders (dq_then_dk, release_then_hand_off); at a segment's end end_segment hands dK/dV to the
  // epilogue. consume() holds what outlives a task (the segment's dK/dV accumulators) and the
  // stage and segment bookkeeping.
  //
  // consume() also declares every local array of a task's stages (st/dpt, pa/dsa, pv/ds, dq),
  // each in the order the stages first use it, and passes it on by reference. Where an array is
  // declared decides its place in the inlined kernel's frame, and that order decides how NVVM
  // numbers the values it promotes to registers. Declared inside the stage functions (which
  // inline ahead of the caller's locals), the same code compiled to another kernel than the one
  // measured: pv/ds in masked_softmax moved the dK/dV accumulators to other registers (head_dim
  // 64, causal), dq in dq_then_dk spilled 8 bytes (head_dim 128).
  __device__ static void consume(const BwdParams& p, char* smem, Bars* bars, int begin, int end,
                                 int wg, int tid) {
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const MmaThread me{wg, tid, warp, lane, g, t4};
    const int group = p.heads_q / p.heads_kv;
    const float scale_log2 = kSoftcap != 0 ? p.softcap * kLog2e : p.softmax_scale * kLog2e;
    const int causal_offset = p.seqlen_k - p.seqlen_q;
    int seq_k = 0, seq_offset = 0;  // a pack: the task's sequence's keys and causal offset
    float dk[kHeadDim / 2], dv[kHeadDim / 2];  // m64n128 accumulators: this warpgroup's 64 KV rows
    int segment = 0;

    for (int i = begin; i < end; ++i) {
      const int s = (i - begin) % kStages, use = (i - begin) / kStages;
      mbarrier_wait_parity(&bars->q_full[s], use & 1);
      const Task t = load_task_slot(reinterpret_cast<const Task*>(smem + kOffTask) + s);
      if constexpr (kVarlen) {
        seq_k = p.cu_seqlens_k[t.b + 1] - p.cu_seqlens_k[t.b];
        seq_offset = seq_k - (p.cu_seqlens_q[t.b + 1] - p.cu_seqlens_q[t.b]);
      }
      if (t.seg_start) {
        mbarrier_wait_parity(&bars->kv_full, segment & 1);
#pragma unroll
        for (int j = 0; j < kHeadDim / 2; ++j) dk[j] = dv[j] = 0.f;
      }
      const char* q_tile = smem + kOffQ + s * kQBytes;
      const char* do_tile = smem + kOffDo + s * kQBytes;

      float st[kBlockM / 2], dpt[kBlockM / 2];
      issue_scores(st, dpt, smem, q_tile, do_tile, wg);
      const float* stats = task_stats(p, t, smem, s, me);

      u32 pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
      float pv[2], ds[2];  // masked_softmax's pair of P^T and dS^T values (see above)
      recompute(st, dpt, stats, pa, dsa, pv, ds, smem, p, t, s, seq_k, seq_offset, causal_offset,
                scale_log2, me);

      // Stage 5a: dV += P^T dO needs nothing of the other warpgroup, so its wgmmas run through
      // stage 4's barrier.
      wgmma_fence();
      rs_gemm(dv, pa, do_tile);
      const char* ds_tile = store_ds(dsa, smem, s, me);

      float dq[32];
      if constexpr (kDqLast) {
        release_then_hand_off(dk, dq, dsa, smem, q_tile, ds_tile, bars, s, use, me);
      } else {
        dq_then_dk(dk, dq, dsa, smem, q_tile, ds_tile, bars, s, use, me);
      }
      if (t.seg_end) {
        end_segment(p, t, dk, dv, group, bars, me);
        ++segment;
      }
    }
  }

  // Stage 1. S^T = K Q^T and dP^T = V dO^T (this warpgroup's 64 KV rows x kBlockM query rows),
  // K-major operands, in one commit group that stage 3 waits for.
  __device__ static __forceinline__ void issue_scores(float (&st)[kBlockM / 2],
                                                      float (&dpt)[kBlockM / 2], const char* smem,
                                                      const char* q_tile, const char* do_tile,
                                                      int wg) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kScoreSteps; ++k) {
      wgmma_ss<kIn, kBlockM>(st, tile_desc_k_major(smem + kOffK, kBlockN, 64 * wg, k),
                             tile_desc_k_major(q_tile, kBlockM, 0, k), k > 0);
    }
#pragma unroll
    for (int k = 0; k < kScoreSteps; ++k) {
      wgmma_ss<kIn, kBlockM>(dpt, tile_desc_k_major(smem + kOffV, kBlockN, 64 * wg, k),
                             tile_desc_k_major(do_tile, kBlockM, 0, k), k > 0);
    }
    wgmma_commit_group();
  }

  // Stage 2. The task's per-column (query row) softmax statistics, lse (as log2) then D, in
  // shared memory (in registers they would cost 32 per thread and spill): the producer's copy
  // that landed with stage s's Q and dO (docs/design.md, `staged-stats`).
  // The task and thread arguments are unused; the call keeps them because without them ptxas
  // schedules the main kernel differently from the one measured (parameters too hold places in
  // the inlined frame: see consume()).
  __device__ static __forceinline__ const float* task_stats(const BwdParams&, const Task&,
                                                            char* smem, int s, const MmaThread&) {
    float* stats = reinterpret_cast<float*>(smem + kOffStats) + s * 2 * kBlockM;
    return stats;
  }

  // Stage 3. P^T and dS^T in registers, packed to 16-bit A fragments for the RS wgmmas, once
  // the score MMAs have landed. kDsInLoop: each 16 query rows of dS go to shared memory as the
  // loop finishes them.
  // P^T = exp2(S^T * scale - lse), 0 for keys past the end and, under the causal mask, keys after
  // the query row; dS^T = P^T (dP^T * softmax_scale - D * softmax_scale), the D the preprocess
  // stored already scaled: one FFMA where a subtraction and a product were. Under a causal mask
  // only a task whose keys (this warpgroup's 64) cross the sequence's end or the diagonal runs
  // the mask: the others (all but one of a KV tile's tasks with square tiles) skip a compare and
  // its index arithmetic per element. A full mask compares per key, on edge tasks only, before
  // the one loop.
  __device__ static __forceinline__ void recompute(
      float (&st)[kBlockM / 2], const float (&dpt)[kBlockM / 2], const float* stats,
      u32 (&pa)[kBlockM / 16][4], u32 (&dsa)[kBlockM / 16][4], float (&pv)[2], float (&ds)[2],
      char* smem, const BwdParams& p, const Task& t, int s, int seq_k, int seq_offset,
      int causal_offset, float scale_log2, const MmaThread& me) {
    wgmma_wait_group<0>();
    u32 ds_row = 0;  // kDsInLoop: this lane's stmatrix row address in this warpgroup's block
    if constexpr (kDsInLoop) {
      // One dS tile: both warpgroups finished the previous task's dQ MMA (its reads of dS)
      // before this one. Two: see kDsStages.
      int ds_off = 0;
      if constexpr (kDsStages == 1) {
        K::sync_mma_warpgroups();
      } else {
        ds_off = s * kDsBytes;
        asm volatile("mov.b32 %0, %0;" : "+r"(ds_off));  // formed here, not held from the top
      }
      ds_row = ds_row_address(smem + kOffDs + ds_off + me.wg * kBlockM * 128, me.warp, me.lane);
    }
    const bool edge =
        kWindow != 0
            ? window_reaches(t.n * kBlockN + 64 * me.wg, t.n * kBlockN + 64 * me.wg + 63,
                             t.m * kBlockM, t.m * kBlockM + kBlockM - 1,
                             kVarlen ? seq_k : p.seqlen_k, kVarlen ? seq_offset : causal_offset,
                             p.window_left, p.window_right)
            : mask_reaches<kCausal>(t.n * kBlockN + 64 * me.wg + 63, t.m * kBlockM,
                                    kVarlen ? seq_k : p.seqlen_k,
                                    kVarlen ? seq_offset : causal_offset);
    // Soft-capped, an edge task takes the per-element mask under a full mask too: a -inf score
    // would make dS's factor 1 - t^2 infinite, and 0 * inf is NaN.
    if constexpr (!kCausal && kWindow == 0 && kSoftcap == 0) {
      // Full mask: only keys past the sequence's end are masked, and only a task whose keys
      // reach it has any. Their scores become -inf there, so the one loop below takes
      // exp2(-inf) = +0 for them, the value the per-element select gave, without a select per
      // element on every other task (a second copy of the loop made head_dim 64 spill).
      if (edge) {
        const int keys_end = kVarlen ? seq_k : p.seqlen_k;
#pragma unroll
        for (int ii = 0; ii < kBlockM / 2; ++ii) {
          const int key = t.n * kBlockN + 64 * me.wg + 16 * me.warp + me.g + 8 * ((ii / 2) % 2);
          if (key >= keys_end) st[ii] = -DASHGEN_INF;
        }
      }
      unmasked_softmax<true>(st, dpt, stats, pa, dsa, ds_row, scale_log2, p.softmax_scale, me);
    } else if (!edge) {
      unmasked_softmax<false>(st, dpt, stats, pa, dsa, ds_row, scale_log2, p.softmax_scale, me,
                              p.tanh_scale);
    } else {
      masked_softmax(st, dpt, stats, pa, dsa, pv, ds, ds_row, scale_log2, p, t, seq_k,
                     seq_offset, causal_offset, me);
    }
  }

  // Stage 3's loop for a task no mask reaches (causal: its keys end before the diagonal and
  // the sequence's end), or under the full mask for every task once an edge task's keys past the
  // end hold -inf scores: P^T and dS^T of every element. kFtzAsm: the exponential as the asm
  // ex2.approx.ftz (the full mask's, `bwd-mask-select`), else exp2f.
  template <bool kFtzAsm>
  __device__ static __forceinline__ void unmasked_softmax(
      const float (&st)[kBlockM / 2], const float (&dpt)[kBlockM / 2], const float* stats,
      u32 (&pa)[kBlockM / 16][4], u32 (&dsa)[kBlockM / 16][4], u32 ds_row, float scale_log2,
      float softmax_scale, const MmaThread& me, float to_tanh = 0.f) {
#pragma unroll
    for (int i2 = 0; i2 < kBlockM / 2; i2 += 2) {
      float pv[2], ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ii = i2 + e;
        const int col = 8 * (ii / 4) + 2 * me.t4 + (ii % 2);
        // Soft-capped: t = tanh(score * scale / softcap) in the score's place (attn/softcap.cuh).
        const float score = kSoftcap != 0 ? tanh_approx(st[ii] * to_tanh) : st[ii];
        const float exponent = score * scale_log2 - stats[col];
        pv[e] = kFtzAsm ? exp2_ftz(exponent) : exp2f(exponent);
        ds[e] = pv[e] * fmaf(dpt[ii], softmax_scale, -stats[kBlockM + col]);
        if constexpr (kSoftcap != 0) ds[e] *= fmaf(-score, score, 1.f);  // d softcap*t / d score
      }
      pa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(pv[0], pv[1]);
      dsa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(ds[0], ds[1]);
      if constexpr (kDsInLoop) {
        if (i2 % 8 == 6) stmatrix_x4_trans(ds_row + 2048 * (i2 / 8), dsa[i2 / 8]);
      }
    }
  }

  // Stage 3's loop for a causal edge task (the diagonal, the sequence's end): the mask per
  // element. Written out in the loop: with the mask and the exponent in functions of their own,
  // NVVM orders its index arithmetic differently.
  __device__ static __forceinline__ void masked_softmax(
      const float (&st)[kBlockM / 2], const float (&dpt)[kBlockM / 2], const float* stats,
      u32 (&pa)[kBlockM / 16][4], u32 (&dsa)[kBlockM / 16][4], float (&pv)[2], float (&ds)[2],
      u32 ds_row, float scale_log2, const BwdParams& p, const Task& t, int seq_k, int seq_offset,
      int causal_offset, const MmaThread& me) {
#pragma unroll
    for (int i2 = 0; i2 < kBlockM / 2; i2 += 2) {
      const int row = 16 * me.warp + me.g + 8 * ((i2 / 2) % 2);
      const int key = t.n * kBlockN + 64 * me.wg + row;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ii = i2 + e;
        const int col = 8 * (ii / 4) + 2 * me.t4 + (ii % 2);
        const int qrow = t.m * kBlockM + col;
        const bool masked =
            kWindow != 0 ? window_masked(key, qrow, kVarlen ? seq_k : p.seqlen_k,
                                         kVarlen ? seq_offset : causal_offset, p.window_left,
                                         p.window_right)
            : kVarlen    ? key >= seq_k || (kCausal && key > qrow + seq_offset)
                         : key >= p.seqlen_k || (kCausal && key > qrow + causal_offset);
        // The exponent is formed before the select, as measured; selecting the exponent
        // instead (exp2(-inf) = +0) spilled 8 bytes in a causal GQA variant.
        const float score = kSoftcap != 0 ? tanh_approx(st[ii] * p.tanh_scale) : st[ii];
        const float exponent = score * scale_log2 - stats[col];
        pv[e] = masked ? 0.f : exp2f(exponent);
        ds[e] = pv[e] * fmaf(dpt[ii], p.softmax_scale, -stats[kBlockM + col]);
        if constexpr (kSoftcap != 0) ds[e] *= fmaf(-score, score, 1.f);  // d softcap*t / d score
      }
      pa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(pv[0], pv[1]);
      dsa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(ds[0], ds[1]);
      if constexpr (kDsInLoop) {
        if (i2 % 8 == 6) stmatrix_x4_trans(ds_row + 2048 * (i2 / 8), dsa[i2 / 8]);
      }
    }
  }

  // dsa[kk] holds four 8x8 blocks of dS^T in the fragment layout (KV rows
  // 16 * warp + 0..7 and + 8..15, by query rows 16 kk + 0..7 and + 8..15), and one transposing
  // stmatrix writes them as dS rows. Lane l gives the address of query row 8 (l / 16) + l % 8
  // (16 kk further is 2048 bytes on), KV rows from 16 * warp + 8 ((l / 8) % 2), in the
  // 128B-swizzled block of this warpgroup's 64 KV columns.
  __device__ static __forceinline__ u32 ds_row_address(const char* block, int warp, int lane) {
    const u32 row = 8 * (lane / 16) + lane % 8;
    return shared_address(block) + sw128_byte_offset(row, (16 * warp + 8 * ((lane / 8) % 2)) * 2);
  }

  // Stage 4. dS (query rows x KV columns, K-major for dQ's A operand) into shared memory: this
  // warpgroup writes column block wg, once both warpgroups have passed the barrier, so the
  // previous task's dQ reads of the tile are done (kDsInLoop passed it before the softmax loop).
  // After the second barrier both halves are visible to the wgmmas. Returns the dS tile.
  __device__ static __forceinline__ const char* store_ds(const u32 (&dsa)[kBlockM / 16][4],
                                                         char* smem, int s, const MmaThread& me) {
    if constexpr (!kDsInLoop) {
      K::sync_mma_warpgroups();
    }
    char* ds_tile = smem + kOffDs + s * (kDsStages == 2 ? kDsBytes : 0);
    char* ds_block = ds_tile + me.wg * kBlockM * 128;
    if constexpr (!kDsInLoop) {
      // ds_row_address written out: called, it makes ptxas order this kernel differently from
      // the one measured (docs/design.md, `ds-stmatrix`).
      const u32 row = 8 * (me.lane / 16) + me.lane % 8;
      const u32 dst = shared_address(ds_block) +
                      sw128_byte_offset(row, (16 * me.warp + 8 * ((me.lane / 8) % 2)) * 2);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) stmatrix_x4_trans(dst + 2048 * kk, dsa[kk]);
    }
    fence_proxy_async_shared();
    K::sync_mma_warpgroups();
    return ds_tile;
  }

  // Stage 5. acc += A B over the task's kBlockM query rows, one commit group: dV += P^T dO
  // (A = pa, B = dO) or dK += dS^T Q (A = dsa, B = Q), A from registers, B MN-major (head_dim
  // contiguous).
  __device__ static __forceinline__ void rs_gemm(float (&acc)[kHeadDim / 2],
                                                 const u32 (&a)[kBlockM / 16][4],
                                                 const char* b_tile) {
    const u64 b_desc = wgmma_desc_mn_major_sw128(b_tile, kBlockM * 128);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      rs_mma(acc, a[kk], wgmma_desc_advance(b_desc, kk * kSw128MnMajorKStepBytes));
    }
    wgmma_commit_group();
  }

  // dV += P^T dO / dK += dS^T Q: one k16 step, N = head_dim, B MN-major.
  __device__ static void rs_mma(float (&acc)[kHeadDim / 2], const u32 (&a)[4], u64 desc_b) {
    if constexpr (kHeadDim == 128) {
      wgmma_rs<kIn, 128, 1>(acc, a, desc_b, true);
    } else {
      wgmma_rs<kIn, 64, 1>(acc, a, desc_b, true);
    }
  }

  // Stage 6. dQ = dS K, A = dS K-major, B = K MN-major: this warpgroup's 64x64 share
  // (kDqSplit), retired on return.
  __device__ static __forceinline__ void dq_mma(float (&dq)[32], const char* smem,
                                                const char* ds_tile, int wg) {
    constexpr int kDqSteps = kBlockN / 16;
    const int a_row0 = kDqSplit == DqSplit::kRows ? 64 * wg : 0;
    const char* k_block = smem + kOffK + (kDqSplit == DqSplit::kColumns ? wg * kBlockN * 128 : 0);
    const u64 k_desc = wgmma_desc_mn_major_sw128(k_block, kBlockN * 128);
#pragma unroll
    for (int k = 0; k < kDqSteps; ++k) {
      const u64 a_ds = tile_desc_k_major(ds_tile, kBlockM, a_row0, k);
      wgmma_ss<kIn, 64, 0, 1>(dq, a_ds, wgmma_desc_advance(k_desc, k * kSw128MnMajorKStepBytes),
                              k > 0);
    }
    wgmma_commit_group();
  }

  // Stages 5 and 6 as dV (issued before stage 4), dQ, dK: dQ's wgmmas ahead of dK's, so the dQ
  // hand-off (its shared-memory stores) runs while the tensor cores work on dK, with P^T's
  // registers free (dV retired) by then.
  __device__ static __forceinline__ void dq_then_dk(
      float (&dk)[kHeadDim / 2], float (&dq)[32], const u32 (&dsa)[kBlockM / 16][4], char* smem,
      const char* q_tile, const char* ds_tile, Bars* bars, int s, int use, const MmaThread& me) {
    dq_mma(dq, smem, ds_tile, me.wg);
    wgmma_wait_group<1>();  // dV retired: P^T's registers are free
    wgmma_fence();
    rs_gemm(dk, dsa, q_tile);
    wgmma_wait_group<1>();  // dQ retired
    // After a segment's last dQ MMA K/V are free (kEarlyKv: the next segment's load overlaps
    // the dQ hand-off and the dK/dV stores); Q/dO stage s and its task slot once dK/dV retire.
    if (kEarlyKv && me.tid % 128 == 0 && seg_end_of(smem, s)) mbarrier_arrive(&bars->kv_empty);
    hand_off_dq(dq, smem, bars, s, use, me);
    wgmma_wait_group<0>();
    mbarrier_arrive(&bars->q_empty[s]);
  }

  // kDqLast: Q/dO stage s and its task slot are released once dK's and dQ's wgmmas retire,
  // before the hand-off waits for the writer, so a long sequence's next loads never wait on a
  // dQ rank (docs/design.md, `dq-last-long`). The wgmmas after dV's (issued before stage 4): at
  // head_dim 128 dK's, then dQ's; at 64 dQ's, then dK's, as dq_then_dk, which measured 1.5-4.3%
  // faster there at 131k-262k tokens and 2% slower at 128 (the dQ-first order at 128 at 262k).
  __device__ static __forceinline__ void release_then_hand_off(
      float (&dk)[kHeadDim / 2], float (&dq)[32], const u32 (&dsa)[kBlockM / 16][4], char* smem,
      const char* q_tile, const char* ds_tile, Bars* bars, int s, int use, const MmaThread& me) {
    if constexpr (kHeadDim == 64) {
      dq_mma(dq, smem, ds_tile, me.wg);
      wgmma_wait_group<1>();  // dV retired: P^T's registers are free
      wgmma_fence();
      rs_gemm(dk, dsa, q_tile);
      wgmma_wait_group<0>();  // dQ and dK retired
    } else {
      wgmma_fence();
      rs_gemm(dk, dsa, q_tile);
      wgmma_wait_group<0>();  // dV and dK retired: P^T's and dS^T's registers are free
      dq_mma(dq, smem, ds_tile, me.wg);
      wgmma_wait_group<0>();
    }
    if (kEarlyKv && me.tid % 128 == 0 && seg_end_of(smem, s)) mbarrier_arrive(&bars->kv_empty);
    mbarrier_arrive(&bars->q_empty[s]);
    hand_off_dq(dq, smem, bars, s, use, me);
  }

  // Stage 7. The dQ partial to the writer warp through buffer s, once it has taken the stage's
  // previous one.
  __device__ static __forceinline__ void hand_off_dq(const float (&dq)[32], char* smem, Bars* bars,
                                                     int s, int use, const MmaThread& me) {
    float* dq_buf = reinterpret_cast<float*>(smem + kOffDq + s * kDqBytes);
    mbarrier_wait_parity(&bars->dq_empty[s], (use & 1) ^ 1);
    if constexpr (kDqSplit == DqSplit::kRows) {
      // With two dS tiles nothing else holds the warpgroups together until the next task's
      // stage 4: warpgroup 1 stores after warpgroup 0, so the two start the next task's score
      // MMAs a store apart instead of together (docs/design.md, `ds64-two-tiles`). Both pass
      // every task's stage-4 barrier, so warpgroup 0 cannot arrive twice before one sync.
      if (kDsStages == 2 && me.wg == 1) {
        named_barrier_sync(static_cast<u32>(K::Barrier::kHandOff), kMmaThreads);
      }
      store_dq(dq_buf + 64 * me.wg * kHeadDim, dq, 0, me.warp, me.g, me.t4);
      if (kDsStages == 2 && me.wg == 0) {
        named_barrier_arrive(static_cast<u32>(K::Barrier::kHandOff), kMmaThreads);
      }
    } else {
      store_dq(dq_buf, dq, 64 * me.wg, me.warp, me.g, me.t4);
    }
    fence_proxy_async_shared();
    mbarrier_arrive(&bars->dq_full[s]);
  }

  // A 64x64 dQ accumulator fragment into the fp32 buffer (rows of kHeadDim, accum_col layout,
  // which the writer's bulk add carries to global memory unchanged) at column col0. A fragment
  // row is g mod 8, so accum_col takes g: the swizzle is one constant per thread.
  __device__ static void store_dq(float* buf, const float (&dq)[32], int col0, int warp, int g,
                                  int t4) {
#pragma unroll
    for (int ii = 0; ii < 32; ii += 2) {
      const int row = 16 * warp + g + 8 * ((ii / 2) % 2);
      const int col = accum_col(g, col0 + 8 * (ii / 4) + 2 * t4);
      *reinterpret_cast<float2*>(buf + row * kHeadDim + col) = make_float2(dq[ii], dq[ii + 1]);
    }
  }

  // A segment's end: its dK/dV to the epilogue, then (without kEarlyKv) K/V freed.
  __device__ static __forceinline__ void end_segment(const BwdParams& p, const Task& t,
                                                     const float (&dk)[kHeadDim / 2],
                                                     const float (&dv)[kHeadDim / 2], int group,
                                                     Bars* bars, const MmaThread& me) {
    if constexpr (kGqa) {
      Epilogue::add_dkv_in_rank_order(p, t, dk, dv, me);
    } else {
      Epilogue::store_dkv(p, t, dk, dv, group, me);
    }
    if (!kEarlyKv && me.tid % 128 == 0) mbarrier_arrive(&bars->kv_empty);
  }
};

}  // namespace dashgen
