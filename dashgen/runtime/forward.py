"""The forward call: o and lse from q, k, v on PyTorch's current stream."""
from __future__ import annotations

import ctypes

import torch

from ..caches import Memo, memo
import dataclasses

from ..codegen.variants import THREADS, FwdParams, FwdWindowParams, ForwardVariant, softcap_fields
from ..schedule.builders.base import fewest_workers
from . import launch
from .device import DTYPE_NAMES, kernels, sm_count, stream, tensor_map
from .select import NO_WINDOW, Overrides, mask_of, problem_of_shapes, select_forward, v_width
from .workspace import allocator


def forward_ctas(m_tiles: int, heads: int, sms: int, causal: bool) -> int:
    """The persistent forward's grid for heads (batch x heads_q) of m_tiles query tiles each on
    `sms` SMs: as few CTAs as keep the busiest as busy as one a SM would. The units dealt are
    the tiles (full mask) or pairs of tiles of equal cost (causal mask, attn/fwd_tile_order.cuh)."""
    units = m_tiles * heads
    if causal:
        units = -(-units // 2)
    return fewest_workers(units, min(units, sms))


def descriptor(t: torch.Tensor, rows: int):
    """The TMA descriptor (device.tensor_map) of a (batch, seqlen, heads, head_dim) tensor in
    boxes of `rows` rows, or of a pack's (total, heads, head_dim) tensor as a batch of one: the
    fixed-length and the packed kernels read their tensors alike."""
    return tensor_map(t if t.dim() == 4 else t.unsqueeze(0), rows)


def forward_grid(variant: ForwardVariant, q_shape: tuple, device: torch.device) -> tuple:
    """The grid of a forward of q's (batch, seqlen_q, heads_q, head_dim) shape: a CTA a query
    tile, or the persistent CTAs."""
    batch, seqlen_q, heads_q, _ = q_shape
    grid = (-(-seqlen_q // variant.block_m), heads_q, batch)
    if variant.persistent:
        grid = (forward_ctas(grid[0], heads_q * batch, sm_count(device), variant.causal), 1, 1)
    return grid


class ForwardLaunch:
    """A forward variant's prepared launch on its grid, with the TMA descriptors of the q, k, v
    it has seen: the fixed-length forward's and a pack's (runtime.varlen), whose kernels read
    the same three descriptors and one parameter block."""

    def __init__(self, variant: ForwardVariant, grid: tuple, device: torch.device):
        self.variant = variant
        loaded = kernels(variant, device)
        self.launcher = launch.Launcher(loaded.main, grid, THREADS, loaded.smem_bytes)
        self._maps = Memo(None, max_entries=512)

    def map_addresses(self, q, k, v) -> list[int]:
        """The three descriptors (Q, K, V) as kernel-argument addresses. q, k and v are
        contiguous and q's shape is the signature's: their addresses and k's shape decide the
        descriptors, one lookup per call instead of three."""
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), k.shape)
        return self._maps.get(key, lambda: self._encode(q, k, v))[0]

    def _encode(self, q, k, v) -> tuple[list[int], tuple]:
        # Each MMA warpgroup loads its 64 query rows; K/V come in tiles of block_n keys.
        block_n = self.variant.block_n
        maps = (descriptor(q, 64), descriptor(k, block_n), descriptor(v, block_n))
        # The addresses point into the descriptor objects: keep them with the addresses.
        return [int(m.getPtr()) for m in maps], maps


def forward_variant(q_shape: tuple, k_shape: tuple, dtype: str, causal: bool, sms: int,
                    overrides: Overrides = Overrides(),
                    window: tuple[int, int] = NO_WINDOW) -> ForwardVariant:
    """dashgen.runtime.select.select_forward for a call's shapes: the forward alone, as
    inference runs it, whose choice reads neither the backward's options nor its schedule. Not
    memoized: it is asked once per ForwardCall, itself made once per signature."""
    return select_forward(problem_of_shapes(q_shape, k_shape, causal, window), dtype, sms,
                          overrides)


@memo(max_entries=256)
def forward_launch(variant: ForwardVariant, q_shape: tuple, grid: tuple,
                   device: torch.device) -> ForwardLaunch:
    """The launch for q's shape on `grid`: its descriptors are looked up by the addresses and
    k's shape, so one launch serves one shape of q."""
    return ForwardLaunch(variant, grid, device)


class ForwardCall:
    """Everything a forward at one signature (q and k shapes, dtype, mask, scale, device) fixes:
    its prepared launch and its parameter block with the shapes and scale filled in, so a call
    writes the addresses and row strides into a copy and launches (a forward on an idle GPU
    waits for this host time: docs/design.md, `fwd-host-path`)."""

    def __init__(self, q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype,
                 causal: bool, softmax_scale: float, device: torch.device,
                 overrides: Overrides, softcap: float = 0.0,
                 window: tuple[int, int] = NO_WINDOW, head_dim_v: int | None = None):
        variant = forward_variant(tuple(q_shape), tuple(k_shape), DTYPE_NAMES[dtype],
                                  bool(causal), sm_count(device), overrides, window)
        if softcap:
            variant = dataclasses.replace(variant, softcap=True)  # the same tiles and grid
        if head_dim_v is not None and head_dim_v != q_shape[-1]:
            variant = dataclasses.replace(variant, head_dim_v=head_dim_v)  # MLA: V, O narrower
        self.launch = forward_launch(variant, tuple(q_shape),
                                     forward_grid(variant, q_shape, device), device)
        batch, seqlen_q, heads_q, head_dim = q_shape
        self.lse_shape = (batch, heads_q, seqlen_q)
        self.o_shape = (batch, seqlen_q, heads_q, variant.head_dim_v)
        self.device_index = device.index or 0
        block = FwdWindowParams if variant.window else FwdParams
        self.template = block(batch=batch, heads_q=heads_q, heads_kv=k_shape[2],
                              seqlen_q=seqlen_q, seqlen_k=k_shape[1],
                              softmax_scale=float(softmax_scale),
                              **softcap_fields(float(softmax_scale), float(softcap)))
        if variant.window:
            self.template.window_left, self.template.window_right = mask_of(
                False, window).kernel_bounds()

    def __call__(self, q, k, v):
        empty = allocator()
        o = empty(self.o_shape, q.dtype, q.device)  # contiguous, V's width
        lse = empty(self.lse_shape, torch.float32, q.device)
        params = type(self.template).from_buffer_copy(self.template)
        params.q, params.k, params.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        params.o, params.lse = o.data_ptr(), lse.data_ptr()
        params.q_row_stride, params.k_row_stride = q.stride(1), k.stride(1)
        params.o_row_stride = o.stride(1)
        addresses = self.launch.map_addresses(q, k, v) + [ctypes.addressof(params)]
        launch.make_current(self.device_index)
        self.launch.launcher(stream(q.device), addresses)
        return o, lse


@memo(max_entries=256)
def forward_call(q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype, causal: bool,
                 softmax_scale: float, device: torch.device,
                 overrides: Overrides = Overrides(), softcap: float = 0.0,
                 window: tuple[int, int] = NO_WINDOW,
                 head_dim_v: int | None = None) -> ForwardCall:
    return ForwardCall(q_shape, k_shape, dtype, causal, softmax_scale, device, overrides,
                       softcap, window, head_dim_v)


def forward(q, k, v, *, causal: bool, softmax_scale: float,
            overrides: Overrides = Overrides(), softcap: float = 0.0,
            window: tuple[int, int] = NO_WINDOW):
    """o (V's width) and lse; q, k and v are contiguous. softcap: FlashAttention's (0:
    uncapped); window: a sliding window's (left, right), runtime.checks.window's (-1, -1:
    none)."""
    return forward_call(q.shape, k.shape, q.dtype, causal, softmax_scale, q.device,
                        overrides, softcap, tuple(window), v_width(q, v))(q, k, v)
