"""The kernel variants: the typed values the Hopper (sm_90a) templates are rendered from, and the
host's mirrors of the kernels' parameter blocks.

A variant holds only the fields that vary between kernels that run; everything that is a
constant of (head_dim, causal) sits in one table, BACKWARD_CONSTANTS. A variant's name is built
from its fields and is its kernel symbol, its file name and (with the source) its cache key.
Which variant runs for a problem is decided in dashgen.runtime.select, nowhere else.
"""
from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..schedule.builders import BUILDERS

ELEMENT_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}  # dtype -> CUDA type
# The head dims dashgen runs: both kernels exist and were run on the GPU (192 and 256 in the
# swapped backward since 2026-12-06: docs/design.md, `swapped-mainloop`; 32, 48, 80 and 112 in
# the 64 and 128 kernels since 2026-12-07: `padded-head-dims`). The runtime refuses every other
# (dashgen.runtime.checks, select), and so does the backward's variant.
HEAD_DIMS = (32, 48, 64, 80, 96, 112, 128, 192, 256)
# Head dims computed by a wider kernel (docs/design.md, `padded-head-dims`): the kernel's tiles,
# shared memory, registers and schedules are the wider one's. Its TMA loads read zeros past the
# tensors' columns (the descriptors carry the tensors' own width), and its stores to the tensors
# skip those columns, so the zeros add exactly 0 to every sum and nothing lands past a row.
# 96 has no 128-byte swizzle blocks of its own (1.5 blocks of 64 columns); 32 and 48 (small
# models) run in the 64 kernels, 80 (Pythia, Phi-2, StableLM 3B) and 112 in the 128 ones. Every
# one is a multiple of 16: S's and dP's k-steps stop at the tensors' columns (kScoreSteps).
KERNEL_HEAD_DIMS = {32: 64, 48: 64, 80: 128, 96: 128, 112: 128}


# The kernels that can run two dQ writer lanes (BackwardVariant.dq_writers).
DQ_WRITERS_KERNEL_HEAD_DIMS = (64, 128)


def kernel_head_dim(head_dim: int) -> int:
    """The head_dim of the kernel that computes `head_dim` (itself, or KERNEL_HEAD_DIMS')."""
    return KERNEL_HEAD_DIMS.get(head_dim, head_dim)



SM90_MAX_SMEM_BYTES = 232448  # dynamic shared memory one block may opt into on sm_90 (227 KB)
THREADS = 384  # both main kernels: a producer warpgroup and two MMA warpgroups
AUX_THREADS = 128  # the backward's preprocess and convert kernels
PREP_ROWS_PER_BLOCK = 16  # AttnPreprocess / AttnConvert::kRowsPerBlock


@dataclass(frozen=True)
class BackwardConstants:
    """What the Hopper backward fixes per (head_dim, causal); docs/design.md holds the
    measurements behind them: `bwd-block-m`."""

    block_m: int  # query rows per task
    block_n: int  # KV rows per task
    # The swapped mainloop (attn/bwd_mainloop_swapped.cuh): each MMA warpgroup accumulates
    # dK^T/dV^T of half the task's keys, where dK/dV of 64 KV rows over the whole head_dim
    # outgrow a warpgroup's registers; dQ goes to its writer in 64-column pieces.
    swapped: bool = False
    # Swapped at 256 (the split head_dim): each MMA warpgroup hands its dQ pieces to the writer
    # through a buffer of its own, dO on one stage to make room (AttnBwdSm90::kDqPerWg), not
    # one buffer both take in turns.
    dq_per_warpgroup: bool = False


# The head dims the backward's variant compiles for beyond HEAD_DIMS: kernels that build, fit
# and compile without spills (tests/test_kernels_compile.py) but have not run on a GPU; the
# runtime refuses them. OPENED_HEAD_DIMS opens them for the GPU tests that decide that (as
# tests/gpu/test_padded_head_dims_gpu.py did for 32, 48, 80 and 112). None today.
BACKWARD_BUILT_HEAD_DIMS: tuple[int, ...] = ()
# The head dims the forward's variant compiles for: HEAD_DIMS and the built ones, and 192 with
# V 128 wide (FORWARD_TILES, HEAD_DIM_V_PAIRS: docs/design.md, `fwd-head-dims`, `mla-head-dims`).
FORWARD_HEAD_DIMS = tuple(sorted(HEAD_DIMS + BACKWARD_BUILT_HEAD_DIMS))
OPENED_HEAD_DIMS: tuple[int, ...] = ()


def served_head_dims() -> tuple[int, ...]:
    """The head dims the runtime serves: HEAD_DIMS, and any OPENED_HEAD_DIMS."""
    return HEAD_DIMS + OPENED_HEAD_DIMS


BACKWARD_CONSTANTS = {
    (64, False): BackwardConstants(block_m=128, block_n=128),
    (64, True): BackwardConstants(block_m=128, block_n=128),
    (128, False): BackwardConstants(block_m=64, block_n=128),
    (128, True): BackwardConstants(block_m=64, block_n=128),
    # 192: 64x96 tasks, 48 keys a warpgroup (dK^T + dV^T 144 registers a thread, 120 under
    # V 128); 1.09-1.42x the 64x64 tasks at full masks (docs/design.md, `swapped-mainloop`).
    # 256: 64x64, each warpgroup half the head_dim's column blocks over all 64 keys. dQ's 16 KB
    # pieces take two buffers in turns (192), a buffer a piece (192/128), or at 256 a buffer a
    # warpgroup with dO on one stage (1.04-1.08x the one buffer both took in turns, deterministic,
    # H100: docs/design.md, `dq-buffer-per-warpgroup`): 231,968 (192), 219,696 (192/128) and
    # 215,600 (256) bytes of shared memory.
    (192, False): BackwardConstants(block_m=64, block_n=96, swapped=True),
    (192, True): BackwardConstants(block_m=64, block_n=96, swapped=True),
    (256, False): BackwardConstants(block_m=64, block_n=64, swapped=True, dq_per_warpgroup=True),
    (256, True): BackwardConstants(block_m=64, block_n=64, swapped=True, dq_per_warpgroup=True),
}
# Candidates, by name: BACKWARD_CONSTANTS entries built and compiled (tests/test_kernels_compile.py)
# that the runtime does not serve until tests/gpu/test_candidate_tiles_gpu.py passes with them in
# place and the anchor kit times them beside the served ones (docs/design.md, `swapped-mainloop`).
# - 256-64x80: FA3's tile at 256, dO on a stage of its own (AttnBwdSm90::kDoStages; two dO stages
#   do not fit beside two Q stages), 219,696 bytes. On an H200 its GPU tests passed and one sweep
#   gave 1.053 (full) and 1.012 (causal) of 64x64's ordered backward.
# (dQ added from the MMA registers, FA3's path at 256, measured 0.66-0.68x the staged dQ ordered
# and 0.75-0.76x unordered: lab/notes/tried-and-dropped.md, `dq-direct`.)
BACKWARD_CANDIDATES = {
    "256-64x80": {
        (256, False): BackwardConstants(block_m=64, block_n=80, swapped=True),
        (256, True): BackwardConstants(block_m=64, block_n=80, swapped=True),
    },
}
# The head dims with a dq_last order. At 64 it spills 56 bytes (the dS tiles in the softmax
# loop beside dK's accumulators) and is still 1.14-1.26x faster at 128k-256k tokens, where the
# Q/dO stage it frees before the dQ hand-off is what the long sequences wait on
# (docs/design.md, `dq-last-long`).
DQ_LAST_HEAD_DIMS = (64, 128)
FORWARD_BLOCK_M = 128  # query rows per CTA (64 per MMA warpgroup)
FORWARD_BLOCK_N = 128  # keys per pipeline stage at the head dims the runtime runs (HEAD_DIMS)


@dataclass(frozen=True)
class ForwardTiles:
    """The forward's tile at one (head_dim, head_dim_v): block_m query rows a CTA, block_n keys
    a K/V stage."""

    block_m: int
    block_n: int


# The forward's tiles per (head_dim, head_dim_v). 128 query rows everywhere: two MMA warpgroups
# of 64 rows, as the kernel is written. 128 keys at 64 and 128, as measured
# (lab/notes/tried-and-dropped.md, `retired-fwd-longer-kv-tiles`). Past 128 the longest key tile, a multiple of
# 16 (P V's k16 steps), whose Q tile and two K and V stages fit the 232,448 bytes an sm_90 block
# may use (the kernel adds 72 bytes of barriers and 1 KB of alignment slack; O is stored from
# the accumulator there, without a staging tile), at 2 bytes an element:
#   192:      Q 128x192 49,152 + 2 x (K 112x192 43,008 + V 43,008) = 221,184 (216 KB);
#             128 keys would take 245,760
#   256:      Q 128x256 65,536 + 2 x (K 80x256 40,960 + V 40,960) = 229,376 (224 KB);
#             96 keys would take 262,144
#   192, V 128: Q 49,152 + 2 x (K 128x192 49,152 + V 128x128 32,768) = 212,992 (208 KB);
#             144 keys would take 233,472
# FA3 and FA4 choose the same tiles at these head dims (docs/head-dims-facts.md); docs/design.md,
# `fwd-head-dims`.
FORWARD_TILES = {
    (64, 64): ForwardTiles(block_m=FORWARD_BLOCK_M, block_n=FORWARD_BLOCK_N),
    (128, 128): ForwardTiles(block_m=FORWARD_BLOCK_M, block_n=FORWARD_BLOCK_N),
    (192, 192): ForwardTiles(block_m=128, block_n=112),
    (192, 128): ForwardTiles(block_m=128, block_n=128),
    (256, 256): ForwardTiles(block_m=128, block_n=80),
}


# q/k and v of different widths: (head_dim, head_dim_v) pairs with a forward and a backward.
# DeepSeek-V3/R1's MLA: q/k 192 (128 + 64 rotary), v 128, in the swapped backward
# (docs/design.md, `mla-head-dims`).
HEAD_DIM_V_PAIRS = ((192, 128),)


def check_head_dim_v(head_dim: int, head_dim_v: int) -> None:
    """Raise ValueError naming head_dim_v where v's width differs from q's and k's without a
    kernel for the pair (HEAD_DIM_V_PAIRS)."""
    if head_dim_v != head_dim and (head_dim, head_dim_v) not in HEAD_DIM_V_PAIRS:
        pairs = ", ".join(f"{d}/{dv}" for d, dv in HEAD_DIM_V_PAIRS)
        raise ValueError(f"v has head_dim {head_dim_v} but q and k have {head_dim}: kernels "
                         f"exist for q/k and v of equal widths and for {pairs}")


def check_dtype_head_dim(dtype: str, head_dim: int,
                         head_dims: tuple[int, ...] | None = None) -> None:
    """Raise ValueError naming dtype or head_dim where no kernel runs for them (or, given
    head_dims, where none compiles)."""
    head_dims = served_head_dims() if head_dims is None else head_dims
    if dtype not in ELEMENT_TYPES:
        raise ValueError(f"dtype must be one of {sorted(ELEMENT_TYPES)}, got {dtype!r}")
    if head_dim not in head_dims:
        raise ValueError(f"head_dim must be one of {head_dims}, got {head_dim!r}")


def runs_swapped(head_dim: int, causal: bool) -> bool:
    """Whether the backward at head_dim (a window: causal False) runs the swapped mainloop,
    whose dQ goes to the writer in pieces and is converted by the convert kernel; False for a
    head_dim without a backward."""
    constants = BACKWARD_CONSTANTS.get((kernel_head_dim(head_dim), causal))
    return constants is not None and constants.swapped


def backward_tiles(head_dim: int) -> tuple[int, int]:
    """(block_m, block_n) of the backward at a head_dim the runtime serves: the tiles its
    schedules are built in."""
    head_dims = served_head_dims()
    if head_dim not in head_dims:
        raise ValueError(f"head_dim must be one of {head_dims}, got {head_dim!r}")
    c = BACKWARD_CONSTANTS[kernel_head_dim(head_dim), False]
    return c.block_m, c.block_n


# The backward's schedule policies: name -> (header under templates/include/dashgen/sched/, C++
# class template, the tag kernel names carry). "table" walks a schedule file's task table
# (dashgen.load_schedule). A policy's number in the kernel is its builder's kernel_id.
SCHEDULE_POLICIES = {
    "fa3": ("ordered.cuh", "Fa3", "fa3"),
    "spt": ("ordered.cuh", "Spt", "spt"),
    "spt_listed": ("ordered.cuh", "Spt", "sptl"),
    "descending": ("ordered.cuh", "Descending", "desc"),
    "shift": ("shift.cuh", "Shift", "shift"),
    "symmetric_shift": ("shift.cuh", "SymmetricShift", "symshift"),
    "hybrid": ("hybrid.cuh", "Hybrid", "hybrid"),
    "table": (None, None, "table"),
}


# The schedules a window backward compiles (sched::WindowTiling under the launch-ordered
# policies): the others need a full or a causal mask's tiles.
WINDOW_SCHEDULES = ("fa3", "spt", "spt_listed", "descending")


def _mask_name(causal: bool, window: bool = False) -> str:
    return "window" if window else "causal" if causal else "full"


class _Variant:
    """What both variants share: a checked 16-bit dtype and head_dim, and the sizes of the
    parameter blocks the entry templates assert against."""

    template: ClassVar[str]
    head_dims: ClassVar[tuple[int, ...]] = HEAD_DIMS  # the head dims the variant compiles for
    dtype: str
    head_dim: int
    causal: bool

    def __post_init__(self) -> None:
        check_dtype_head_dim(self.dtype, self.head_dim, self.head_dims)
        if getattr(self, "window", False) and self.causal:
            raise ValueError("a window variant's mask is its window (the bounds are parameters): "
                             "causal=False")
        for name in ("causal", "deterministic", "gqa", "fused_convert", "early_kv", "dq_last",
                     "trace", "persistent", "varlen", "softcap", "window"):
            value = getattr(self, name, False)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")

    def __repr__(self) -> str:
        # head_dim_v only where it differs from head_dim, softcap and window only where set
        # and dq_writers only where 2, so that a variant without them names itself as it did
        # before they existed (the comment the sources open with).
        fields = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                  if (f.name != "head_dim_v" or self.head_dim_v != self.head_dim)
                  and (f.name not in ("softcap", "window") or getattr(self, f.name))
                  and (f.name != "dq_writers" or self.dq_writers != 1)]
        return f"{type(self).__name__}({', '.join(fields)})"

    @property
    def cuda_type(self) -> str:
        return ELEMENT_TYPES[self.dtype]

    @property
    def kernel_head_dim(self) -> int:
        """The head_dim the kernel computes with (KERNEL_HEAD_DIMS); head_dim is the tensors'."""
        return kernel_head_dim(self.head_dim)

    @property
    def prep_params_bytes(self) -> int:
        return ctypes.sizeof(PrepParams)

    @property
    def convert_params_bytes(self) -> int:
        return ctypes.sizeof(ConvertParams)

    @property
    def smem_symbol(self) -> str:
        """The cubin's constant holding the main kernel's dynamic shared memory in bytes (the
        C++ layout is its one source; dashgen.codegen.compile.Cubin.constant reads it)."""
        return f"{self.kernel_name}_smem_bytes"


@dataclass(frozen=True, repr=False)  # _Variant.__repr__
class ForwardVariant(_Variant):
    """The Hopper forward (TMA + wgmma, 128 query rows a CTA); `persistent`: fewer CTAs, each
    walking query tiles and loading the next one's Q and K/V while it finishes the last.
    `varlen`: a pack of sequences of their own lengths (cu_seqlens), one CTA a query tile.
    `head_dim_v`: the columns of V and O (None: head_dim's); 128 under head_dim 192 is the one
    other width (FORWARD_TILES)."""

    template: ClassVar[str] = "attn_fwd_sm90.cu.j2"
    head_dims: ClassVar[tuple[int, ...]] = FORWARD_HEAD_DIMS
    dtype: str
    head_dim: int
    causal: bool
    persistent: bool = False
    varlen: bool = False
    head_dim_v: int | None = None
    softcap: bool = False  # scores soft-capped (attn/softcap.cuh; the cap is a parameter)
    window: bool = False  # a sliding window (attn/mask.cuh; the bounds are parameters)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)  # one variant, one name
        if self.head_dim in KERNEL_HEAD_DIMS and self.head_dim_v != self.head_dim:
            raise ValueError(f"head_dim_v must be {self.head_dim} at head_dim {self.head_dim}, "
                             f"got {self.head_dim_v!r}")
        if (self.kernel_head_dim, self.kernel_head_dim_v) not in FORWARD_TILES:
            widths = sorted(v for d, v in FORWARD_TILES if d == self.head_dim)
            raise ValueError(f"head_dim_v must be one of {widths} at head_dim {self.head_dim}, "
                             f"got {self.head_dim_v!r}")
        if self.varlen and self.persistent:
            raise ValueError("a varlen forward runs one CTA a query tile: persistent=False")
        if self.window and self.persistent:
            raise ValueError("a window forward runs one CTA a query tile: persistent=False")

    @property
    def kernel_head_dim_v(self) -> int:
        return kernel_head_dim(self.head_dim_v)

    @property
    def tiles(self) -> ForwardTiles:
        return FORWARD_TILES[self.kernel_head_dim, self.kernel_head_dim_v]

    @property
    def block_m(self) -> int:
        return self.tiles.block_m

    @property
    def block_n(self) -> int:
        return self.tiles.block_n

    @property
    def kernel_name(self) -> str:
        width = "" if self.head_dim_v == self.head_dim else f"v{self.head_dim_v}"
        name = (f"dashgen_fwd_{self.dtype}_d{self.head_dim}{width}_"
                f"{_mask_name(self.causal, self.window)}")
        return name + ("_persistent" if self.persistent else "") + (
            "_varlen" if self.varlen else "") + ("_softcap" if self.softcap else "")

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(FwdWindowParams if self.window else FwdParams)


@dataclass(frozen=True, repr=False)  # _Variant.__repr__
class BackwardVariant(_Variant):
    """The Hopper backward (persistent, warp-specialized: a producer warp, a dQ writer warp, two
    wgmma warpgroups), with its preprocess and convert kernels in the same module.

    fused_convert: in the deterministic backward, two idle producer-warpgroup warps convert dQ
    tiles to 16 bits as their sums become final, so the convert kernel has nothing left to do.
    early_kv: a KV segment's K/V are freed once its last dQ MMA has landed and the next
    segment's loads start then. dq_last: a task's dQ wgmmas after dK's and Q/dO freed before
    the dQ hand-off (for long sequences). trace: the dQ writer records each task's hand-off
    times.
    schedule: the policy compiled into the kernel (SCHEDULE_POLICIES), or "table" for a
    schedule file's task table. varlen: a pack of sequences of their own lengths (cu_seqlens),
    dealt by the policy's pack deal from orders a plan kernel computes on the GPU.
    """

    template: ClassVar[str] = "attn_bwd_sm90.cu.j2"
    head_dims: ClassVar[tuple[int, ...]] = tuple(sorted(HEAD_DIMS + BACKWARD_BUILT_HEAD_DIMS))
    dtype: str
    head_dim: int
    causal: bool
    schedule: str
    deterministic: bool = True
    gqa: bool = False
    fused_convert: bool = False
    early_kv: bool = False
    trace: bool = False
    varlen: bool = False
    dq_last: bool = False
    softcap: bool = False  # scores soft-capped (attn/softcap.cuh; the cap is a parameter)
    window: bool = False  # a sliding window (attn/mask.cuh, sched::WindowTiling; bounds: params)
    head_dim_v: int | None = None  # V's, O's and dO's columns (None: head_dim's)
    # dQ writer lanes, a staging buffer each (AttnBwdSm90::kDqWriters): 2 where select's
    # DQ_WRITERS_FROM_KV_TILES say so (docs/design.md, `dq-writers`).
    dq_writers: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dq_writers not in (1, 2) or isinstance(self.dq_writers, bool):
            raise ValueError(f"dq_writers must be 1 or 2, got {self.dq_writers!r}")
        # The second writer takes the converter's warp 2 and one buffer of the one-piece
        # hand-off: the 64 and 128 kernels. At 64 with dq_last it spilled 96 bytes against one
        # writer's 56 (ptxas, CUDA 13.0), so that pair is refused.
        if self.dq_writers == 2 and (self.kernel_head_dim not in DQ_WRITERS_KERNEL_HEAD_DIMS
                                     or self.fused_convert):
            raise ValueError(f"dq_writers=2 needs the kernel of head_dim "
                             f"{' or '.join(map(str, DQ_WRITERS_KERNEL_HEAD_DIMS))} without "
                             f"fused_convert (its converter takes warp 2); head_dim "
                             f"{self.head_dim}, fused_convert={self.fused_convert}")
        if self.dq_writers == 2 and self.dq_last and self.kernel_head_dim == 64:
            raise ValueError("dq_writers=2 with dq_last at head_dim 64 spills 40 bytes more than "
                             "one writer: not built")
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)  # one variant, one name
        if self.head_dim_v != self.head_dim:
            check_head_dim_v(self.head_dim, self.head_dim_v)
            if self.gqa:
                raise ValueError(f"head_dim_v {self.head_dim_v} under head_dim {self.head_dim} "
                                 f"runs without GQA (the grouped dK/dV sums are converted at "
                                 f"one width)")
        if self.varlen and (self.schedule == "table" or self.fused_convert or self.trace):
            raise ValueError("a varlen backward runs a named schedule without fused_convert "
                             "or trace")
        if self.schedule not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULE_POLICIES)}, "
                             f"got {self.schedule!r}")
        if self.varlen and self.listed:
            raise ValueError(f"schedule={self.schedule!r} deals one fixed shape's units; a "
                             f"pack has its own deal (use 'spt')")
        if self.dq_last and self.kernel_head_dim not in DQ_LAST_HEAD_DIMS:
            raise ValueError(f"dq_last serves head_dim {DQ_LAST_HEAD_DIMS}, got head_dim "
                             f"{self.head_dim}")
        if self.window and self.schedule not in WINDOW_SCHEDULES:
            raise ValueError(f"a window backward runs one of the schedules {WINDOW_SCHEDULES}")
        if self.swapped and self.fused_convert:  # (dq_last is refused above: DQ_LAST_HEAD_DIMS)
            raise ValueError(f"head_dim {self.head_dim} runs the swapped mainloop, whose dQ the "
                             f"convert kernel converts: no fused_convert")
        if self.fused_convert and not self.deterministic:
            raise ValueError("fused_convert needs deterministic=True: the non-deterministic "
                             "backward cannot tell when a dQ sum is final")

    @property
    def listed(self) -> bool:
        """Whether the kernel walks a listed deal (BwdParams::unit_deal, sched::DealtWalk)."""
        return not self.table and BUILDERS[self.schedule].listed

    @property
    def constants(self) -> BackwardConstants:
        return BACKWARD_CONSTANTS[self.kernel_head_dim, self.causal]

    @property
    def block_m(self) -> int:
        return self.constants.block_m

    @property
    def block_n(self) -> int:
        return self.constants.block_n

    @property
    def swapped(self) -> bool:
        return self.constants.swapped

    @property
    def dq_per_warpgroup(self) -> bool:
        return self.constants.dq_per_warpgroup

    @property
    def table(self) -> bool:
        return self.schedule == "table"

    @property
    def policy_header(self) -> str | None:
        return SCHEDULE_POLICIES[self.schedule][0]

    @property
    def policy_class(self) -> str | None:
        return SCHEDULE_POLICIES[self.schedule][1]

    @property
    def schedule_id(self) -> int:
        """The policy's number in the kernel (the watchdog reports it); 0 for the table."""
        return 0 if self.table else BUILDERS[self.schedule].kernel_id

    @property
    def kernel_name(self) -> str:
        mode = "det" if self.deterministic else "nondet"
        width = "" if self.head_dim_v == self.head_dim else f"v{self.head_dim_v}"
        name = (f"dashgen_bwd_{self.dtype}_d{self.head_dim}{width}_"
                f"{_mask_name(self.causal, self.window)}_"
                f"{SCHEDULE_POLICIES[self.schedule][2]}_{mode}")
        for flag, tag in ((self.gqa, "gqa"), (self.fused_convert, "fconv"),
                          (self.early_kv, "ekv"), (self.dq_last, "dqlast"),
                          (self.trace, "trace"),
                          (self.varlen, "varlen"), (self.softcap, "softcap"),
                          (self.dq_writers == 2, "w2")):
            if flag:
                name += "_" + tag
        return name

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(BwdParams)


_P = ctypes.c_void_p
_I = ctypes.c_int32
_F = ctypes.c_float


class ParamBlock(ctypes.Structure):
    """A kernel's parameter block, filled by field name only: with 14-40 fields of the same
    types, a positional argument in the wrong place would still type-check and launch. Fields
    not named are zero."""

    def __init__(self, **fields):
        names = {name for cls in type(self).__mro__ for name, _ in getattr(cls, "_fields_", ())}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}")
        super().__init__(**fields)


class FwdParams(ParamBlock):
    """Mirror of dashgen::FwdParams (templates/include/dashgen/attn/params.cuh)."""

    _fields_ = [("q", _P), ("k", _P), ("v", _P), ("o", _P), ("lse", _P),
                ("batch", _I), ("heads_q", _I), ("heads_kv", _I), ("seqlen_q", _I),
                ("seqlen_k", _I), ("q_row_stride", _I), ("k_row_stride", _I),
                ("o_row_stride", _I), ("softmax_scale", _F),
                ("cu_seqlens_q", _P), ("cu_seqlens_k", _P), ("pack_fault", _P),
                ("total_q", _I), ("total_k", _I), ("softcap", _F),
                ("tanh_scale", _F)]


class FwdWindowParams(FwdParams):
    """Mirror of dashgen::FwdWindowParams: a sliding-window forward's block, FwdParams and
    the window's bounds."""

    _fields_ = [("window_left", _I), ("window_right", _I)]


def softcap_fields(softmax_scale: float, softcap: float) -> dict:
    """FwdParams' and BwdParams' soft-capping fields (attn/softcap.cuh): the cap, and the
    scores' factor before the tanh, formed once here so both kernels read the same float."""
    return dict(softcap=softcap, tanh_scale=softmax_scale / softcap if softcap else 0.0)


# Columns of a traced backward's rows (templates/include/dashgen/ptx/timer.cuh): b, h, n, m,
# dq_rank, the adds the counter had seen; then the SM clock (cycles) when the dQ writer had the
# task's partial, when the counter reached its rank and when its add had landed; then the GPU's
# nanosecond timer at the same three points. Clocks and timer are their low 32 bits.
TRACE_COLUMNS = 12


class BwdParams(ParamBlock):
    """Mirror of dashgen::BwdParams."""

    _fields_ = [(name, _P) for name in (
        "q", "k", "v", "dout", "lse", "dpsum", "dq_accum", "dk", "dv", "dk_accum", "dv_accum",
        "dq_counters", "dkv_counters", "tasks", "worker_offsets", "trace", "stall")] + [
        (name, _I) for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
                                "q_row_stride", "k_row_stride", "num_m_blocks", "num_n_blocks")] + [
        ("softmax_scale", _F), ("watchdog_ms", ctypes.c_uint32), ("stats", _P), ("dq", _P),
        ("cu_seqlens_q", _P), ("cu_seqlens_k", _P), ("pack_plan", _P), ("max_units", _I),
        ("pack_fault", _P), ("total_q", _I), ("total_k", _I), ("unit_deal", _P),
        ("softcap", _F), ("tanh_scale", _F), ("window_left", _I), ("window_right", _I)]


# The watchdog's record (params.cuh): STALL_WORDS uint32 per worker and role, word 0
# STALL_MAGIC once filled. Role 2 (the GQA dK/dV add) waits unbounded and writes no record.
STALL_MAGIC = 0x57A11ED
STALL_WORDS = 16
STALL_ROLES = {1: "dQ writer", 3: "dQ converter"}


class PrepParams(ParamBlock):
    """Mirror of dashgen::PrepParams."""

    _fields_ = [("o", _P), ("dout", _P), ("dpsum", _P), ("dq_accum", _P), ("zero", _P),
                ("zero_vec4s", ctypes.c_int64),
                ("batch", _I), ("heads", _I), ("seqlen", _I), ("row_stride", _I),
                ("padded_rows", _I), ("zero_dq", _I), ("lse", _P), ("stats", _P),
                ("cu_seqlens", _P), ("tile_seq", _P), ("d_scale", _F)]


class ConvertParams(ParamBlock):
    """Mirror of dashgen::ConvertParams."""

    _fields_ = [("src", _P), ("dst", _P), ("counters", _P), ("batch", _I), ("heads", _I),
                ("seqlen", _I), ("row_stride", _I), ("padded_rows", _I), ("swizzled", _I),
                ("block_m", _I), ("cu_seqlens", _P), ("tile_seq", _P)]
