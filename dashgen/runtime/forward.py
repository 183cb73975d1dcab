"""The forward call: o and lse from q, k, v on PyTorch's current stream."""
from __future__ import annotations

import ctypes

import torch

from ..caches import Memo, memo
from ..codegen.variants import THREADS, FwdParams, ForwardVariant
from ..schedule.builders.base import fewest_workers
from . import launch
from .device import DTYPE_NAMES, kernels, sm_count, stream, tensor_map
from .select import Overrides, problem_of_shapes, select_forward
from .workspace import allocator


def forward_ctas(m_tiles: int, heads: int, sms: int, causal: bool) -> int:
    """The persistent forward's grid for heads (batch x heads_q) of m_tiles query tiles each on
    `sms` SMs: as few CTAs as keep the busiest as busy as one a SM would (full mask), or whole
    heads' tiles a round (causal mask, m_tiles <= sms)."""
    tiles = m_tiles * heads
    if causal:
        return m_tiles * min(heads, sms // m_tiles)
    return fewest_workers(tiles, min(tiles, sms))


class ForwardLaunch:
    """A forward variant's prepared launch for a q shape, with the TMA descriptors of the
    q, k, v it has seen."""

    def __init__(self, variant: ForwardVariant, q_shape: tuple, device: torch.device):
        batch, seqlen_q, heads_q, _ = q_shape
        self.variant = variant
        loaded = kernels(variant, device)
        grid = (-(-seqlen_q // variant.block_m), heads_q, batch)
        if variant.persistent:
            grid = (forward_ctas(grid[0], heads_q * batch, sm_count(device), variant.causal),
                    1, 1)
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
        maps = (tensor_map(q, 64), tensor_map(k, block_n), tensor_map(v, block_n))
        # The addresses point into the descriptor objects: keep them with the addresses.
        return [int(m.getPtr()) for m in maps], maps


@memo(max_entries=256)
def forward_variant(q_shape: tuple, k_shape: tuple, dtype: str, causal: bool, sms: int,
                    overrides: Overrides = Overrides()) -> ForwardVariant:
    """dashgen.runtime.select.select_forward for a call's shapes."""
    return select_forward(problem_of_shapes(q_shape, k_shape, causal), dtype, sms, overrides)


@memo(max_entries=256)
def forward_launch(variant: ForwardVariant, q_shape: tuple, device: torch.device) -> ForwardLaunch:
    return ForwardLaunch(variant, q_shape, device)


def forward(q, k, v, *, causal: bool, softmax_scale: float,
            overrides: Overrides = Overrides()):
    """o and lse; q, k and v are contiguous."""
    variant = forward_variant(tuple(q.shape), tuple(k.shape), DTYPE_NAMES[q.dtype], bool(causal),
                              sm_count(q.device), overrides)
    fl = forward_launch(variant, tuple(q.shape), q.device)
    batch, seqlen_q, heads_q, _ = q.shape
    empty = allocator()
    o = empty(q.shape, q.dtype, q.device)  # q is contiguous: o is laid out like it
    lse = empty((batch, heads_q, seqlen_q), torch.float32, q.device)
    params = FwdParams(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                       batch, heads_q, k.shape[2], seqlen_q, k.shape[1],
                       q.stride(1), k.stride(1), o.stride(1), float(softmax_scale))
    addresses = fl.map_addresses(q, k, v) + [ctypes.addressof(params)]
    launch.make_current(q.device.index or 0)
    fl.launcher(stream(q.device), addresses)
    return o, lse
