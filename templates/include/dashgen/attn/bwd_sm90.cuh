// dashgen/attn/bwd_sm90.cuh: the Hopper-native persistent attention backward, as the composition
// of its roles. Warp-specialized, one CTA per SM, each walking its worker's share of the schedule
// (Cfg::Walk: a named schedule's policy, computed from the tiles, or a schedule file's table).
// This header says which roles run on which warps, which named barriers and mbarriers join
// them, the pipeline's stages and the shared-memory layout, and holds the kernel entry (run)
// that starts each role; each role is a struct of its own header, templated on this kernel
// for its constants:
//   warpgroup 0, warp 3, lane 1: BwdScheduler (attn/bwd_scheduler.cuh): walks the schedule and
//                        leaves each task in a ring slot that the producer and the dQ writer read;
//   warpgroup 0, warp 0: BwdProducer (attn/bwd_producer.cuh): TMA loads of K/V once per segment,
//                        Q/dO per task (kStages stages; with them the task's lse and D rows);
//   warpgroup 0, warp 1: BwdDqWriter (attn/bwd_dq_writer.cuh): waits for the dQ tile's counter
//                        to reach the task's dq_rank, bulk-reduces the fp32 partial into global
//                        memory, waits until it has landed, then releases the next rank (2 dQ
//                        buffers in flight);
//   warpgroup 0, warps 2-3 (kConvertDq): BwdDqConverter (attn/bwd_dq_converter.cuh): warp 3's
//                        lane 0 waits for each of this worker's dQ tiles to be final and copies
//                        its sum into shared memory, warp 2 writes its 16-bit dQ while the MMA
//                        warpgroups go on, so no convert kernel runs after this one;
//   warpgroups 1, 2:     BwdMainloop (attn/bwd_mainloop.cuh): MMA, each owning 64 of the 128 KV
//                        rows (dK/dV in registers, wgmma), and at each segment's end BwdEpilogue
//                        (attn/bwd_epilogue.cuh): dK/dV to global memory. At head_dim 192 and
//                        256 (kSwapped) BwdMainloopSwapped (attn/bwd_mainloop_swapped.cuh)
//                        instead: 64x96 tasks at 192 and 64x64 at 256, dK^T/dV^T of half the
//                        keys a warpgroup (192) or of half the head_dim (256), dQ in pieces.
// S^T = K Q^T and dP^T = V dO^T come out KV-row-major, so P^T and dS^T feed dV += P^T dO and
// dK += dS^T Q straight from registers; dQ = dS K reads dS from shared memory, each MMA
// warpgroup computing half of it (BwdMainloop::kDqSplit). The schedule's state lives in the
// scheduler lane alone. A task is kBlockM query rows against the 128 KV rows: 64, or 128 at
// head_dim 64, where a 64-row task leaves the tensor cores idle behind its fixed per-task costs.
#pragma once
#include "dashgen/attn/bwd_dq_converter.cuh"
#include "dashgen/attn/bwd_dq_writer.cuh"
#include "dashgen/attn/bwd_epilogue.cuh"
#include "dashgen/attn/bwd_mainloop.cuh"
#include "dashgen/attn/bwd_mainloop_swapped.cuh"
#include "dashgen/attn/bwd_producer.cuh"
#include "dashgen/attn/bwd_scheduler.cuh"
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
#include "dashgen/ptx/barrier.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/regs.cuh"
#include "dashgen/ptx/tma.cuh"
#include "dashgen/sched/walk.cuh"

namespace dashgen {

// dO's own stage barriers (AttnBwdSm90::kOwnDo), first in Bars where it has them; an empty
// base (no bytes, no offsets moved) elsewhere.
template <bool kOwn>
struct OwnDoBars {};
template <>
struct OwnDoBars<true> {
  u64 do_full, do_empty;
};

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
  // A sliding window (attn/mask.cuh): its bounds are BwdParams::window_left/right. An
  // enumerator, not a static member (NVRTC emits those as globals of the module).
  enum : int { kWindow = has_window<Cfg>(0) };
  // The schedule: which tasks this worker runs in which order, and their ranks.
  using Tiling = typename sched::TilingOf<kBlockM, kBlockN, kCausal, kWindow != 0>::type;
  // The swapped mainloop (attn/bwd_mainloop_swapped.cuh): head dims whose dK/dV accumulators
  // over 64 KV rows do not fit a warpgroup (256). Its own tiles, dQ in pieces.
  enum : int { kSwapped = dkv_swapped<Cfg>(0) };
  // Swapped at 256: each warpgroup owns half the head_dim's column blocks of dK^T/dV^T over all
  // the task's keys (FA3's split there), not all the blocks over half the keys.
  enum : int { kSplitHeadDim = kSwapped && kHeadDim == 256 };
  // Swapped: each warpgroup's dQ pieces through a dQ buffer of its own where two buffers serve
  // the pieces (kDqPerWg below); split (256), dO on one stage to make room.
  enum : int { kDqPerWarpgroup = dq_per_warpgroup<Cfg>(0) };
  static_assert(!kDqPerWarpgroup || kSwapped, "a dQ buffer per warpgroup: the swapped mainloop");
  static constexpr bool kTable = Cfg::kTable;
  // A pack of sequences of their own lengths (BwdParams::cu_seqlens_q/k): the walk is the
  // policy's pack deal (sched::PackWalk over the plan AttnPackPlan wrote), and every address
  // and mask reads the task's sequence.
  static constexpr bool kVarlen = Cfg::kVarlen;
  static_assert(!kVarlen || (!kTable && !kFusedConvert),
                "a pack runs a named policy, its dQ converted by the convert kernel");
  static_assert(kWindow == 0 || (!kTable && !kCausal), "a window runs a named policy");

  // ---- warps ----------------------------------------------------------------------------------
  static constexpr WgmmaInput kIn = Element<T>::kWgmma;
  static constexpr int kThreads = 384;
  static constexpr int kMmaThreads = 256;
  // setmaxnreg split of the SM's 65536 registers: the producer warpgroup's jobs are single
  // lanes issuing copies and polling counters and fit the minimum, which leaves each MMA
  // warpgroup the largest multiple of 8 that fits beside it, for dK/dV and the S^T/dP^T tiles.
  static constexpr int kProducerRegs = 24;
  static constexpr int kMmaRegs = 240;
  static_assert(128 * kProducerRegs + kMmaThreads * kMmaRegs <= 65536, "register file");
  // Where each role runs (see the header comment): lanes of the producer warpgroup's warps.
  static constexpr int kProducerWarp = 0, kWriterWarp = 1, kSchedulerWarp = 3;
  static constexpr int kSchedulerLane = 1;  // lane 0 of kSchedulerWarp is the converter's issuer
  static constexpr int kConverterWarp0 = 2;  // kConvertDq: warps 2 and 3
  // Two dQ writers (a candidate for long rows): lane 0 of warp kWriterWarp takes the tasks of
  // dQ buffer 0, lane 0 of warp kWriterWarp2 those of buffer 1, so that one task's landing and
  // turn overlap the next one's. Each tile still gets its adds in dq_rank order: the same bits.
  enum : int { kDqWriters = dq_writers<Cfg>(0), kWriterWarp2 = 2 };

  // ---- named barriers -------------------------------------------------------------------------
  // Named barrier ids (bar.sync; 0 is __syncthreads'): kMma joins both MMA warpgroups; kHandOff
  // orders their dQ hand-offs with two dS tiles (BwdMainloop::hand_off_dq).
  // Swapped: kHandOff orders the warpgroups' dQ pieces, and each warpgroup has a barrier of its
  // own (kWarpgroup0 + wg) for the P^T rows only it reads.
  enum class Barrier : u32 { kMma = 1, kHandOff = 2, kWarpgroup0 = 3 };

  // Both MMA warpgroups meet (the producer warpgroup does not take part).
  __device__ static __forceinline__ void sync_mma_warpgroups() {
    named_barrier_sync(static_cast<u32>(Barrier::kMma), kMmaThreads);
  }

  // An MMA thread's place: its warpgroup (KV rows 64 * wg.. of every task), its index over both
  // MMA warpgroups, and the warp, lane, quad row g and column t4 within its warpgroup that the
  // wgmma fragment layouts use.
  struct MmaThread {
    int wg, tid, warp, lane, g, t4;
  };

  // ---- pipeline and shared memory -------------------------------------------------------------
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle column blocks per row
  // V's, O's and dO's columns (attn/head_dim.cuh): 128 under 192 (DeepSeek's MLA), in the
  // swapped mainloop only; its column blocks. Enumerators: no module globals.
  enum : int { kHeadDimV = head_dim_v<Cfg>(0), kColBlocksV = kHeadDimV / 64 };
  static_assert(kHeadDimV == kHeadDim || (kSwapped && kHeadDim == 192 && kHeadDimV == 128 &&
                                          !kGqa),
                "V as wide as Q and K, or 128 under 192 in the swapped mainloop (MHA: the GQA "
                "dK/dV sums are converted at one width)");
  static_assert(kHeadDim == 64 || kHeadDim == 128 ||
                    (kSwapped && (kHeadDim == 192 || kHeadDim == 256)),
                "head_dim 64 or 128, 192 or 256 swapped");
  static_assert(kSwapped ? kBlockN == 64 || (kBlockN == 96 && kHeadDim == 192) ||
                               (kBlockN == 80 && kHeadDim == 256)
                         : kBlockN == 128,
                "128 KV rows: 64 per MMA warpgroup; swapped, 64 (32 per warpgroup), at head_dim "
                "192 96 (48 per warpgroup), at 256 80");
  static_assert(!kSwapped || (kBlockM == 64 && !kFusedConvert && !kDqLast),
                "the swapped mainloop: 64 query rows, dQ converted by the convert kernel");
  // 128 query rows hold 64 more S^T/dP^T accumulators per thread: room for them only beside
  // head_dim 64's dK/dV.
  static_assert(kSwapped || (kHeadDim == 128 && kBlockM == 64) ||
                    (kHeadDim == 64 && kBlockM == 128),
                "block_m 64 at head_dim 128, 128 at head_dim 64 (the backward's tiles)");

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // one Q or dO tile
  static constexpr int kKBytes = kBlockN * kHeadDim * 2;   // one K or V tile
  enum : int { kVBytes = kBlockN * kHeadDimV * 2, kDoBytes = kBlockM * kHeadDimV * 2 };
  static constexpr int kDsBytes = kBlockM * kBlockN * 2;
  // dQ's fp32 partial goes to the writer whole through kStages buffers, or (swapped: the
  // whole partial does not fit beside two Q/dO stages) in 64-column pieces (kDqBuffers below).
  // Enumerators, not static members: NVRTC emits those as globals of the module, and more
  // globals move the addresses other kernels of the module load (the pack plan's).
  enum : int { kDqPieces = kSwapped ? kColBlocks : 1 };
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4 / kDqPieces;
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
  // Swapped: the two tiles are P^T and dS^T.
  static constexpr int kDsStages =
      kSwapped || (kDsInLoop && !(kFusedConvert && kDeterministic)) ? 2 : 1;
  // Every tile starts 1024-byte aligned (128B swizzle atoms).
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffQ = kOffV + kVBytes;
  // dO's stages: the Q/dO stages, or at 64x80 tasks of head_dim 256 (where two dO tiles do not
  // fit beside two Q tiles, FA3's dO stages there) one of its own (do_full/do_empty), freed
  // once dV^T, its last reader, has retired, so the next task's dO loads under this one's dK^T
  // and dQ.
  enum : int {
    kDoStages = kSwapped && (kBlockN == 80 || (kDqPerWarpgroup && kSplitHeadDim)) ? 1 : kStages,
    kOwnDo = kDoStages == 1
  };
  static_assert(!kOwnDo || kSplitHeadDim, "dO's own stage: dV^T retires before dS^T's stores");
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffDo + kDoStages * kDoBytes;
  static constexpr int kOffDq = kOffDs + kDsStages * kDsBytes;
  // Swapped: a buffer per piece where they fit beside the rest (192/128), else two (192/192;
  // 256 with dO on one stage: kDqPerWg) or one (256 with two dO stages) the pieces take in
  // turns, piece cb in buffer cb % kDqBuffers (dq_buffer, dq_use). kDqTail: what follows the
  // buffers (statistics, barriers, slots, ring, alignment slack: 2,608 bytes at most;
  // kSmemBytes is checked below). kDqBars: the full/empty pairs.
  enum : int {
    kDqTail = 3072,
    kDqBuffers = !kSwapped ? kStages
                 : kOffDq + kDqPieces * kDqBytes + kDqTail <= kSm90MaxSmemBytes ? kDqPieces
                 : kOffDq + 2 * kDqBytes + kDqTail <= kSm90MaxSmemBytes ? 2 : 1,
    kDqBars = kDqBuffers > kStages ? kDqBuffers : kStages
  };
  // kDqPerWarpgroup with two buffers for more pieces: buffer w takes warpgroup w's pieces
  // (kWgPieces0 and kDqPieces - kWgPieces0 a task, in column-block order), so the warpgroups
  // hand over without taking turns and the writer reads one buffer while the other fills
  // (with a buffer a piece, 192/128, there is nothing to share).
  enum : int {
    kDqPerWg = kDqPerWarpgroup && kDqBuffers == 2 && kDqPieces > 2,
    kWgPieces0 = (kDqPieces + 1) / 2,
    kWgPieces1 = kDqPieces - kWgPieces0
  };
  static_assert(!kDqPerWarpgroup || kDqPerWg || kDqBuffers == kDqPieces,
                "a dQ buffer per warpgroup: two buffers, or one a piece");
  // Swapped: the buffer of dQ's piece cb, and which use of that buffer piece cb of a worker's
  // task number `task` is (a buffer takes its pieces in column-block order, task after task).
  // (A buffer a piece spelled out: cb is not known at compile time where a warpgroup's first
  // piece depends on the warpgroup.)
  __device__ static constexpr int dq_buffer(int cb) {
    return kDqPerWg ? cb / kWgPieces0 : kDqBuffers == kDqPieces ? cb : cb % kDqBuffers;
  }
  __device__ static constexpr int dq_use(int task, int cb) {
    // (Both warpgroups with as many pieces, 256: one expression for both, which the MMA
    // threads' registers afford.)
    return kDqPerWg ? (kWgPieces1 == kWgPieces0 ? task * kWgPieces0 + cb % kWgPieces0
                       : cb < kWgPieces0        ? task * kWgPieces0 + cb
                                                : task * kWgPieces1 + cb - kWgPieces0)
           : kDqBuffers == kDqPieces
               ? task
               : task * ((kDqPieces - cb % kDqBuffers + kDqBuffers - 1) / kDqBuffers) +
                     cb / kDqBuffers;
  }
  // The piece the writer lands j-th in a task: with a buffer a warpgroup the two buffers in
  // turns while both have pieces (0, 2, 1, 3 at 256; 0, 2, 1 at 192), each refilled while the
  // other is read; else column block by column block. (Both warpgroups with as many pieces:
  // one expression, which the writer lane's 24 registers afford.)
  __device__ static constexpr int dq_landing(int j) {
    return !kDqPerWg                   ? j
           : kWgPieces1 == kWgPieces0  ? (j % 2) * kWgPieces0 + j / 2
           : j >= 2 * kWgPieces1       ? j - kWgPieces1
           : j % 2 == 0                ? j / 2
                                       : kWgPieces0 + j / 2;
  }
  // The task's softmax statistics (kBlockM lse rows as log2, then kBlockM D rows): one copy per
  // stage, loaded with the stage's Q and dO.
  static constexpr int kStatsBytes = 2 * kBlockM * 4;
  static constexpr int kOffStats = kOffDq + kDqBuffers * kDqBytes;
  static constexpr int kOffBar = kOffStats + kStages * kStatsBytes;  // a copy a stage
  // The scheduler lane's ring of tasks: kRing slots, each read by the producer and the writer.
  static constexpr int kRing = 8;
  static constexpr int kNumBars = 2 + 2 * kStages + 2 * kDqBars + 2 * kRing + 2 * kOwnDo;
  // The producer hands each stage's task to the MMA warpgroups here, so they never see the
  // schedule (its state stays out of their registers); after the slots, this worker's task
  // count, which thread 0 counts on the scheduler's walk before the roles start.
  static constexpr int kOffTask = kOffBar + kNumBars * 8;
  static constexpr int kOffCount = kOffTask + kStages * 32;
  static constexpr int kOffRing = kOffCount + 16;  // kRing Task slots
  // Only the deterministic backward counts each tile's landed contributions, so only it knows
  // when a dQ sum is final; without it, the convert kernel runs after this one.
  static constexpr bool kConvertDq = kFusedConvert && kDeterministic;
  static_assert(kDqWriters == 1 || (kDqWriters == 2 && !kConvertDq && !kSwapped && kStages == 2),
                "two dQ writers: one a buffer of the one-piece hand-off, warp 2 free of the "
                "converter");
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
  static constexpr int kAlignSlack = kDsStages == 2 && !kSwapped ? 0 : 1024;  // see kDsStages
  static constexpr int kSmemBytes = kConvertDq ? kOffConv + 128 + 2 * kConvChunkBytes + 1024
                                               : kOffRing + kRing * 32 + kAlignSlack;
  static_assert(kSmemBytes <= kSm90MaxSmemBytes,
                "shared memory exceeds what an sm_90 block may use");

  struct Bars : OwnDoBars<kOwnDo != 0> {
    u64 kv_full, kv_empty;
    u64 q_full[kStages], q_empty[kStages];
    u64 dq_full[kDqBars], dq_empty[kDqBars];
    u64 ring_full[kRing], ring_empty[kRing];
  };

  using Task = sched::Task;
  static_assert(sizeof(Task) <= 32, "one 32-byte task slot per stage");

  // ---- roles ----------------------------------------------------------------------------------
  using Scheduler = BwdScheduler<AttnBwdSm90>;
  using Producer = BwdProducer<AttnBwdSm90>;
  using DqWriter = BwdDqWriter<AttnBwdSm90>;
  using DqConverter = BwdDqConverter<AttnBwdSm90>;
  using Mainloop = typename MainloopOf<kSwapped != 0, BwdMainloopSwapped<AttnBwdSm90>,
                                       BwdMainloop<AttnBwdSm90>>::type;
  using Epilogue = BwdEpilogue<AttnBwdSm90>;

  // ---- the kernel entry -----------------------------------------------------------------------
  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k, const TensorMap* tm_v,
                             const TensorMap* tm_do, const BwdParams& p, char* smem_raw) {
    char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
    Bars* bars = reinterpret_cast<Bars*>(smem + kOffBar);
    const int warpgroup = threadIdx.x / 128;
    int* count_slot = reinterpret_cast<int*>(smem + kOffCount);

    if (threadIdx.x == 0) {
      init_barriers(bars, smem);
      const typename Scheduler::Shape shape{p};
      *count_slot = Scheduler::make_walk(p, shape).count();
    }
    __syncthreads();
    const int count = *count_slot;

    if (warpgroup == 0) {
      setmaxnreg_dec<kProducerRegs>();
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      if (warp == kProducerWarp && lane == 0) {
        Producer::run(tm_q, tm_k, tm_v, tm_do, p, smem, bars, count);
      }
      if (warp == kWriterWarp && lane == 0) DqWriter::template run<0>(p, smem, bars, count);
      if constexpr (kDqWriters == 2) {
        if (warp == kWriterWarp2 && lane == 0) DqWriter::template run<1>(p, smem, bars, count);
      }
      if constexpr (kConvertDq) {
        if (warp >= kConverterWarp0) DqConverter::run(p, smem, threadIdx.x - 32 * kConverterWarp0);
      }
      if (warp == kSchedulerWarp && lane == kSchedulerLane) Scheduler::run(p, smem, bars, count);
    } else {
      setmaxnreg_inc<kMmaRegs>();
      // The MMA loop runs from an opaque first index: with a literal 0 the compiler turned the
      // stage index (i - begin) % kStages into i & 1, and ptxas then recomputed the stages'
      // wgmma descriptors inside the task loop (docs/design.md, `scheduler-lane`).
      int begin;
      asm volatile("mov.b32 %0, 0;" : "=r"(begin));
      Mainloop::consume(p, smem, bars, begin, begin + count, warpgroup - 1, threadIdx.x - 128);
    }
  }

  // The mbarriers (Bars, and the converter's at kOffConv), by thread 0 before the roles start.
  __device__ static __forceinline__ void init_barriers(Bars* bars, char* smem) {
    mbarrier_init(&bars->kv_full, 1);
    mbarrier_init(&bars->kv_empty, 2);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bars->q_full[s], 1);
      // Every MMA thread arrives: each has read the stage's task slot and the arrive releases
      // its own read before the producer rewrites the slot.
      mbarrier_init(&bars->q_empty[s], kMmaThreads);
      // Swapped: each piece is one warpgroup's stores.
      mbarrier_init(&bars->dq_full[s], kSwapped ? 128 : kMmaThreads);
      mbarrier_init(&bars->dq_empty[s], 1);
    }
    for (int s = kStages; s < kDqBars; ++s) {  // swapped, a buffer a piece: one warpgroup's
      mbarrier_init(&bars->dq_full[s], 128);
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
    if constexpr (kOwnDo != 0) {
      mbarrier_init(&bars->do_full, 1);
      mbarrier_init(&bars->do_empty, kMmaThreads);  // every MMA thread, as q_empty
    }
    fence_barrier_init();
  }
};

}  // namespace dashgen
