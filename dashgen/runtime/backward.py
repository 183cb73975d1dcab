"""The backward call: dq, dk, dv from dO and the forward's tensors, on PyTorch's current stream.

A signature's launches are prepared once (`BackwardLaunch`); the eager autograd node builds a
`BackwardCall` during the forward, so the backward itself only allocates and launches.
"""
from __future__ import annotations

import torch

from ..caches import Memo
from ..schedule.builders import Tiling
from ..codegen.variants import (AUX_THREADS, PREP_ROWS_PER_BLOCK, THREADS, TRACE_COLUMNS,
                                BwdParams, ConvertParams, PrepParams, softcap_fields)
from . import launch
from .launch import addresses
from .device import DTYPE_NAMES, allocation_stream, kernels, sm_count, stream
from .forward import descriptor
from . import watchdog
from .plans import device_deal, device_tables, trace_offsets
from .select import NO_WINDOW, Overrides, Selection, plan, window_arg
from .workspace import WorkspaceLayout, allocator


class BackwardMaps:
    """The descriptors a backward's main kernel reads, kept by address (q, k and v in one
    lookup, dO in another): a prepared launch's shapes and dtype are fixed and the tensors it
    is handed contiguous, so their addresses decide the descriptors. The fixed-length launches
    and a pack's (runtime.varlen.PackBackwardLaunch) keep theirs so."""

    def __init__(self, block_m: int, block_n: int):
        self.block_m, self.block_n = block_m, block_n
        self._maps = Memo(None, max_entries=512)
        self._do_maps = Memo(None, max_entries=512)

    def qkv_maps(self, q, k, v) -> tuple:
        return self._maps.get((q.data_ptr(), k.data_ptr(), v.data_ptr()), lambda: (
            descriptor(q, self.block_m), descriptor(k, self.block_n),
            descriptor(v, self.block_n)))

    def do_map(self, do):
        return self._do_maps.get(do.data_ptr(), lambda: descriptor(do, self.block_m))


class BackwardLaunch(BackwardMaps):
    """Everything a backward call needs that its selection fixes: the workspace layout, the
    prepared launches and, for a schedule file only, its task table on the GPU (a named
    schedule's policy is compiled into the kernel: nothing of it is built per shape). Built once
    per signature, so a call only allocates, fills three parameter blocks and launches."""

    def __init__(self, sel: Selection, device: torch.device):
        p = self.problem = sel.problem
        variant = self.variant = sel.backward
        # (allocation stream, tensors) of every table the kernels read: see BackwardCall's end.
        self.tables = []
        tasks_ptr = offsets_ptr = 0
        if sel.table is not None:
            self.tasks, self.offsets, tables_stream = device_tables(sel.table, device)
            self.tables.append((tables_stream, (self.tasks, self.offsets)))
            tasks_ptr, offsets_ptr = self.tasks.data_ptr(), self.offsets.data_ptr()
        self.num_tasks = 0
        if variant.trace:
            # A traced call's rows: each worker's at its offset in the IR's order.
            offsets = trace_offsets(p, sel.table or sel.schedule, sel.num_workers)
            self.num_tasks = offsets[-1]
            if sel.table is None:
                self.offsets = torch.tensor(offsets, dtype=torch.int32).to(device)
                self.tables.append((allocation_stream(device), (self.offsets,)))
                offsets_ptr = self.offsets.data_ptr()
        # The deterministic backward's first dQ writer of a tile stores instead of adding
        # (docs/design.md, `first-dq-store`), so the preprocess kernel zeroes the accumulator only
        # for the non-deterministic one, and the convert kernel zeroes the tiles nobody wrote.
        self.first_dq_store = variant.deterministic
        # fused_convert: the main kernel writes dQ as each tile's sum becomes final. A query
        # tile no KV tile reaches (causal or a window, more query rows than keys) gets no
        # contribution: then the convert kernel still runs, and writes its zeros or the same
        # bits again.
        self.converts_dq = variant.fused_convert
        self.runs_convert_q = not self.converts_dq or Tiling(p).count(0) == 0
        self.layout = WorkspaceLayout(p)
        loaded = kernels(variant, device)
        padded_m, padded_n = p.num_m_blocks * p.block_m, p.num_n_blocks * p.block_n
        rows = PREP_ROWS_PER_BLOCK
        self.preprocess = launch.Launcher(loaded.preprocess,
                                          (-(-padded_m // rows), p.heads_q, p.batch),
                                          AUX_THREADS, 0)
        self.main = launch.Launcher(loaded.main, sel.num_workers, THREADS, loaded.smem_bytes)
        self.convert_q = launch.Launcher(loaded.convert,
                                         (-(-p.seqlen_q // rows), p.heads_q, p.batch),
                                         AUX_THREADS, 0)
        self.convert_kv = launch.Launcher(loaded.convert,
                                          (-(-p.seqlen_k // rows), p.heads_kv, p.batch),
                                          AUX_THREADS, 0)
        # The workspace's parts as byte offsets from its start.
        self.part_bytes = tuple(4 * offset for offset in self.layout.offsets)
        self.zeroed_bytes = 4 * self.layout.zeroed_offset
        # The parameter blocks with what the signature fixes; a BackwardCall copies them and
        # fills in its pointers. Every tensor is contiguous, so its shape gives its row stride.
        q_stride, k_stride = p.heads_q * p.head_dim, p.heads_kv * p.head_dim
        # O and dO, which the preprocess reads, are V's width (MLA: 128 under 192).
        o_stride = p.heads_q * variant.head_dim_v
        self.prep_template = PrepParams(
            zero_vec4s=(self.layout.floats - self.layout.zeroed_offset) // 4, batch=p.batch,
            heads=p.heads_q, seqlen=p.seqlen_q, row_stride=o_stride, padded_rows=padded_m,
            zero_dq=not self.first_dq_store)
        self.params_template = BwdParams(
            tasks=tasks_ptr, worker_offsets=offsets_ptr,
            stall=watchdog.record(device, sel.num_workers), batch=p.batch, heads_q=p.heads_q,
            heads_kv=p.heads_kv, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
            q_row_stride=q_stride, k_row_stride=k_stride, num_m_blocks=p.num_m_blocks,
            num_n_blocks=p.num_n_blocks, watchdog_ms=watchdog.timeout_ms())
        # A window: its bounds, and the keys no query row sees (a run from key 0 where the
        # window's left bound leaves them behind every row): no task writes their dK/dV, which
        # the call zeroes (under GQA the zeroed sums convert to zeros).
        self.unseen_keys = 0
        if variant.window:
            left, right = p.mask.kernel_bounds()
            self.params_template.window_left, self.params_template.window_right = left, right
            self.unseen_keys = max(0, min(p.seqlen_k, p.seqlen_k - p.seqlen_q - left))
        if variant.listed:
            deal, deal_stream = device_deal(p, sel.schedule, sel.num_workers, device)
            self.tables.append((deal_stream, (deal,)))
            self.params_template.unit_deal = deal.data_ptr()
        # The backward leaves dQ's sums in the accum_col layout; GQA's dK/dV sums row-major.
        self.convert_q_template = ConvertParams(
            batch=p.batch, heads=p.heads_q, seqlen=p.seqlen_q, row_stride=q_stride,
            padded_rows=padded_m, swizzled=True, block_m=p.block_m)
        self.convert_kv_template = ConvertParams(
            batch=p.batch, heads=p.heads_kv, seqlen=p.seqlen_k, row_stride=k_stride,
            padded_rows=padded_n, swizzled=False, block_m=p.block_n)
        BackwardMaps.__init__(self, p.block_m, p.block_n)

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, tables in self.tables for t in tables)


# Prepared backward launches by selection (schedule files' tables on the GPU among them): at
# most 256, and at most 1 GiB of tables.
backward_launch = Memo(BackwardLaunch, max_entries=256, max_bytes=1 << 30,
                       size=BackwardLaunch.device_bytes)


class BackwardCall:
    """A backward with everything but dO and its own buffers decided: the prepared launch of
    its signature, the parameter blocks filled with the forward's pointers, the tensor maps of
    q, k and v. The eager autograd node builds it during the forward, on the caller's thread,
    while the GPU runs the forward. Autograd runs the backward on its device thread, which wakes
    cold for each backward and runs Python 2-4x slower than the caller's thread, and the GPU
    waits on that thread until the first launch (docs/design.md, `backward-prepared-by-forward`): there a
    call only allocates, writes dO's and the buffers' addresses into the blocks, and launches.

    q, k, v, o and lse are contiguous; the call reads them through their addresses, so it holds
    no reference to them: `serves` tells whether a set of tensors is the one it was built for.
    Its parameter blocks are rewritten by each call: one call at a time. `launch` is the
    prepared launch of these options on q's device where the caller holds it (the eager node:
    its signature's); else it is looked up (runtime.select.plan, then `backward_launch`)."""

    def __init__(self, q, k, v, o, lse, *, causal: bool, softmax_scale: float,
                 deterministic: bool, schedule: str, num_workers: int | None,
                 trace: bool = False, overrides: Overrides = Overrides(),
                 launch: BackwardLaunch | None = None, softcap: float = 0.0,
                 window: tuple[int, int] = NO_WINDOW):
        dev = self.device = q.device
        if launch is None:
            launch = backward_launch(
                plan(tuple(q.shape), tuple(k.shape), DTYPE_NAMES[q.dtype], bool(causal),
                     bool(deterministic), bool(trace), schedule, num_workers, sm_count(dev),
                     overrides, *window_arg(window)).selection.soft_capped(
                         bool(softcap), overrides.dq_writers == 2).with_head_dim_v(
                             v.shape[-1]), dev)
        bl = self.bl = launch
        self.device_index = dev.index or 0
        self.pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
        self.q_shape, self.k_shape, self.v_shape, self.dtype = q.shape, k.shape, v.shape, q.dtype
        self.trace = trace
        prep = self.prep = PrepParams.from_buffer_copy(bl.prep_template)
        prep.o = self.pointers[3]
        prep.d_scale = softmax_scale
        prep.lse = self.pointers[4]
        params = self.params = BwdParams.from_buffer_copy(bl.params_template)
        params.q, params.k, params.v, _, params.lse = self.pointers
        params.softmax_scale = softmax_scale
        if softcap:  # per call: an uncapped kernel never reads them, its block keeps zeros
            for name, value in softcap_fields(softmax_scale, softcap).items():
                setattr(params, name, value)
        self.convert_q = ConvertParams.from_buffer_copy(bl.convert_q_template)
        self.convert_kv = ([ConvertParams.from_buffer_copy(bl.convert_kv_template)
                            for _ in range(2)] if bl.problem.gqa else [])
        self.prep_args = addresses(prep)
        self.convert_q_args = addresses(self.convert_q)
        self.convert_kv_args = [addresses(c) for c in self.convert_kv]
        # The descriptors stay alive with the call; dO's slot is filled per call.
        self.maps = bl.qkv_maps(q, k, v)
        self.main_args = addresses(*(int(m.getPtr()) for m in self.maps), 0, params)

    def serves(self, q, k, v, o, lse) -> bool:
        """Whether these are the tensors the call was built for (autograd may hand the backward
        other ones: saved-tensor hooks that offload or recompute them)."""
        return (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                lse.data_ptr()) == self.pointers

    def __call__(self, do):
        """dq, dk, dv (and the trace buffer if built with `trace`); do is contiguous, shaped like
        q. The preprocess kernel is launched first, before the gradients are allocated: until it
        is, the GPU waits on this code."""
        bl, dev = self.bl, self.device
        p = bl.problem
        watchdog.check()
        launch.make_current(self.device_index)
        strm = stream(dev)
        empty = allocator()
        workspace = empty((bl.layout.floats,), torch.float32, dev)
        base = workspace.data_ptr()
        dq_accum, dpsum, stats, dk_accum, dv_accum, dq_counters, dkv_counters = (
            base + offset for offset in bl.part_bytes)
        prep, params = self.prep, self.params
        do_ptr = do.data_ptr()
        prep.dout, prep.dpsum, prep.dq_accum, prep.zero, prep.stats = (
            do_ptr, dpsum, dq_accum, base + bl.zeroed_bytes, stats)
        bl.preprocess(strm, self.prep_args)

        # Until the main kernel is launched the GPU may be waiting on this code (the preprocess
        # is short): dQ, and dK/dV under GQA, are allocated after it, for the convert kernels,
        # unless the main kernel writes dQ itself.
        gqa = p.gqa
        dk, dv = ((None, None) if gqa else
                  (empty(self.k_shape, self.dtype, dev), empty(self.v_shape, self.dtype, dev)))
        dq = empty(self.q_shape, self.dtype, dev) if bl.converts_dq else None
        trace_buf = (torch.full((bl.num_tasks, TRACE_COLUMNS), -1, dtype=torch.int32,
                                device=dev) if self.trace else None)
        params.dout, params.dpsum, params.dq_accum, params.stats = do_ptr, dpsum, dq_accum, stats
        params.dq_counters = dq_counters
        if gqa:
            params.dk_accum, params.dv_accum, params.dkv_counters = (dk_accum, dv_accum,
                                                                     dkv_counters)
        else:
            params.dk, params.dv = dk.data_ptr(), dv.data_ptr()
        if dq is not None:
            params.dq = dq.data_ptr()
        if trace_buf is not None:
            params.trace = trace_buf.data_ptr()
        do_map = bl.do_map(do)  # a local reference keeps the descriptor through the launch
        self.main_args[3] = int(do_map.getPtr())
        bl.main(strm, self.main_args)

        if dq is None:
            dq = empty(self.q_shape, self.dtype, dev)
        if gqa:
            dk, dv = (empty(self.k_shape, self.dtype, dev), empty(self.v_shape, self.dtype, dev))
        if bl.runs_convert_q:
            convert = self.convert_q
            convert.src, convert.dst = dq_accum, dq.data_ptr()
            convert.counters = dq_counters if bl.first_dq_store else 0
            bl.convert_q(strm, self.convert_q_args)
        if gqa:
            for convert, args, src, dst in zip(self.convert_kv, self.convert_kv_args,
                                               (dk_accum, dv_accum), (dk, dv)):
                convert.src, convert.dst = src, dst.data_ptr()
                bl.convert_kv(strm, args)
        elif bl.unseen_keys:
            dk[:, :bl.unseen_keys].zero_()
            dv[:, :bl.unseen_keys].zero_()
        for tables_stream, tables in bl.tables:
            if strm != tables_stream:
                # These tables were allocated on another stream: should the cache drop them
                # while these kernels run, that stream could reuse their memory too early.
                current = torch.cuda.current_stream(dev)
                for table in tables:
                    table.record_stream(current)
        if self.trace:
            return dq, dk, dv, trace_buf
        return dq, dk, dv


def backward(do, q, k, v, o, lse, *, causal: bool, softmax_scale: float, deterministic: bool,
             schedule: str, num_workers: int | None, trace: bool = False,
             overrides: Overrides = Overrides(), softcap: float = 0.0,
             window: tuple[int, int] = NO_WINDOW):
    """dq, dk, dv (and the trace buffer if `trace`: a row of TRACE_COLUMNS int32 per task, in
    the IR's order). q, k, v, do and o are contiguous; do and o are q's shape with v's head_dim.
    softcap and window: the forward's (0 uncapped; (-1, -1) no window)."""
    return BackwardCall(q, k, v, o, lse, causal=causal, softmax_scale=softmax_scale,
                        deterministic=deterministic, schedule=schedule, num_workers=num_workers,
                        trace=trace, overrides=overrides, softcap=softcap, window=window)(do)
