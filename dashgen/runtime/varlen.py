"""Packed batches: sequences of their own lengths (cu_seqlens) in one forward and one backward,
on PyTorch's current stream, with no host synchronization: the lengths stay on the GPU. The host
knows the totals, the number of sequences and the longest ones (max_seqlen_q/k), which size the
grids and the buffers; the backward's deal over the pack is computed on the GPU by its plan
kernel (templates/include/dashgen/attn/pack_plan.cuh).

In every buffer a sequence is a batch of one (params.cuh, PackedRows): its lse and D rows a
(heads_q, seqlen) block from heads_q * cu_seqlens_q[b], its tiles a (heads, tiles) block. So
the kernels run the fixed-length code on it, and its bits are the ones it has alone.
"""
from __future__ import annotations

import ctypes
import math

import torch

from ..caches import memo
from ..codegen.variants import (AUX_THREADS, PREP_ROWS_PER_BLOCK, THREADS, BackwardVariant,
                                BwdParams, ConvertParams, ForwardVariant, FwdParams,
                                FwdWindowParams, PrepParams, kernel_head_dim, softcap_fields)
from . import launch, pack_faults, watchdog
from .backward import BackwardMaps
from .device import DTYPE_NAMES, kernels, stream
from .forward import forward_launch
from .launch import addresses
from .select import NO_WINDOW, mask_of, pack_selection
from .workspace import allocator

PLAN_THREADS = 512  # AttnPackPlan::kThreads


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pack_tiles(total: int, batch: int, block: int) -> int:
    """Tiles of `block` rows per head that a pack's per-tile buffers hold (PackedRows)."""
    return total // block + batch


def plan_words(batch: int, max_units: int, q_tiles: int = 0, k_tiles: int = 0) -> int:
    """AttnPackPlan's words: the header, the orders and its scratch, then the tile maps of a
    head's q_tiles packed query tiles and k_tiles key tiles (params.cuh, kPlanHeader)."""
    return 3 + 4 * batch + 6 * max_units + q_tiles + k_tiles


class PackForwardCall:
    """Everything a packed forward at one signature fixes (the packed tokens, heads and head_dim
    of q and k, the number of sequences, the longest lengths, dtype, mask, scale, device): its
    prepared launch (runtime.forward.forward_launch, the fixed-length forward's, on the pack's
    grid) and its parameter block with the sizes and scale filled in, so a call writes the
    addresses and launches, as the fixed-length ForwardCall does."""

    def __init__(self, variant: ForwardVariant, q_shape: tuple, k_shape: tuple, batch: int,
                 max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                 device: torch.device, softcap: float = 0.0,
                 window: tuple[int, int] = NO_WINDOW):
        total_q, heads_q, _ = q_shape
        total_k, heads_kv = k_shape[:2]
        self.lse_shape = (heads_q * total_q,)
        self.o_shape = (total_q, heads_q, variant.head_dim_v)  # V's width (MLA: 128 under 192)
        self.device_index = device.index or 0
        self.launch = None
        no_rows = total_q == 0 or max_seqlen_q == 0
        # No keys in any sequence: every row sees none (o = 0, lse = -inf), no kernel either.
        self.no_keys = not no_rows and total_k == 0
        if no_rows or self.no_keys:
            return
        # The variant's tiles, as the dense forward takes them (FORWARD_TILES: the key tile is
        # narrower past head_dim 128).
        grid = (_cdiv(max_seqlen_q, variant.block_m), heads_q, batch)
        self.launch = forward_launch(variant, tuple(q_shape), grid, device)
        block = FwdWindowParams if variant.window else FwdParams
        self.template = block(batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                              seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k,
                              softmax_scale=float(softmax_scale),
                              pack_fault=pack_faults.record(device), total_q=total_q,
                              total_k=total_k,
                              **softcap_fields(float(softmax_scale), float(softcap)))
        if variant.window:
            self.template.window_left, self.template.window_right = mask_of(
                False, window).kernel_bounds()

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k):
        pack_faults.check()
        empty = allocator()
        o = empty(self.o_shape, q.dtype, q.device)
        lse = empty(self.lse_shape, torch.float32, q.device)
        if self.launch is None:
            return (o.zero_(), lse.fill_(-math.inf)) if self.no_keys else (o, lse)
        params = type(self.template).from_buffer_copy(self.template)
        params.q, params.k, params.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        params.o, params.lse = o.data_ptr(), lse.data_ptr()
        params.q_row_stride, params.k_row_stride = q.stride(0), k.stride(0)
        params.o_row_stride = o.stride(0)
        params.cu_seqlens_q, params.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        addresses = self.launch.map_addresses(q, k, v) + [ctypes.addressof(params)]
        launch.make_current(self.device_index)
        self.launch.launcher(stream(q.device), addresses)
        return o, lse


@memo(max_entries=256)
def pack_forward_call(variant: ForwardVariant, q_shape: torch.Size, k_shape: torch.Size,
                      batch: int, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                      device: torch.device, softcap: float = 0.0,
                      window: tuple[int, int] = NO_WINDOW) -> PackForwardCall:
    return PackForwardCall(variant, q_shape, k_shape, batch, max_seqlen_q, max_seqlen_k,
                           softmax_scale, device, softcap, window)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
            causal: bool, softmax_scale: float, softcap: float = 0.0,
            window: tuple[int, int] = NO_WINDOW):
    """o (total_q, heads_q, v's head_dim) and lse (heads_q * total_q floats, sequence b's
    (heads_q, seqlen) block from heads_q * cu_seqlens_q[b]); q, k, v contiguous. Through the
    memo of prepared calls (dashgen.attention_varlen's eager calls keep theirs)."""
    # The forward is the same for every schedule and mode.
    window = tuple(window)
    selection = pack_selection(DTYPE_NAMES[q.dtype], q.shape[2], bool(causal), "auto", True,
                               False, window != NO_WINDOW).soft_capped(
                                   bool(softcap)).with_head_dim_v(v.shape[-1])
    return pack_forward_call(selection.forward, q.shape, k.shape, cu_seqlens_q.numel() - 1,
                             max_seqlen_q, max_seqlen_k, float(softmax_scale), q.device,
                             float(softcap), window)(
        q, k, v, cu_seqlens_q, cu_seqlens_k)


class PackWorkspace:
    """The packed backward's scratch in words, each part on a 16-byte boundary: the fp32 dQ
    sums, D, the staged statistics, the plan, then what the preprocess zeroes: GQA's fp32 dK/dV
    sums and the tile counters."""

    PARTS = ("dq_accum", "dpsum", "stats", "plan", "dk_accum", "dv_accum", "dq_counters",
             "dkv_counters")

    def __init__(self, batch, total_q, total_k, heads_q, heads_kv, head_dim, block_m, block_n,
                 gqa):
        head_dim = kernel_head_dim(head_dim)  # the fp32 sums have the kernel's columns
        tq, tk = pack_tiles(total_q, batch, block_m), pack_tiles(total_k, batch, block_n)
        self.max_units = pack_tiles(total_k, batch, block_n)
        self.q_tiles, self.k_tiles = tq, tk
        # Where the plan's tile maps start (AttnPackPlan::map_offset), in words.
        self.map_words = plan_words(batch, self.max_units)
        kv = heads_kv * tk * block_n * head_dim if gqa else 0
        sizes = [heads_q * tq * block_m * head_dim, heads_q * total_q,
                 heads_q * tq * 2 * block_m,
                 plan_words(batch, self.max_units, tq, tk), kv, kv, heads_q * tq,
                 heads_kv * tk if gqa else 0]
        sizes = [_cdiv(s, 4) * 4 for s in sizes]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.words = sum(sizes)
        self.zeroed = self.offsets[self.PARTS.index("dk_accum")]


class PackBackwardLaunch(BackwardMaps):
    """What a packed backward's sizes fix but for the longest lengths and the scale (the packed
    tokens, heads and head_dim of q and k, the number of sequences, the variant and mode, the
    workers, the device): the workspace layout, the prepared launches of the plan, preprocess,
    main and convert kernels on the pack's grids, their parameter blocks with those sizes and
    the watchdog's and offsets' records, and the descriptors of the tensors it has seen. The
    packs of a training loop, whose longest lengths vary, share one."""

    def __init__(self, variant: BackwardVariant, q_shape: tuple, k_shape: tuple, batch: int,
                 deterministic: bool, workers: int, device: torch.device):
        total_q, heads_q, head_dim = q_shape
        total_k, heads_kv = k_shape[:2]
        self.device, self.device_index = device, device.index or 0
        self.gqa = gqa = heads_q != heads_kv
        self.deterministic = deterministic
        self.empty = total_q == 0 or total_k == 0
        if self.empty:
            return
        bm, bn = variant.block_m, variant.block_n
        loaded = kernels(variant, device)
        layout = self.layout = PackWorkspace(batch, total_q, total_k, heads_q, heads_kv,
                                             head_dim, bm, bn, gqa)
        # The workspace's parts as byte offsets from its start; the tile maps the plan kernel
        # writes after its orders as byte offsets from the plan's.
        self.part_bytes = tuple(4 * offset for offset in layout.offsets)
        self.zeroed_bytes = 4 * layout.zeroed
        self.map_q_bytes = 4 * layout.map_words
        self.map_k_bytes = self.map_q_bytes + 4 * layout.q_tiles
        # The preprocess and converts walk the pack's tiles (PackedTile), through the tile maps:
        # their grids follow the packed tokens.
        q_blocks = layout.q_tiles * bm // PREP_ROWS_PER_BLOCK
        self.plan = launch.Launcher(loaded.plan, (1, 1, 1), PLAN_THREADS, 0)
        self.preprocess = launch.Launcher(loaded.preprocess, (q_blocks, heads_q, 1),
                                          AUX_THREADS, 0)
        self.main = launch.Launcher(loaded.main, (workers, 1, 1), THREADS, loaded.smem_bytes)
        self.convert_q = launch.Launcher(loaded.convert, (q_blocks, heads_q, 1), AUX_THREADS, 0)
        self.convert_kv = launch.Launcher(
            loaded.convert, (layout.k_tiles * bn // PREP_ROWS_PER_BLOCK, heads_kv, 1),
            AUX_THREADS, 0)
        q_stride, k_stride = heads_q * head_dim, heads_kv * head_dim
        o_stride = heads_q * variant.head_dim_v  # O and dO, which the preprocess reads
        self.params_template = BwdParams(
            stall=watchdog.record(device, workers), batch=batch, heads_q=heads_q,
            heads_kv=heads_kv, q_row_stride=q_stride, k_row_stride=k_stride,
            watchdog_ms=watchdog.timeout_ms(), max_units=layout.max_units,
            pack_fault=pack_faults.record(device), total_q=total_q, total_k=total_k)
        self.prep_template = PrepParams(
            zero_vec4s=(layout.words - layout.zeroed) // 4, batch=batch, heads=heads_q,
            row_stride=o_stride, zero_dq=not deterministic)
        self.convert_q_template = ConvertParams(batch=batch, heads=heads_q, row_stride=q_stride,
                                                swizzled=True, block_m=bm)
        self.convert_kv_template = ConvertParams(batch=batch, heads=heads_kv,
                                                 row_stride=k_stride, swizzled=False,
                                                 block_m=bn)
        BackwardMaps.__init__(self, bm, bn)


@memo(max_entries=256)
def pack_backward_launch(variant: BackwardVariant, q_shape: torch.Size, k_shape: torch.Size,
                         batch: int, deterministic: bool, workers: int,
                         device: torch.device) -> PackBackwardLaunch:
    return PackBackwardLaunch(variant, q_shape, k_shape, batch, deterministic, workers, device)


class PackBackwardCall:
    """A packed backward at one signature: its launch (PackBackwardLaunch) and its parameter
    blocks with the longest lengths and the scale filled in too, so a call copies them, writes
    the addresses and launches, as the fixed-length BackwardCall does. Every call of the
    signature shares it, each writing its own copies of the blocks."""

    def __init__(self, bl: PackBackwardLaunch, max_seqlen_q: int, max_seqlen_k: int,
                 softmax_scale: float, softcap: float = 0.0,
                 window: tuple[int, int] = NO_WINDOW):
        self.bl = bl
        self.empty = bl.empty or max_seqlen_q == 0 or max_seqlen_k == 0
        if self.empty:
            return
        params = self.params_template = BwdParams.from_buffer_copy(bl.params_template)
        params.seqlen_q, params.seqlen_k = max_seqlen_q, max_seqlen_k
        params.num_m_blocks = _cdiv(max_seqlen_q, bl.block_m)
        params.num_n_blocks = _cdiv(max_seqlen_k, bl.block_n)
        params.softmax_scale = float(softmax_scale)
        for name, value in softcap_fields(float(softmax_scale), float(softcap)).items():
            setattr(params, name, value)
        # A window's bounds (the plan kernel zeroes the dK/dV of keys no row sees).
        params.window_left, params.window_right = mask_of(False, window).kernel_bounds()
        prep = self.prep_template = PrepParams.from_buffer_copy(bl.prep_template)
        prep.seqlen, prep.d_scale = max_seqlen_q, float(softmax_scale)
        self.convert_q_template = ConvertParams.from_buffer_copy(bl.convert_q_template)
        self.convert_q_template.seqlen = max_seqlen_q
        self.convert_kv_template = ConvertParams.from_buffer_copy(bl.convert_kv_template)
        self.convert_kv_template.seqlen = max_seqlen_k

    def __call__(self, do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k):
        """dq, dk, dv; every tensor contiguous, lse as `forward` returns it."""
        if self.empty:
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        bl = self.bl
        dev, layout, gqa = bl.device, bl.layout, bl.gqa
        empty = allocator()
        watchdog.check()
        pack_faults.check()
        launch.make_current(bl.device_index)
        strm = stream(dev)
        workspace = empty((layout.words,), torch.float32, dev)
        base = workspace.data_ptr()
        dq_accum, dpsum, stats, plan, dk_accum, dv_accum, dq_counters, dkv_counters = (
            base + offset for offset in bl.part_bytes)
        cu_q, cu_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        do_ptr, lse_ptr = do.data_ptr(), lse.data_ptr()
        # Without GQA the main kernel writes dK/dV; the plan kernel zeroes the rows of sequences
        # without queries, which have no tasks (AttnPackPlan::zero_unseen_keys).
        dk = dv = None
        params = BwdParams.from_buffer_copy(self.params_template)
        if gqa:
            params.dk_accum, params.dv_accum, params.dkv_counters = (dk_accum, dv_accum,
                                                                     dkv_counters)
        else:
            dk, dv = empty(k.shape, k.dtype, dev), empty(v.shape, v.dtype, dev)
            params.dk, params.dv = dk.data_ptr(), dv.data_ptr()
        params.q, params.k, params.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        params.dout, params.lse, params.dpsum, params.dq_accum = do_ptr, lse_ptr, dpsum, dq_accum
        params.dq_counters, params.stats, params.pack_plan = dq_counters, stats, plan
        params.cu_seqlens_q, params.cu_seqlens_k = cu_q, cu_k
        bl.plan(strm, addresses(params))
        map_q = plan + bl.map_q_bytes
        prep = PrepParams.from_buffer_copy(self.prep_template)
        prep.o, prep.dout, prep.dpsum, prep.dq_accum = o.data_ptr(), do_ptr, dpsum, dq_accum
        prep.zero, prep.lse, prep.stats = base + bl.zeroed_bytes, lse_ptr, stats
        prep.cu_seqlens, prep.tile_seq = cu_q, map_q
        bl.preprocess(strm, addresses(prep))
        maps, do_map = bl.qkv_maps(q, k, v), bl.do_map(do)
        bl.main(strm, addresses(*(int(m.getPtr()) for m in maps), int(do_map.getPtr()), params))
        dq = empty(q.shape, q.dtype, dev)
        convert = ConvertParams.from_buffer_copy(self.convert_q_template)
        convert.src, convert.dst = dq_accum, dq.data_ptr()
        convert.counters = dq_counters if bl.deterministic else 0
        convert.cu_seqlens, convert.tile_seq = cu_q, map_q
        bl.convert_q(strm, addresses(convert))
        if gqa:
            dk, dv = empty(k.shape, k.dtype, dev), empty(v.shape, v.dtype, dev)
            for src, dst in ((dk_accum, dk), (dv_accum, dv)):
                convert = ConvertParams.from_buffer_copy(self.convert_kv_template)
                convert.src, convert.dst = src, dst.data_ptr()
                convert.cu_seqlens, convert.tile_seq = cu_k, plan + bl.map_k_bytes
                bl.convert_kv(strm, addresses(convert))
        return dq, dk, dv


@memo(max_entries=256)
def pack_backward_call(variant: BackwardVariant, q_shape: torch.Size, k_shape: torch.Size,
                       batch: int, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                       deterministic: bool, workers: int,
                       device: torch.device, softcap: float = 0.0,
                       window: tuple[int, int] = NO_WINDOW) -> PackBackwardCall:
    return PackBackwardCall(pack_backward_launch(variant, q_shape, k_shape, batch,
                                                 deterministic, workers, device),
                            max_seqlen_q, max_seqlen_k, softmax_scale, softcap, window)


def backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
             max_seqlen_k: int, *, causal: bool, softmax_scale: float, deterministic: bool,
             schedule: str, workers: int, softcap: float = 0.0,
             window: tuple[int, int] = NO_WINDOW):
    """dq, dk, dv of a pack; every tensor contiguous, lse as `forward` returns it. Through the
    memo of prepared calls, as `forward`."""
    window = tuple(window)
    selection = pack_selection(DTYPE_NAMES[q.dtype], q.shape[2], bool(causal), schedule,
                               bool(deterministic), q.shape[1] != k.shape[1],
                               window != NO_WINDOW).soft_capped(
                                   bool(softcap)).with_head_dim_v(v.shape[-1])
    return pack_backward_call(selection.backward, q.shape, k.shape, cu_seqlens_q.numel() - 1,
                              max_seqlen_q, max_seqlen_k, float(softmax_scale),
                              bool(deterministic), workers, q.device, float(softcap), window)(
        do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
