// dashgen/attn/bwd.cuh: the persistent attention backward. Worker (CTA) w runs the tasks of its
// schedule program in order; each task adds its dQ partial into the fp32 accumulator only when the
// dQ tile's counter equals its dq_rank, so the summation order, and with it every bit of dQ, is
// the schedule's. Under GQA the dK/dV of the query heads of a group are summed the same way.
#pragma once
#include "dashgen/attn/fragments.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/tile_io.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/counter.cuh"
#include "dashgen/ptx/timer.cuh"

namespace dashgen {

template <class T, int kHeadDim, int kBlockM, int kBlockN, bool kCausal, bool kDeterministic,
          bool kGqa, bool kTrace>
struct AttnBwd {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kBlockM == 16 * kWarps && kBlockN == 16 * kWarps, "one 16-row strip per warp");
  static_assert(kHeadDim % 16 == 0, "head_dim is a multiple of 16");
  // 8 elements of padding per row of the 16-bit tiles spread fragment reads over the banks.
  static constexpr int kLdT = kHeadDim + 8;
  static constexpr int kLdP = kBlockN + 8;

  // Shared memory: fp32 buffers first (the bulk reduce reads dQ/dK/dV tiles densely packed).
  static constexpr int kOffDq = 0;
  static constexpr int kOffDk = kOffDq + kBlockM * kHeadDim * 4;
  static constexpr int kOffDv = kOffDk + kBlockN * kHeadDim * 4;
  static constexpr int kOffLse = kOffDv + kBlockN * kHeadDim * 4;
  static constexpr int kOffDp = kOffLse + kBlockM * 4;
  static constexpr int kOffQ = kOffDp + kBlockM * 4;
  static constexpr int kOffDo = kOffQ + kBlockM * kLdT * 2;
  static constexpr int kOffK = kOffDo + kBlockM * kLdT * 2;
  static constexpr int kOffV = kOffK + kBlockN * kLdT * 2;
  static constexpr int kOffP = kOffV + kBlockN * kLdT * 2;
  static constexpr int kOffDs = kOffP + kBlockM * kLdP * 2;
  static constexpr int kSmemBytes = kOffDs + kBlockM * kLdP * 2;

  __device__ static void run(const BwdParams& p, char* smem) {
    float* s_dq = reinterpret_cast<float*>(smem + kOffDq);
    float* s_dk = reinterpret_cast<float*>(smem + kOffDk);
    float* s_dv = reinterpret_cast<float*>(smem + kOffDv);
    float* s_lse = reinterpret_cast<float*>(smem + kOffLse);
    float* s_dpsum = reinterpret_cast<float*>(smem + kOffDp);
    T* s_q = reinterpret_cast<T*>(smem + kOffQ);
    T* s_do = reinterpret_cast<T*>(smem + kOffDo);
    T* s_k = reinterpret_cast<T*>(smem + kOffK);
    T* s_v = reinterpret_cast<T*>(smem + kOffV);
    T* s_p = reinterpret_cast<T*>(smem + kOffP);
    T* s_ds = reinterpret_cast<T*>(smem + kOffDs);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int begin = p.worker_offsets[blockIdx.x], end = p.worker_offsets[blockIdx.x + 1];
    const int group = p.heads_q / p.heads_kv;
    const T* q = static_cast<const T*>(p.q);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    const T* dout = static_cast<const T*>(p.dout);

    for (int i = begin; i < end; ++i) {
      const TaskEntry task = p.tasks[i];
      const int b = task.batch_head >> 16, h = task.batch_head & 0xffff;
      const int n = task.n_m >> 16, m = task.n_m & 0xffff;
      const int hk = h / group;
      // A segment is the run of one KV tile; dK/dV stay in shared memory across it.
      const bool seg_start = i == begin || p.tasks[i - 1].batch_head != task.batch_head ||
                             (p.tasks[i - 1].n_m >> 16) != n;
      const bool seg_end = i + 1 == end || p.tasks[i + 1].batch_head != task.batch_head ||
                           (p.tasks[i + 1].n_m >> 16) != n;
      const i64 kv_base = (static_cast<i64>(b) * p.seqlen_k * p.heads_kv + hk) * kHeadDim;
      const i64 q_base = (static_cast<i64>(b) * p.seqlen_q * p.heads_q + h) * kHeadDim;

      if (seg_start) {
        load_rows<T, kBlockN, kHeadDim, kLdT, kThreads>(s_k, k + kv_base, n * kBlockN, p.seqlen_k,
                                                        p.k_row_stride, tid);
        load_rows<T, kBlockN, kHeadDim, kLdT, kThreads>(s_v, v + kv_base, n * kBlockN, p.seqlen_k,
                                                        p.k_row_stride, tid);
        zero_floats<kBlockN * kHeadDim, kThreads>(s_dk, tid);
        zero_floats<kBlockN * kHeadDim, kThreads>(s_dv, tid);
      }
      load_rows<T, kBlockM, kHeadDim, kLdT, kThreads>(s_q, q + q_base, m * kBlockM, p.seqlen_q,
                                                      p.q_row_stride, tid);
      load_rows<T, kBlockM, kHeadDim, kLdT, kThreads>(s_do, dout + q_base, m * kBlockM, p.seqlen_q,
                                                      p.q_row_stride, tid);
      for (int r = tid; r < kBlockM; r += kThreads) {
        const int row = m * kBlockM + r;
        const i64 idx = (static_cast<i64>(b) * p.heads_q + h) * p.seqlen_q + row;
        s_lse[r] = lse_log2(row < p.seqlen_q ? p.lse[idx] : -DASHGEN_INF);
        s_dpsum[r] = row < p.seqlen_q ? p.dpsum[idx] : 0.f;
      }
      __syncthreads();

      const int r0 = 16 * warp;
      {
        float s[kBlockN / 8][4], dp[kBlockN / 8][4];
        zero_acc(s);
        zero_acc(dp);
        warp_strip_mma<T, kBlockN, kHeadDim>(s, row_major(s_q, kLdT), col_major(s_k, kLdT), r0, lane);
        warp_strip_mma<T, kBlockN, kHeadDim>(dp, row_major(s_do, kLdT), col_major(s_v, kLdT), r0, lane);
        const float scale_log2 = p.softmax_scale * kLog2e;
        const int causal_offset = p.seqlen_k - p.seqlen_q;
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = r0 + g + 8 * (e / 2), c = 8 * j + 2 * t + (e % 2);
            const int row = m * kBlockM + r, key = n * kBlockN + c;
            const bool masked = key >= p.seqlen_k || (kCausal && key > row + causal_offset);
            const float pv = masked ? 0.f : exp2f(s[j][e] * scale_log2 - s_lse[r]);
            const float ds = pv * (dp[j][e] - s_dpsum[r]) * p.softmax_scale;
            s_p[r * kLdP + c] = Element<T>::from_float(pv);
            s_ds[r * kLdP + c] = Element<T>::from_float(ds);
          }
        }
      }
      __syncthreads();

      {
        // Warp w owns KV rows 16w..16w+15 of dK/dV and Q rows 16w..16w+15 of dQ.
        float acc[kHeadDim / 8][4];
        zero_acc(acc);
        warp_strip_mma<T, kHeadDim, kBlockM>(acc, col_major(s_p, kLdP), row_major(s_do, kLdT), r0, lane);
        for_each_acc(acc, lane, [&](int r, int c, float x) { s_dv[(r0 + r) * kHeadDim + c] += x; });
        zero_acc(acc);
        warp_strip_mma<T, kHeadDim, kBlockM>(acc, col_major(s_ds, kLdP), row_major(s_q, kLdT), r0, lane);
        for_each_acc(acc, lane, [&](int r, int c, float x) { s_dk[(r0 + r) * kHeadDim + c] += x; });
        zero_acc(acc);
        warp_strip_mma<T, kHeadDim, kBlockN>(acc, row_major(s_ds, kLdP), row_major(s_k, kLdT), r0, lane);
        for_each_acc(acc, lane, [&](int r, int c, float x) { s_dq[(r0 + r) * kHeadDim + c] = x; });
      }
      // The bulk reduce reads s_dq (and s_dk/s_dv below) through the async proxy.
      fence_proxy_async_shared();
      __syncthreads();

      if (tid == 0) {
        const int tile = (b * p.heads_q + h) * p.num_m_blocks + m;
        float* dst = p.dq_accum + (static_cast<i64>(b * p.heads_q + h) * p.num_m_blocks * kBlockM +
                                   static_cast<i64>(m) * kBlockM) * kHeadDim;
        ordered_add(dst, s_dq, kBlockM * kHeadDim * 4, p.dq_counters + tile, task.dq_rank,
                    kTrace ? p.trace + static_cast<i64>(i) * kTraceColumns : nullptr);
        if (kTrace) {
          i32* row = p.trace + static_cast<i64>(i) * kTraceColumns;
          row[0] = b; row[1] = h; row[2] = n; row[3] = m; row[4] = task.dq_rank;
        }
      }
      __syncthreads();

      if (seg_end) {
        if constexpr (kGqa) {
          if (tid == 0) {
            const int tile = (b * p.heads_kv + hk) * p.num_n_blocks + n;
            const i64 off = (static_cast<i64>(b * p.heads_kv + hk) * p.num_n_blocks * kBlockN +
                             static_cast<i64>(n) * kBlockN) * kHeadDim;
            ordered_add2(p.dk_accum + off, s_dk, p.dv_accum + off, s_dv, kBlockN * kHeadDim * 4,
                         p.dkv_counters + tile, task.dkv_rank);
          }
        } else {
          T* dk = static_cast<T*>(p.dk);
          T* dv = static_cast<T*>(p.dv);
          store_rows_from_f32<T, kBlockN, kHeadDim, kThreads>(dk + kv_base, s_dk, n * kBlockN, p.seqlen_k,
                                                              p.k_row_stride, tid);
          store_rows_from_f32<T, kBlockN, kHeadDim, kThreads>(dv + kv_base, s_dv, n * kBlockN, p.seqlen_k,
                                                              p.k_row_stride, tid);
        }
        __syncthreads();
      }
    }
  }

  // One thread: add `bytes` of fp32 from shared to global memory in the order the counter gives.
  // The counter is released only after the add has landed in global memory (wait_group 0, not
  // .read): the next writer's add must see ours, or the sum order is not the schedule's.
  __device__ static void ordered_add(float* dst, const float* src, u32 bytes, u32* counter,
                                     int rank, i32* trace_row) {
    if (trace_row != nullptr) trace_stamp(trace_row, kTraceReady);
    if (kDeterministic) {
      wait_counter_equals(counter, static_cast<u32>(rank));
      fence_proxy_async_global();  // the acquired counter orders our async-proxy add after theirs
    }
    if (trace_row != nullptr) trace_stamp(trace_row, kTraceAcquired);
    bulk_reduce_add_f32(dst, src, bytes);
    bulk_commit_group();
    bulk_wait_group<0>();
    if (trace_row != nullptr) trace_stamp(trace_row, kTraceLanded);
    if (kDeterministic || trace_row != nullptr) {
      fence_proxy_async_global();
      __threadfence();
      // The returned count is the number of adds that landed before ours: the trace records it.
      const u32 seen = atomic_fetch_add_relaxed_gpu(counter, 1u);
      if (trace_row != nullptr) trace_row[5] = static_cast<i32>(seen);
    }
  }

  __device__ static void ordered_add2(float* dst0, const float* src0, float* dst1, const float* src1,
                                      u32 bytes, u32* counter, int rank) {
    if (kDeterministic) {
      wait_counter_equals(counter, static_cast<u32>(rank));
      fence_proxy_async_global();
    }
    bulk_reduce_add_f32(dst0, src0, bytes);
    bulk_reduce_add_f32(dst1, src1, bytes);
    bulk_commit_group();
    bulk_wait_group<0>();
    if (kDeterministic) {
      fence_proxy_async_global();
      __threadfence();
      atomic_fetch_add_relaxed_gpu(counter, 1u);
    }
  }
};

}  // namespace dashgen
