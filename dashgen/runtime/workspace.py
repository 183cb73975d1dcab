"""The backward's scratch memory: one fp32/int32 allocation in parts, and how buffers are
allocated under torch's deterministic mode."""
from __future__ import annotations

import math

import torch

from ..codegen.variants import kernel_head_dim
from ..schedule.problem import Problem


class WorkspaceLayout:
    """The backward's fp32/int32 scratch, one allocation of `floats` words in parts (offsets in
    words, each on a 16-byte boundary): the fp32 dQ accumulator (in the deterministic backward
    the first writer of each tile stores into it, so it needs no zeroing; the non-deterministic
    backward's preprocess zeroes it), rowsum(dO * O), the statistics per query tile that the
    preprocess kernel lays out for the producer (`staged-stats`), then what the
    preprocess kernel clears as whole 16-byte vectors (`zeroed_offset` to the end): GQA's fp32
    dK/dV sums (empty without GQA), the dQ tile counters and the dK/dV tile counters."""

    PARTS = ("dq_accum", "dpsum", "stats", "dk_accum", "dv_accum", "dq_counters", "dkv_counters")

    def __init__(self, problem: Problem):
        # The fp32 sums have the kernel's columns (a head_dim computed in a wider kernel).
        b, hq, hkv = problem.batch, problem.heads_q, problem.heads_kv
        d = kernel_head_dim(problem.head_dim)
        gqa = problem.gqa
        kv = (b, hkv, problem.num_n_blocks * problem.block_n, d) if gqa else (0,)
        stats = (b, hq, problem.num_m_blocks, 2, problem.block_m)
        self.shapes = [(b, hq, problem.num_m_blocks * problem.block_m, d),
                       (b, hq, problem.seqlen_q), stats, kv, kv, (b, hq, problem.num_m_blocks),
                       (b, hkv, problem.num_n_blocks) if gqa else (0,)]
        # Whole 16-byte vectors per part: the bulk copies and the vector zeroing need alignment.
        sizes = [-(-math.prod(shape) // 4) * 4 for shape in self.shapes]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.floats = sum(sizes)
        self.zeroed_offset = self.offsets[self.PARTS.index("dk_accum")]

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parts as views of a buffer of `floats` fp32 words (counters as int32)."""
        views = {}
        for name, shape, start in zip(self.PARTS, self.shapes, self.offsets):
            view = buffer[start:start + math.prod(shape)].view(shape)
            views[name] = view.view(torch.int32) if name.endswith("counters") else view
        return views


def _empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _empty_unfilled(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty without the NaN fill of deterministic mode: a bare storage from the same
    caching allocator (its constructor does not fill), viewed with the shape."""
    storage = torch.UntypedStorage(math.prod(shape) * dtype.itemsize, device=device)
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)


def allocator():
    """How this call allocates its buffers. Under torch.use_deterministic_algorithms(True)
    torch fills every new tensor with NaN (so that a read of uninitialized memory gives the same
    bits each run). The buffers allocated here are written by the kernels before anything reads
    them (the outputs, the preprocess's rows, the dQ sums stored or zeroed by their first
    writer): the fill would be pure cost, ~0.3 GB of writes and four launches per backward at
    16384 tokens x hidden 2048 (docs/design.md, `deterministic-flag-buffers`). The global setting is left
    alone, so other threads' tensors keep their fill."""
    if (torch.are_deterministic_algorithms_enabled()
            and torch.utils.deterministic.fill_uninitialized_memory):
        return _empty_unfilled
    return _empty
