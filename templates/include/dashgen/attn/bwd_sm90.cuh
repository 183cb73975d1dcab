// dashgen/attn/bwd_sm90.cuh: the Hopper-native persistent attention backward.
// Warp-specialized, one CTA per SM, walking its worker's share of the schedule (Cfg::Walk: a
// named schedule's policy, computed from the tiles, or a schedule file's table):
// Roles with a header of their own (each a struct templated on this kernel for its constants):
// BwdScheduler (attn/bwd_scheduler.cuh), BwdProducer (attn/bwd_producer.cuh), BwdDqWriter
// (attn/bwd_dq_writer.cuh), BwdDqConverter (attn/bwd_dq_converter.cuh), the MMA warpgroups'
// dK/dV epilogue BwdEpilogue (attn/bwd_epilogue.cuh); their mainloop is still here.
//   warpgroup 0, warp 3, lane 1: scheduler: walks the schedule, each task into a ring slot that
//                        the producer and the dQ writer read;
//   warpgroup 0, warp 0: producer: TMA loads of K/V once per segment, Q/dO per task (2 stages;
//                        with them the task's lse and D rows);
//   warpgroup 0, warp 1: dQ writer: waits for the dQ tile's counter to reach the task's dq_rank,
//                        bulk-reduces the fp32 partial into global memory, waits until it has
//                        landed, then releases the next rank (2 dQ buffers in flight);
//   warpgroup 0, warps 2-3 (kFusedConvert, deterministic): dQ converter: warp 3's lane 0
//                        walks this worker's share of the dQ tiles (dealt round-robin in the
//                        order of their heads' launch), waits for each tile's counter to reach
//                        its contribution count and bulk-copies the final sum into shared
//                        memory; warp 2 writes its 16-bit dQ while the MMA warpgroups go on, so
//                        no convert kernel runs after this one;
//   warpgroups 1, 2:     MMA: each owns 64 of the 128 KV rows (dK/dV in registers, wgmma).
// S^T = K Q^T and dP^T = V dO^T come out KV-row-major, so P^T and dS^T feed dV += P^T dO and
// dK += dS^T Q straight from registers; dQ = dS K reads dS from shared memory, each MMA
// warpgroup computing half of it (see kDqSplit). The schedule state lives in the producer and
// writer. A task is kBlockM query rows against the 128 KV rows: 64, or 128 at head_dim 64,
// where a 64-row task leaves the tensor cores idle behind its fixed per-task costs.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/barrier.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/counter.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/regs.cuh"
#include "dashgen/ptx/stmatrix.cuh"
#include "dashgen/ptx/timer.cuh"
#include "dashgen/ptx/tma.cuh"
#include "dashgen/ptx/wgmma.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
#include "dashgen/attn/bwd_dq_converter.cuh"
#include "dashgen/attn/bwd_dq_writer.cuh"
#include "dashgen/attn/bwd_epilogue.cuh"
#include "dashgen/attn/bwd_producer.cuh"
#include "dashgen/attn/bwd_scheduler.cuh"
#include "dashgen/sched/walk.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

// Named barrier ids (bar.sync; 0 is __syncthreads'): kMma joins both MMA warpgroups; kHandOff
// orders their dQ hand-offs with two dS tiles (hand_off_dq).
enum class Sm90Barrier : u32 { kMma = 1, kHandOff = 2 };

enum class DqSplit { kColumns, kRows };

// Cfg: the configuration the entry template renders (attn_bwd_sm90.cu.j2); its members are
// named here as the kernel uses them.
template <class Cfg>
struct AttnBwdSm90 {
  using Config = Cfg;
  using T = typename Cfg::Element;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kBlockM = Cfg::kBlockM;  // query rows per task
  static constexpr int kBlockN = Cfg::kBlockN;  // KV rows per task
  static constexpr bool kCausal = Cfg::kCausal;
  static constexpr bool kDeterministic = Cfg::kDeterministic;  // dQ adds in dq_rank order
  static constexpr bool kTrace = Cfg::kTrace;
  static constexpr bool kGqa = Cfg::kGqa;
  static constexpr bool kFusedConvert = Cfg::kFusedConvert;
  static constexpr bool kEarlyKv = Cfg::kEarlyKv;
  // A task's dQ wgmmas after dK's, Q/dO freed before the dQ hand-off (which waits for the
  // writer): the order before dQ's hand-off moved under dK's wgmmas. Where the writer waits
  // long for ranks, the hand-off no longer holds back the next Q/dO loads (docs/design.md,
  // `dq-last-long`).
  static constexpr bool kDqLast = Cfg::kDqLast;
  // The schedule: which tasks this worker runs in which order, and their ranks.
  using Tiling = sched::Tiling<kBlockM, kBlockN, kCausal>;
  static constexpr bool kTable = Cfg::kTable;
  // A pack of sequences of their own lengths (BwdParams::cu_seqlens_q/k): the walk is the
  // policy's pack deal (sched::PackWalk over the plan AttnPackPlan wrote), and every address
  // and mask reads the task's sequence.
  static constexpr bool kVarlen = Cfg::kVarlen;
  static_assert(!kVarlen || (!kTable && !kFusedConvert),
                "a pack runs a named policy, its dQ converted by the convert kernel");

  static constexpr WgmmaInput kIn = Element<T>::kWgmma;
  static constexpr int kThreads = 384;
  static constexpr int kMmaThreads = 256;
  // setmaxnreg split of the SM's 65536 registers: the producer warpgroup's jobs are single
  // lanes issuing copies and polling counters and fit the minimum, which leaves each MMA
  // warpgroup the largest multiple of 8 that fits beside it, for dK/dV and the S^T/dP^T tiles.
  static constexpr int kProducerRegs = 24;
  static constexpr int kMmaRegs = 240;
  static_assert(128 * kProducerRegs + kMmaThreads * kMmaRegs <= 65536, "register file");
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle column blocks per row
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  static_assert(kBlockN == 128, "128 KV rows: 64 per MMA warpgroup");
  // 128 query rows hold 64 more S^T/dP^T accumulators per thread: room for them only beside
  // head_dim 64's dK/dV.
  static_assert((kHeadDim == 128 && kBlockM == 64) || (kHeadDim == 64 && kBlockM == 128),
                "block_m 64 at head_dim 128, 128 at head_dim 64 (the backward's tiles)");
  // How the MMA warpgroups share dQ = dS K: by its 64-column halves at head_dim 128, by query
  // rows at head_dim 64 (128 of them a task).
  static constexpr DqSplit kDqSplit = kHeadDim == 128 ? DqSplit::kColumns : DqSplit::kRows;

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // one Q or dO tile
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;   // one K or V tile
  static constexpr int kDsBytes = kBlockM * kBlockN * 2;
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;
  // dS goes to shared memory through transposing stmatrix (docs/design.md, `ds-stmatrix`). With
  // 128-row tasks (head_dim 64) each 16 query rows of dS are stored as soon as the softmax loop
  // has them, the barrier that frees the dS tile passed before the loop; stored after the loop,
  // the whole tile's fragments at once made ptxas spill. dV's wgmmas are issued before stage 4
  // (the dS stores and barriers) at both head dims (docs/design.md, `bwd-dq-before-dk`).
  static constexpr bool kDsInLoop = kBlockM == 128;
  // Two dS tiles with 128-row tasks (but beside the fused convert's chunks, which leave no room),
  // task i's in tile i mod 2: that tile was last read by task i - 2's dQ MMA, which both
  // warpgroups retired before they passed task i - 1's stage-4 barrier, so no barrier precedes
  // the softmax loop (docs/design.md, `ds64-two-tiles`). Shared memory then fits only without
  // the alignment slack: the extern buffer is declared 1024-aligned, and the align-up in run()
  // stays (a no-op then).
  static constexpr int kDsStages = kDsInLoop && !(kFusedConvert && kDeterministic) ? 2 : 1;
  // Every tile starts 1024-byte aligned (128B swizzle atoms).
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffQ = kOffV + kKBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffDo + kStages * kQBytes;
  static constexpr int kOffDq = kOffDs + kDsStages * kDsBytes;
  // The task's softmax statistics (kBlockM lse rows as log2, then kBlockM D rows): one copy per
  // stage, loaded with the stage's Q and dO.
  static constexpr int kStatsBytes = 2 * kBlockM * 4;
  static constexpr int kOffStats = kOffDq + kStages * kDqBytes;
  static constexpr int kOffBar = kOffStats + kStages * kStatsBytes;  // a copy a stage
  // The scheduler lane's ring of tasks: kRing slots, each read by the producer and the writer.
  static constexpr int kRing = 8;
  static constexpr int kNumBars = 2 + 4 * kStages + 2 * kRing;
  // The producer hands each stage's task to the MMA warpgroups here, so they never see the
  // schedule (its state stays out of their registers); after the slots, this worker's task
  // count, which thread 0 counts on the scheduler's walk before the roles start.
  static constexpr int kOffTask = kOffBar + kNumBars * 8;
  static constexpr int kOffCount = kOffTask + kStages * 32;
  static constexpr int kOffRing = kOffCount + 16;  // kRing Task slots
  // Only the deterministic backward counts each tile's landed contributions, so only it knows
  // when a dQ sum is final; without it, the convert kernel runs after this one.
  static constexpr bool kConvertDq = kFusedConvert && kDeterministic;
  static constexpr u32 kConvPollNs = 500;  // sleep between the converter's counter polls
  // The converter bulk-copies each final fp32 sum into shared memory a chunk at a time (two
  // chunks in flight: 16 KB, where one 16-byte load per thread kept 1 KB in flight and a
  // worker's share of the tiles took longer than the kernel) and writes 16-bit rows from there.
  // Its full and empty barriers and two ConvSlots, then the two chunk buffers; 8 KB chunks
  // where they fit.
  static constexpr int kOffConv = (kOffRing + kRing * 32 + 127) / 128 * 128;
  static constexpr int kConvChunkBytes =
      kOffConv + 128 + 2 * 8192 + 1024 <= kSm90MaxSmemBytes ? 8192 : 4096;
  static constexpr int kConvChunks = kDqBytes / kConvChunkBytes;  // chunks per dQ tile
  static constexpr int kConvChunkRows = kConvChunkBytes / (kHeadDim * 4);
  static constexpr int kAlignSlack = kDsStages == 2 ? 0 : 1024;  // see kDsStages
  static constexpr int kSmemBytes = kConvertDq ? kOffConv + 128 + 2 * kConvChunkBytes + 1024
                                               : kOffRing + kRing * 32 + kAlignSlack;
  static_assert(kSmemBytes <= kSm90MaxSmemBytes,
                "shared memory exceeds what an sm_90 block may use");

  struct Bars {
    u64 kv_full, kv_empty;
    u64 q_full[kStages], q_empty[kStages];
    u64 dq_full[kStages], dq_empty[kStages];
    u64 ring_full[kRing], ring_empty[kRing];
  };

  using Task = sched::Task;
  static_assert(sizeof(Task) <= 32, "one 32-byte task slot per stage");
  using Scheduler = BwdScheduler<AttnBwdSm90>;

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

  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k, const TensorMap* tm_v,
                             const TensorMap* tm_do, const BwdParams& p, char* smem_raw) {
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    const int warpgroup = threadIdx.x / 128;
    int* count_slot = reinterpret_cast<int*>(smem + kOffCount);

    if (threadIdx.x == 0) {
      mbarrier_init(&bars->kv_full, 1);
      mbarrier_init(&bars->kv_empty, 2);
      for (int s = 0; s < kStages; ++s) {
        mbarrier_init(&bars->q_full[s], 1);
        // Every MMA thread arrives: each has read the stage's task slot and the arrive releases
        // its own read before the producer rewrites the slot.
        mbarrier_init(&bars->q_empty[s], kMmaThreads);
        mbarrier_init(&bars->dq_full[s], kMmaThreads);
        mbarrier_init(&bars->dq_empty[s], 1);
      }
      for (int k = 0; k < kRing; ++k) {
        mbarrier_init(&bars->ring_full[k], 1);
        mbarrier_init(&bars->ring_empty[k], 2);  // the producer's and the writer's reads
      }
      if constexpr (kConvertDq) {
        u64* conv_bars = reinterpret_cast<u64*>(smem + kOffConv);  // full[2], then empty[2]
        // full: the issuing lane's arrive (plus the copy's bytes); empty: every converting lane
        // arrives for its own reads of the buffer and slot (docs/design.md, `fused-convert`).
        for (int i = 0; i < 4; ++i) mbarrier_init(&conv_bars[i], i < 2 ? 1 : 32);
      }
      fence_barrier_init();
      const typename Scheduler::Shape shape{p};
      *count_slot = Scheduler::make_walk(p, shape).count();
    }
    __syncthreads();
    const int count = *count_slot;

    if (warpgroup == 0) {
      setmaxnreg_dec<kProducerRegs>();
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      if (warp == 0 && lane == 0) {
        BwdProducer<AttnBwdSm90>::run(tm_q, tm_k, tm_v, tm_do, p, smem, bars, count);
      }
      if (warp == 1 && lane == 0) BwdDqWriter<AttnBwdSm90>::run(p, smem, bars, count);
      if constexpr (kConvertDq) {
        if (warp >= 2) BwdDqConverter<AttnBwdSm90>::run(p, smem, threadIdx.x - 64);
      }
      if (warp == 3 && lane == 1) Scheduler::run(p, smem, bars, count);
    } else {
      setmaxnreg_inc<kMmaRegs>();
      // The MMA loop runs from an opaque first index: with a literal 0 the compiler turned the
      // stage index (i - begin) % kStages into i & 1, and ptxas then recomputed the stages'
      // wgmma descriptors inside the task loop (docs/design.md, `scheduler-lane`).
      int begin;
      asm volatile("mov.b32 %0, 0;" : "=r"(begin));
      consume(p, smem, bars, begin, begin + count, warpgroup - 1, threadIdx.x - 128);
    }
  }

  // ---- MMA warpgroups ------------------------------------------------------------------------
  // A task's stages, in order: 1 issue_scores, 2 task_stats, 3 P^T and dS^T, 4 dS to shared
  // memory, 5 and 6 dV, dQ, dK (rs_gemm, dq_mma), 7 hand_off_dq; at a segment's end the
  // epilogue (BwdEpilogue: store_dkv, or under GQA add_dkv_in_rank_order). consume() holds what
  // outlives a task (the segment's dK/dV accumulators) and the stage and segment bookkeeping.
  // Stages 3 and 4 stay written out in it: moved into inlined member functions, they make NVVM
  // number the dK/dV accumulators' registers differently and ptxas schedule the kernel
  // differently from the one measured.

  // Both MMA warpgroups meet (the producer warpgroup does not take part).
  __device__ static __forceinline__ void sync_mma_warpgroups() {
    named_barrier_sync(static_cast<u32>(Sm90Barrier::kMma), kMmaThreads);
  }

  // An MMA thread's place: its warpgroup (KV rows 64 * wg.. of every task), its index over both
  // MMA warpgroups, and the warp, lane, quad row g and column t4 within its warpgroup that the
  // wgmma fragment layouts use.
  struct MmaThread {
    int wg, tid, warp, lane, g, t4;
  };
  using Epilogue = BwdEpilogue<AttnBwdSm90>;

  __device__ static void consume(const BwdParams& p, char* smem, Bars* bars, int begin, int end,
                                 int wg, int tid) {
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const MmaThread me{wg, tid, warp, lane, g, t4};
    const int group = p.heads_q / p.heads_kv;
    const float scale_log2 = p.softmax_scale * kLog2e;
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

      // Stage 3. P^T and dS^T in registers, packed to 16-bit A fragments for the RS wgmmas, once
      // the score MMAs have landed. kDsInLoop: each 16 query rows of dS go to shared memory as
      // the loop finishes them.
      u32 pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
      wgmma_wait_group<0>();
      u32 ds_row = 0;  // kDsInLoop: this lane's stmatrix row address in this warpgroup's block
      if constexpr (kDsInLoop) {
        // One dS tile: both warpgroups finished the previous task's dQ MMA (its reads of dS)
        // before this one. Two: see kDsStages.
        int ds_off = 0;
        if constexpr (kDsStages == 1) {
          sync_mma_warpgroups();
        } else {
          ds_off = s * kDsBytes;
          asm volatile("mov.b32 %0, %0;" : "+r"(ds_off));  // formed here, not held from the top
        }
        ds_row = ds_row_address(smem + kOffDs + ds_off + wg * kBlockM * 128, warp, lane);
      }
      // P^T = exp2(S^T * scale - lse), 0 for keys past the end and, under the causal mask, keys
      // after the query row; dS^T = P^T (dP^T * softmax_scale - D * softmax_scale), the D the
      // preprocess stored already scaled: one FFMA where a subtraction and a product were. Written out in the loop: with
      // the mask and the exponent in functions of their own, NVVM orders its index arithmetic
      // differently. Under a causal mask only a task whose keys (this warpgroup's 64) cross the
      // sequence's end or the diagonal runs the mask: the others (all but one of a KV tile's
      // tasks with square tiles) skip a compare and its index arithmetic per element. A full
      // mask compares per key, on edge tasks only, before the one loop.
      const bool edge = mask_reaches<kCausal>(t.n * kBlockN + 64 * wg + 63, t.m * kBlockM,
                                              kVarlen ? seq_k : p.seqlen_k,
                                              kVarlen ? seq_offset : causal_offset);
      if constexpr (!kCausal) {
        // Full mask: only keys past the sequence's end are masked, and only a task whose keys
        // reach it has any. Their scores become -inf there, so the one loop below takes
        // exp2(-inf) = +0 for them, the value the per-element select gave, without a select
        // per element on every other task (a second copy of the loop made head_dim 64 spill).
        if (edge) {
          const int keys_end = kVarlen ? seq_k : p.seqlen_k;
#pragma unroll
          for (int ii = 0; ii < kBlockM / 2; ++ii) {
            const int key = t.n * kBlockN + 64 * wg + 16 * warp + g + 8 * ((ii / 2) % 2);
            if (key >= keys_end) st[ii] = -DASHGEN_INF;
          }
        }
        unmasked_softmax<true>(st, dpt, stats, pa, dsa, ds_row, scale_log2, p.softmax_scale, me);
      } else if (!edge) {
        unmasked_softmax<false>(st, dpt, stats, pa, dsa, ds_row, scale_log2, p.softmax_scale, me);
      } else {  // a causal edge task: the mask per element
#pragma unroll
        for (int i2 = 0; i2 < kBlockM / 2; i2 += 2) {
          const int row = 16 * warp + g + 8 * ((i2 / 2) % 2);
          const int key = t.n * kBlockN + 64 * wg + row;
          float pv[2], ds[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int ii = i2 + e;
            const int col = 8 * (ii / 4) + 2 * t4 + (ii % 2);
            const int qrow = t.m * kBlockM + col;
            const bool masked = kVarlen
                                    ? key >= seq_k || (kCausal && key > qrow + seq_offset)
                                    : key >= p.seqlen_k || (kCausal && key > qrow + causal_offset);
            // Only causal edge tasks (the diagonal, the sequence's end) come here. The exponent
            // is formed before the select, as measured; selecting the exponent instead
            // (exp2(-inf) = +0) spilled 8 bytes in a causal GQA variant.
            const float exponent = st[ii] * scale_log2 - stats[col];
            pv[e] = masked ? 0.f : exp2f(exponent);
            ds[e] = pv[e] * fmaf(dpt[ii], p.softmax_scale, -stats[kBlockM + col]);
          }
          pa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(pv[0], pv[1]);
          dsa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(ds[0], ds[1]);
          if constexpr (kDsInLoop) {
            if (i2 % 8 == 6) stmatrix_x4_trans(ds_row + 2048 * (i2 / 8), dsa[i2 / 8]);
          }
        }
      }

      // Stage 5a: dV += P^T dO needs nothing of the other warpgroup, so its wgmmas run through
      // stage 4's barrier.
      wgmma_fence();
      rs_gemm(dv, pa, do_tile);

      // Stage 4. dS (query rows x KV columns, K-major for dQ's A operand) into shared memory: this
      // warpgroup writes column block wg, once both warpgroups have passed the barrier, so the
      // previous task's dQ reads of the tile are done (kDsInLoop passed it before the softmax
      // loop). After the second barrier both halves are visible to the wgmmas.
      if constexpr (!kDsInLoop) {
        sync_mma_warpgroups();
      }
      char* ds_tile = smem + kOffDs + s * (kDsStages == 2 ? kDsBytes : 0);
      char* ds_block = ds_tile + wg * kBlockM * 128;
      if constexpr (!kDsInLoop) {
        // ds_row_address written out: called, it makes ptxas order this kernel differently from
        // the one measured (docs/design.md, `ds-stmatrix`).
        const u32 row = 8 * (lane / 16) + lane % 8;
        const u32 dst = shared_address(ds_block) +
                        sw128_byte_offset(row, (16 * warp + 8 * ((lane / 8) % 2)) * 2);
#pragma unroll
        for (int kk = 0; kk < kBlockM / 16; ++kk) stmatrix_x4_trans(dst + 2048 * kk, dsa[kk]);
      }
      fence_proxy_async_shared();
      sync_mma_warpgroups();

      if constexpr (kDqLast) {
        // Stages 5 and 6 as dV (issued above), dK, dQ: Q/dO stage s and its task slot are free
        // once dQ's wgmmas retire, before the hand-off waits for the writer.
        wgmma_fence();
        rs_gemm(dk, dsa, q_tile);
        wgmma_wait_group<0>();  // dV and dK retired: P^T's and dS^T's registers are free
        float dq[32];
        dq_mma(dq, smem, ds_tile, wg);
        wgmma_wait_group<0>();
        if (kEarlyKv && tid % 128 == 0 && seg_end_of(smem, s)) mbarrier_arrive(&bars->kv_empty);
        mbarrier_arrive(&bars->q_empty[s]);
        hand_off_dq(dq, smem, bars, s, use, me);
      } else {
        // Stages 5 and 6 as dV (issued above), dQ, dK: dQ's wgmmas ahead of dK's, so the dQ
        // hand-off (its shared-memory stores) runs while the tensor cores work on dK, with
        // P^T's registers free (dV retired) by then.
        float dq[32];
        dq_mma(dq, smem, ds_tile, wg);
        wgmma_wait_group<1>();  // dV retired: P^T's registers are free
        wgmma_fence();
        rs_gemm(dk, dsa, q_tile);
        wgmma_wait_group<1>();  // dQ retired
        // After a segment's last dQ MMA K/V are free (kEarlyKv: the next segment's load
        // overlaps the dQ hand-off and the dK/dV stores); Q/dO stage s and its task slot once
        // dK/dV retire.
        if (kEarlyKv && tid % 128 == 0 && seg_end_of(smem, s)) mbarrier_arrive(&bars->kv_empty);
        hand_off_dq(dq, smem, bars, s, use, me);
        wgmma_wait_group<0>();
        mbarrier_arrive(&bars->q_empty[s]);
      }

      if (t.seg_end) {
        if constexpr (kGqa) {
          Epilogue::add_dkv_in_rank_order(p, t, dk, dv, me);
        } else {
          Epilogue::store_dkv(p, t, dk, dv, group, me);
        }
        if (!kEarlyKv && tid % 128 == 0) mbarrier_arrive(&bars->kv_empty);
        ++segment;
      }
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
      float softmax_scale, const MmaThread& me) {
#pragma unroll
    for (int i2 = 0; i2 < kBlockM / 2; i2 += 2) {
      float pv[2], ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ii = i2 + e;
        const int col = 8 * (ii / 4) + 2 * me.t4 + (ii % 2);
        const float exponent = st[ii] * scale_log2 - stats[col];
        pv[e] = kFtzAsm ? exp2_ftz(exponent) : exp2f(exponent);
        ds[e] = pv[e] * fmaf(dpt[ii], softmax_scale, -stats[kBlockM + col]);
      }
      pa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(pv[0], pv[1]);
      dsa[i2 / 8][(i2 % 8) / 2] = Element<T>::pack(ds[0], ds[1]);
      if constexpr (kDsInLoop) {
        if (i2 % 8 == 6) stmatrix_x4_trans(ds_row + 2048 * (i2 / 8), dsa[i2 / 8]);
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
    for (int k = 0; k < kHeadDim / 16; ++k) {
      wgmma_ss<kIn, kBlockM>(st, tile_desc_k_major(smem + kOffK, kBlockN, 64 * wg, k),
                             tile_desc_k_major(q_tile, kBlockM, 0, k), k > 0);
    }
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      wgmma_ss<kIn, kBlockM>(dpt, tile_desc_k_major(smem + kOffV, kBlockN, 64 * wg, k),
                             tile_desc_k_major(do_tile, kBlockM, 0, k), k > 0);
    }
    wgmma_commit_group();
  }

  // Stage 2. The task's per-column (query row) softmax statistics, lse (as log2) then D, in
  // shared memory (in registers they would cost 32 per thread and spill): the producer's copy
  // that landed with stage s's Q and dO (docs/design.md, `staged-stats`).
  // The task and thread arguments are unused; the call keeps them because without them ptxas
  // schedules the main kernel differently from the one measured.
  __device__ static __forceinline__ const float* task_stats(const BwdParams&, const Task&,
                                                            char* smem, int s, const MmaThread&) {
    float* stats = reinterpret_cast<float*>(smem + kOffStats) + s * 2 * kBlockM;
    return stats;
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
    for (int j = 0; j < kDqSteps; ++j) {
      const int k = j;
      const u64 a_ds = tile_desc_k_major(ds_tile, kBlockM, a_row0, k);
      wgmma_ss<kIn, 64, 0, 1>(dq, a_ds, wgmma_desc_advance(k_desc, k * kSw128MnMajorKStepBytes),
                              j > 0);
    }
    wgmma_commit_group();
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
        named_barrier_sync(static_cast<u32>(Sm90Barrier::kHandOff), kMmaThreads);
      }
      store_dq(dq_buf + 64 * me.wg * kHeadDim, dq, 0, me.warp, me.g, me.t4);
      if (kDsStages == 2 && me.wg == 0) {
        named_barrier_arrive(static_cast<u32>(Sm90Barrier::kHandOff), kMmaThreads);
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
};

}  // namespace dashgen
