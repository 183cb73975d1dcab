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

from ..caches import Memo, memo
from ..codegen.variants import (AUX_THREADS, PREP_ROWS_PER_BLOCK, THREADS, BwdParams,
                                ConvertParams, FwdParams, PrepParams, kernel_head_dim)
from . import launch, pack_faults, watchdog
from .device import DTYPE_NAMES, kernels, stream, tensor_map
from .launch import addresses
from .select import Selection, pack_selection
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


@memo(max_entries=256)
def _launcher(kernel, grid: tuple, threads: int, smem: int) -> launch.Launcher:
    return launch.Launcher(kernel, grid, threads, smem)


def _maps(x: torch.Tensor, rows: int):
    """A (total, heads, head_dim) tensor's descriptor as a batch of one."""
    return tensor_map(x.unsqueeze(0), rows)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
            causal: bool, softmax_scale: float, selection: Selection | None = None):
    """o (total_q, heads_q, head_dim) and lse (heads_q * total_q floats, sequence b's
    (heads_q, seqlen) block from heads_q * cu_seqlens_q[b]); q, k, v contiguous. `selection`:
    the call's (select.pack_selection) where the caller holds it; else it is looked up."""
    pack_faults.check()
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv = k.shape[:2]
    batch = cu_seqlens_q.numel() - 1
    empty = allocator()
    o = empty(q.shape, q.dtype, q.device)
    lse = empty((heads_q * total_q,), torch.float32, q.device)
    if total_q == 0 or max_seqlen_q == 0:
        return o, lse
    if total_k == 0:  # no keys in any sequence: every row sees none
        return o.zero_(), lse.fill_(-math.inf)
    if selection is None:  # the forward is the same for every schedule and mode
        selection = pack_selection(DTYPE_NAMES[q.dtype], head_dim, bool(causal), "auto", True,
                                   False)
    variant = selection.forward
    loaded = kernels(variant, q.device)
    # The variant's tiles, as the dense forward takes them (FORWARD_TILES: the key tile is
    # narrower past head_dim 128).
    grid = (_cdiv(max_seqlen_q, variant.block_m), heads_q, batch)
    maps = (_maps(q, 64), _maps(k, variant.block_n), _maps(v, variant.block_n))
    params = FwdParams(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                       lse=lse.data_ptr(), batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                       seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k, q_row_stride=q.stride(0),
                       k_row_stride=k.stride(0), o_row_stride=o.stride(0),
                       softmax_scale=float(softmax_scale), cu_seqlens_q=cu_seqlens_q.data_ptr(),
                       cu_seqlens_k=cu_seqlens_k.data_ptr(),
                       pack_fault=pack_faults.record(q.device), total_q=total_q, total_k=total_k)
    launch.make_current(q.device.index or 0)
    _launcher(loaded.main, grid, THREADS, loaded.smem_bytes)(
        stream(q.device), [int(m.getPtr()) for m in maps] + [ctypes.addressof(params)])
    return o, lse


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


# Layouts by (lengths' totals, shapes, tiles): a training loop repeats them.
_workspace = Memo(PackWorkspace, max_entries=256)


def backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
             max_seqlen_k: int, *, causal: bool, softmax_scale: float, deterministic: bool,
             schedule: str, workers: int, selection: Selection | None = None):
    """dq, dk, dv of a pack; every tensor contiguous, lse as `forward` returns it. `selection`:
    what the options select (select.pack_selection) where the caller holds it."""
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv = k.shape[:2]
    batch = cu_seqlens_q.numel() - 1
    dev = q.device
    empty = allocator()
    gqa = heads_q != heads_kv
    if total_q == 0 or total_k == 0 or max_seqlen_q == 0 or max_seqlen_k == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if selection is None:
        selection = pack_selection(DTYPE_NAMES[q.dtype], head_dim, bool(causal), schedule,
                                   bool(deterministic), gqa)
    variant = selection.backward
    bm, bn = variant.block_m, variant.block_n
    loaded = kernels(variant, dev)
    layout = _workspace(batch, total_q, total_k, heads_q, heads_kv, head_dim, bm, bn, gqa)
    watchdog.check()
    pack_faults.check()
    launch.make_current(dev.index or 0)
    strm = stream(dev)
    workspace = empty((layout.words,), torch.float32, dev)
    base = workspace.data_ptr()
    dq_accum, dpsum, stats, plan, dk_accum, dv_accum, dq_counters, dkv_counters = (
        base + 4 * offset for offset in layout.offsets)
    cu_q, cu_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
    q_stride, k_stride = heads_q * head_dim, heads_kv * head_dim
    # Without GQA the main kernel writes dK/dV; the plan kernel zeroes the rows of sequences
    # without queries, which have no tasks (AttnPackPlan::zero_unseen_keys).
    dk = dv = None
    if not gqa:
        dk, dv = empty(k.shape, k.dtype, dev), empty(v.shape, v.dtype, dev)
    params = BwdParams(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), dout=do.data_ptr(), lse=lse.data_ptr(),
        dpsum=dpsum, dq_accum=dq_accum, dk=dk.data_ptr() if dk is not None else 0,
        dv=dv.data_ptr() if dv is not None else 0, dk_accum=dk_accum if gqa else 0,
        dv_accum=dv_accum if gqa else 0, dq_counters=dq_counters,
        dkv_counters=dkv_counters if gqa else 0, stall=watchdog.record(dev, workers),
        batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=max_seqlen_q,
        seqlen_k=max_seqlen_k, q_row_stride=q_stride, k_row_stride=k_stride,
        num_m_blocks=_cdiv(max_seqlen_q, bm), num_n_blocks=_cdiv(max_seqlen_k, bn),
        softmax_scale=float(softmax_scale), watchdog_ms=watchdog.timeout_ms(), stats=stats,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, pack_plan=plan, max_units=layout.max_units,
        pack_fault=pack_faults.record(dev), total_q=total_q, total_k=total_k)
    block_args = addresses(params)
    _launcher(loaded.plan, (1, 1, 1), PLAN_THREADS, 0)(strm, block_args)
    # The preprocess and converts walk the pack's tiles (PackedTile), through the tile maps the
    # plan kernel writes after its orders: their grids follow the packed tokens.
    map_q = plan + 4 * layout.map_words
    map_k = map_q + 4 * layout.q_tiles
    q_blocks = layout.q_tiles * bm // PREP_ROWS_PER_BLOCK
    prep = PrepParams(o=o.data_ptr(), dout=do.data_ptr(), dpsum=dpsum, dq_accum=dq_accum,
                      zero=base + 4 * layout.zeroed,
                      zero_vec4s=(layout.words - layout.zeroed) // 4, batch=batch,
                      heads=heads_q, seqlen=max_seqlen_q, row_stride=q_stride,
                      zero_dq=not deterministic, lse=lse.data_ptr(), stats=stats,
                      cu_seqlens=cu_q, tile_seq=map_q, d_scale=float(softmax_scale))
    _launcher(loaded.preprocess, (q_blocks, heads_q, 1), AUX_THREADS, 0)(strm, addresses(prep))
    maps = (_maps(q, bm), _maps(k, bn), _maps(v, bn), _maps(do, bm))
    _launcher(loaded.main, (workers, 1, 1), THREADS, loaded.smem_bytes)(
        strm, [int(m.getPtr()) for m in maps] + [ctypes.addressof(params)])
    dq = empty(q.shape, q.dtype, dev)
    convert = ConvertParams(src=dq_accum, dst=dq.data_ptr(),
                            counters=dq_counters if deterministic else 0, batch=batch,
                            heads=heads_q, seqlen=max_seqlen_q, row_stride=q_stride,
                            swizzled=True, block_m=bm, cu_seqlens=cu_q, tile_seq=map_q)
    _launcher(loaded.convert, (q_blocks, heads_q, 1), AUX_THREADS, 0)(strm, addresses(convert))
    if gqa:
        dk, dv = empty(k.shape, k.dtype, dev), empty(v.shape, v.dtype, dev)
        for src, dst in ((dk_accum, dk), (dv_accum, dv)):
            convert = ConvertParams(src=src, dst=dst.data_ptr(), batch=batch, heads=heads_kv,
                                    seqlen=max_seqlen_k, row_stride=k_stride, swizzled=False,
                                    block_m=bn, cu_seqlens=cu_k, tile_seq=map_k)
            _launcher(loaded.convert, (layout.k_tiles * bn // PREP_ROWS_PER_BLOCK, heads_kv, 1),
                      AUX_THREADS, 0)(strm, addresses(convert))
    del maps, params, prep  # the driver copied the arguments at each launch
    return dq, dk, dv
