"""Kernel configurations: the typed values templates are rendered from, their parameter blocks
as the host lays them out, and the shared-memory sizes the templates assert against.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from .render import KernelConfig, KernelSource, render

CUDA_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}
SUPPORTED_HEAD_DIMS = (64, 128)
BLOCK_M = 64  # one 16-row strip per warp, 4 warps
BLOCK_N = 64


def _check(dtype: str, head_dim: int) -> None:
    if dtype not in CUDA_TYPES:
        raise ValueError(f"dtype must be one of {sorted(CUDA_TYPES)}, got {dtype!r}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")


class _Element16Config(KernelConfig):
    """What every attention kernel config shares: a checked 16-bit dtype and head_dim."""

    dtype: str
    head_dim: int

    def __post_init__(self) -> None:
        _check(self.dtype, self.head_dim)

    @property
    def cuda_type(self) -> str:
        return CUDA_TYPES[self.dtype]

    @property
    def prep_params_bytes(self) -> int:
        """sizeof the preprocess kernel's parameters (the backward templates assert it)."""
        return ctypes.sizeof(PrepParams)

    @property
    def convert_params_bytes(self) -> int:
        """sizeof the convert kernel's parameters (the backward templates assert it)."""
        return ctypes.sizeof(ConvertParams)


@dataclass(frozen=True)
class FwdConfig(_Element16Config):
    prefix = "dashgen_attn_fwd"
    dtype: str
    head_dim: int
    causal: bool
    block_m: int = BLOCK_M
    block_n: int = BLOCK_N

    @property
    def smem_bytes(self) -> int:
        ld = self.head_dim + 8
        return (self.block_m + 2 * self.block_n) * ld * 2

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(FwdParams)


@dataclass(frozen=True)
class BwdConfig(_Element16Config):
    prefix = "dashgen_attn_bwd"
    dtype: str
    head_dim: int
    causal: bool
    deterministic: bool = True
    gqa: bool = False
    trace: bool = False
    block_m: int = BLOCK_M
    block_n: int = BLOCK_N

    @property
    def smem_bytes(self) -> int:
        d, bm, bn = self.head_dim, self.block_m, self.block_n
        fp32 = (bm * d + 2 * bn * d + 2 * bm) * 4
        tiles = (2 * bm + 2 * bn) * (d + 8) * 2
        scores = 2 * bm * (bn + 8) * 2
        return fp32 + tiles + scores

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(BwdParams)


# Query rows per task of the Hopper backward, by head_dim: at 64 a 128-row task doubles the
# tensor-core work per fixed per-task cost (barriers, waits, the dQ hand-off). A module value,
# so that a script can set it back to 64 for an A/B run before the first call.
SM90_BWD_BLOCK_M = {64: 128, 128: 64}
# Whether the preprocess lays lse and D out per query tile for the producer's bulk copies
# (Sm90BwdConfig.staged_stats), by head_dim. Measured on the H200 at 128: main kernel -4 to -5%
# at 1k-4k tokens per sequence, within 1% at 16k (docs/perf-notes.md, v3.7); at 64 it spills.
SM90_BWD_STAGED_STATS = {64: False, 128: True}
# Whether dS goes to shared memory through stmatrix, per (head_dim, causal)
# (Sm90BwdConfig.ds_stmatrix). Main kernel on the H200, on / off: head_dim 128 0.96-0.99;
# head_dim 64 causal 0.98-0.99 but full 1.02-1.03 (docs/perf-notes.md, v4.0).
SM90_BWD_DS_STMATRIX = {(64, False): False, (64, True): True, (128, False): True, (128, True): True}
SM90_MAX_SMEM_BYTES = 232448  # dynamic shared memory one block may opt into on sm_90 (227 KB)


@dataclass(frozen=True)
class Sm90BwdConfig(_Element16Config):
    """The Hopper-native backward (TMA, wgmma, warp specialization): bf16 or fp16, head_dim 64
    or 128, GQA or not."""

    prefix = "dashgen_attn_bwd_sm90"
    dtype: str
    head_dim: int
    causal: bool
    deterministic: bool = True
    trace: bool = False
    gqa: bool = False
    block_m: int | None = None  # None: SM90_BWD_BLOCK_M[head_dim]
    block_n: int = 128
    # setmaxnreg split of the 65536 registers: producer/writer warpgroup, each MMA warpgroup.
    producer_registers: int = 24
    mma_registers: int = 240
    # An experiment, off: dS in two buffers that alternate by task, one barrier between the
    # MMA warpgroups less per task. Measured on the H200 at head_dim 128 within 1% of the
    # default (docs/perf-notes.md, v3.6). Fits the shared memory at block_m 64 only.
    double_ds: bool = False
    # The deterministic dQ writer of rank 0 stores its tile instead of adding it onto zeros, so
    # the preprocess kernel skips zeroing the fp32 dQ accumulator: 134 MB less HBM traffic at
    # 16384 tokens x hidden 2048, -30 us of preprocess on the H200 (docs/perf-notes.md).
    first_dq_store: bool = True
    # An experiment, off until measured on a GPU: S^T and dP^T in separate commit groups, P^T
    # computed while dP^T is still on the tensor cores, and dV += P^T dO issued before the dS
    # exchange between the warpgroups, so the tensor cores work through the softmax and the
    # exchange. P^T stays fp32 in S^T's registers: no register more than the default at peak.
    overlap_softmax: bool = False
    # The preprocess kernel lays lse (as log2) and D out per query tile and the producer
    # bulk-copies them with each stage's Q and dO, so the MMA warpgroups neither load them from
    # global memory nor wait at a barrier for them. None: SM90_BWD_STAGED_STATS[head_dim].
    staged_stats: bool | None = None
    # In the deterministic backward, two idle warps of the producer warpgroup convert dQ tiles
    # to 16 bits as their sums become final (a share of the tiles per worker, in the order the
    # schedule finishes them, bulk-copied into shared memory 8 KB at a time), so the convert
    # kernel (~50 us at 16384 tokens x hidden 2048) has nothing left to do. Measured on the H200
    # it costs the main kernel 1-4%, so the runtime turns it on per problem where the saving
    # wins (runtime.SM90_BWD_OPTIONS, kernel_model.fuses_convert; docs/perf-notes.md, v3.8).
    # No effect on the non-deterministic backward.
    fused_convert: bool = False
    # A KV segment's K/V are freed once its last task's dQ MMA has landed (not after its dK/dV
    # stores), and the producer sends the next segment's first Q/dO before them: the next
    # segment's loads overlap the end of this one. Measured on the H200 it pays where segments
    # are short (1k causal: main kernel -1.5 to -3.4%) and costs up to 2.5% where they are long,
    # so the runtime turns it on per problem (runtime.SM90_BWD_OPTIONS,
    # kernel_model.early_kv_pays; docs/perf-notes.md, v3.9).
    early_kv: bool = False
    # dS goes to shared memory through transposing stmatrix (a thread's 16 query rows at a time)
    # instead of one 16-bit store per element, in the MMA warpgroups' stretch between the softmax
    # and dQ's MMA. The same values in the same places, so the same bits. Measured on the H200
    # at head_dim 128: the main kernel 1% faster at 1k, 2-4.5% at 4k-16k (docs/perf-notes.md,
    # v3.9). At head_dim 64 (128-row tasks) the stores run inside the softmax loop (after it,
    # ptxas spilled); there it pays with the causal mask only. None:
    # SM90_BWD_DS_STMATRIX[head_dim, causal].
    ds_stmatrix: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_m is None:
            object.__setattr__(self, "block_m", SM90_BWD_BLOCK_M[self.head_dim])
        if self.staged_stats is None:
            object.__setattr__(self, "staged_stats", SM90_BWD_STAGED_STATS[self.head_dim])
        if self.ds_stmatrix is None:  # it gives way to the options it cannot run beside
            object.__setattr__(self, "ds_stmatrix",
                               SM90_BWD_DS_STMATRIX[self.head_dim, self.causal]
                               and not self.double_ds
                               and not (self.overlap_softmax and self.head_dim == 64))
        if self.block_n != 128 or self.block_m not in (64, 128):
            raise ValueError(f"the Hopper backward runs 64 or 128 query rows x 128 KV rows, got "
                             f"block_m={self.block_m}, block_n={self.block_n}")
        if self.block_m == 128 and self.head_dim != 64:
            raise ValueError("block_m=128 fits the registers at head_dim 64 only, got "
                             f"head_dim={self.head_dim}")
        if self.ds_stmatrix and self.double_ds:
            raise ValueError("ds_stmatrix spills registers beside double_ds; choose one")
        if self.ds_stmatrix and self.overlap_softmax and self.head_dim == 64:
            # Its dS stores inside the softmax loop assume the dS tile is free when the loop
            # starts; overlap_softmax reorders that stretch (the pair failed the float64 and
            # same-bits tests on the H200).
            raise ValueError("ds_stmatrix cannot run beside overlap_softmax at head_dim 64; "
                             "choose one")
        if self.staged_stats and self.head_dim != 128:
            raise ValueError("staged_stats spills registers at head_dim 64 in some "
                             "configurations; it is offered at head_dim 128 only")
        if self.overlap_softmax and self.head_dim == 64 and self.gqa:
            raise ValueError("overlap_softmax spills registers at head_dim 64 with GQA (128-row "
                             "tasks beside the ordered dK/dV adds)")
        if self.smem_bytes > SM90_MAX_SMEM_BYTES:
            raise ValueError(f"{self.smem_bytes} bytes of shared memory exceed the "
                             f"{SM90_MAX_SMEM_BYTES} an sm_90 block may use (double_ds="
                             f"{self.double_ds}, fused_convert={self.fused_convert}, "
                             f"block_m={self.block_m}, "
                             f"head_dim={self.head_dim})")

    @staticmethod
    def supports(dtype: str, head_dim: int, gqa: bool) -> bool:
        """What the template instantiates (kernel='sm90' may ask for it)."""
        return dtype in ("bf16", "fp16") and head_dim in (64, 128)

    @staticmethod
    def blocks_for(head_dim: int) -> tuple[int, int]:
        """(block_m, block_n) the runtime runs at a head_dim (SM90_BWD_BLOCK_M)."""
        return SM90_BWD_BLOCK_M[head_dim], 128

    @staticmethod
    def serves(dtype: str, head_dim: int, gqa: bool) -> bool:
        """What kernel='auto' picks it for: every case it supports, each checked on an H200
        against an fp64 reference (scripts/gpu_check.py --kernel sm90, tests/gpu)."""
        return Sm90BwdConfig.supports(dtype, head_dim, gqa)

    @property
    def smem_bytes(self) -> int:
        d, bm, bn, stages = self.head_dim, self.block_m, self.block_n, 2
        ds = (2 if self.double_ds else 1) * bm * bn * 2
        tiles = 2 * bn * d * 2 + 2 * stages * bm * d * 2 + ds + stages * bm * d * 4
        stats = 2 * 2 * bm * 4  # lse and D rows, one copy per MMA warpgroup
        barriers = (2 + 4 * stages) * 8
        task_slots = stages * 32  # the producer's hand-off of each stage's task
        base = tiles + stats + barriers + task_slots
        if self.converts_dq:
            # The converter's barriers and slots (128 bytes, 128-aligned), then two chunk
            # buffers: 8 KB chunks where they fit, else 4 KB (AttnBwdSm90::kConvChunkBytes).
            base = -(-base // 128) * 128 + 128
            chunk = 8192 if base + 2 * 8192 + 1024 <= SM90_MAX_SMEM_BYTES else 4096
            base += 2 * chunk
        return base + 1024  # + slack to align the base to 1 KB

    @property
    def converts_dq(self) -> bool:
        """Whether the main kernel writes the 16-bit dQ itself (fused_convert, deterministic)."""
        return self.fused_convert and self.deterministic

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(BwdParams)


def sm90_bwd_refusal(head_dim: int, gqa: bool, **options) -> str | None:
    """Why the Hopper backward refuses these Sm90BwdConfig options at this head_dim (with or
    without GQA), or None where it takes them."""
    try:
        Sm90BwdConfig("bf16", head_dim, False, gqa=gqa, **options)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Sm90FwdConfig(_Element16Config):
    """The Hopper-native forward (TMA, wgmma): bf16 or fp16, head_dim 64 or 128, 128 query rows
    a CTA."""

    prefix = "dashgen_attn_fwd_sm90"
    dtype: str
    head_dim: int
    causal: bool
    block_m: int = 128
    block_n: int = 128
    # A grid of fewer CTAs (runtime: as few as keep the busiest as busy as one per SM would),
    # each walking query tiles and loading the next one's Q and K/V while it finishes the last
    # (fwd_sm90_persistent.cuh; the runtime decides per problem, kernel_model). Under a causal
    # mask the grid holds whole heads' tiles (runtime.forward_ctas).
    persistent: bool = False

    @staticmethod
    def supports(dtype: str, head_dim: int) -> bool:
        return dtype in ("bf16", "fp16") and head_dim in (64, 128)

    @staticmethod
    def serves(dtype: str, head_dim: int) -> bool:
        """What kernel='auto' picks it for: every case it supports, each checked on an H200."""
        return Sm90FwdConfig.supports(dtype, head_dim)

    @property
    def smem_bytes(self) -> int:
        d, bm, bn, stages = self.head_dim, self.block_m, self.block_n, 2
        barriers = (2 if self.persistent else 1) + 4 * stages  # Q's empty barrier if persistent
        return bm * d * 2 + 2 * stages * bn * d * 2 + barriers * 8 + 1024

    @property
    def params_bytes(self) -> int:
        return ctypes.sizeof(FwdParams)


def render_fwd_sm90(cfg: Sm90FwdConfig) -> KernelSource:
    return render("attn_fwd_sm90.cu.j2", cfg)


def render_bwd_sm90(cfg: Sm90BwdConfig) -> KernelSource:
    return render("attn_bwd_sm90.cu.j2", cfg)


def render_fwd(cfg: FwdConfig) -> KernelSource:
    return render("attn_fwd.cu.j2", cfg)


def render_bwd(cfg: BwdConfig) -> KernelSource:
    return render("attn_bwd.cu.j2", cfg)


def render_config(cfg: FwdConfig | BwdConfig | Sm90FwdConfig | Sm90BwdConfig) -> KernelSource:
    """The source of any kernel config (the runtime and `dashgen emit` both render through it)."""
    render_of = {BwdConfig: render_bwd, Sm90BwdConfig: render_bwd_sm90, FwdConfig: render_fwd,
                 Sm90FwdConfig: render_fwd_sm90}
    return render_of[type(cfg)](cfg)


# -- which kernel serves a problem: the one source of truth for runtime and emit ------------------

def forward_kind(dtype: str, head_dim: int, hopper: bool = True) -> str:
    """'sm90' (Sm90FwdConfig) where the Hopper forward serves the problem and `hopper` allows
    it, else 'mma' (FwdConfig)."""
    return "sm90" if hopper and Sm90FwdConfig.serves(dtype, head_dim) else "mma"


def forward_config_of(kind: str, dtype: str, head_dim: int, causal: bool,
                      persistent: bool = False) -> FwdConfig | Sm90FwdConfig:
    """The config of forward kernel `kind` ('sm90' or 'mma') for a problem (`persistent`: the
    Hopper forward's, Sm90FwdConfig.persistent)."""
    if kind == "sm90":
        return Sm90FwdConfig(dtype, head_dim, causal, persistent=persistent)
    return FwdConfig(dtype, head_dim, causal)


def forward_config(dtype: str, head_dim: int, causal: bool,
                   hopper: bool = True) -> FwdConfig | Sm90FwdConfig:
    """The config of the forward kernel that serves the problem (see forward_kind)."""
    FwdConfig(dtype, head_dim, causal)  # names a bad dtype or head_dim first
    return forward_config_of(forward_kind(dtype, head_dim, hopper), dtype, head_dim, causal)


def backward_kind(dtype: str, head_dim: int, gqa: bool, hopper: bool = True) -> str:
    """'sm90' (Sm90BwdConfig) where the Hopper backward serves the problem and `hopper` allows
    it, else 'mma' (BwdConfig). The runtime passes its SM90_DEFAULT switch as `hopper`."""
    return "sm90" if hopper and Sm90BwdConfig.serves(dtype, head_dim, gqa) else "mma"


def blocks_of(kind: str, head_dim: int) -> tuple[int, int]:
    """(block_m, block_n) of a backward kernel kind at a head_dim: the tiles its schedules are
    built with."""
    if kind == "sm90":
        return Sm90BwdConfig.blocks_for(head_dim)
    return BLOCK_M, BLOCK_N


def backward_blocks(dtype: str, head_dim: int, gqa: bool, hopper: bool = True) -> tuple[int, int]:
    """(block_m, block_n) of the backward kernel that serves the problem (see backward_kind)."""
    return blocks_of(backward_kind(dtype, head_dim, gqa, hopper), head_dim)


def config_of(kind: str, dtype: str, head_dim: int, causal: bool, gqa: bool = False,
              deterministic: bool = True, trace: bool = False) -> BwdConfig | Sm90BwdConfig:
    """The config of backward kernel `kind` ('sm90' or 'mma') for a problem."""
    if kind == "sm90":
        return Sm90BwdConfig(dtype, head_dim, causal, deterministic=deterministic, trace=trace,
                             gqa=gqa)
    return BwdConfig(dtype, head_dim, causal, deterministic=deterministic, gqa=gqa, trace=trace)


def backward_config(dtype: str, head_dim: int, causal: bool, gqa: bool = False,
                    deterministic: bool = True, trace: bool = False,
                    hopper: bool = True) -> BwdConfig | Sm90BwdConfig:
    """The config of the backward kernel that serves the problem (see backward_kind)."""
    return config_of(backward_kind(dtype, head_dim, gqa, hopper), dtype, head_dim, causal, gqa,
                     deterministic, trace)


_P = ctypes.c_void_p
_I = ctypes.c_int32
_F = ctypes.c_float


class FwdParams(ctypes.Structure):
    """Mirror of dashgen::FwdParams (templates/include/dashgen/attn/params.cuh)."""

    _fields_ = [("q", _P), ("k", _P), ("v", _P), ("o", _P), ("lse", _P),
                ("batch", _I), ("heads_q", _I), ("heads_kv", _I), ("seqlen_q", _I),
                ("seqlen_k", _I), ("q_row_stride", _I), ("k_row_stride", _I),
                ("o_row_stride", _I), ("softmax_scale", _F)]


# Columns of a traced backward's rows (templates/include/dashgen/ptx/timer.cuh): b, h, n, m,
# dq_rank, the adds the counter had seen; then the SM clock (cycles) when the dQ writer had the
# task's partial, when the counter reached its rank and when its add had landed; then the GPU's
# nanosecond timer at the same three points. Clocks and timer are their low 32 bits.
TRACE_COLUMNS = 12


class BwdParams(ctypes.Structure):
    """Mirror of dashgen::BwdParams."""

    _fields_ = [(name, _P) for name in (
        "q", "k", "v", "dout", "lse", "dpsum", "dq_accum", "dk", "dv", "dk_accum", "dv_accum",
        "dq_counters", "dkv_counters", "tasks", "worker_offsets", "trace")] + [
        (name, _I) for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
                                "q_row_stride", "k_row_stride", "num_m_blocks", "num_n_blocks")] + [
        ("softmax_scale", _F), ("stats", _P), ("dq", _P), ("dq_counts", _P), ("conv_tiles", _P),
        ("conv_offsets", _P)]


class PrepParams(ctypes.Structure):
    """Mirror of dashgen::PrepParams."""

    _fields_ = [("o", _P), ("dout", _P), ("dpsum", _P), ("dq_accum", _P), ("zero", _P),
                ("zero_vec4s", ctypes.c_int64),
                ("batch", _I), ("heads", _I), ("seqlen", _I), ("row_stride", _I),
                ("padded_rows", _I), ("zero_dq", _I), ("lse", _P), ("stats", _P)]


class ConvertParams(ctypes.Structure):
    """Mirror of dashgen::ConvertParams."""

    _fields_ = [("src", _P), ("dst", _P), ("counters", _P), ("batch", _I), ("heads", _I),
                ("seqlen", _I), ("row_stride", _I), ("padded_rows", _I), ("swizzled", _I),
                ("block_m", _I)]


PREP_ROWS_PER_BLOCK = 16  # AttnPreprocess / AttnConvert::kRowsPerBlock
