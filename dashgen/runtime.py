"""The kernels' Python driver: builds, verifies and lowers schedules, compiles and loads kernels
(cached), and launches forward and backward on PyTorch's current stream.

Only this module and the torch op touch torch and the driver. Every cache here is keyed by what
fixes the result (problem, schedule, worker count, kernel config), never by a device property.
"""
from __future__ import annotations

import ctypes
import math
import sys
import time
from functools import lru_cache

import torch

from . import launch, plan_cache
from .bounded_cache import BoundedCache
from .cache import get_or_compile
from .kernels import (BLOCK_M, PREP_ROWS_PER_BLOCK, SUPPORTED_HEAD_DIMS, TRACE_COLUMNS,
                      BwdParams, ConvertParams, FwdConfig, FwdParams, PrepParams, Sm90BwdConfig,
                      Sm90FwdConfig, backward_blocks, backward_kind, blocks_of, config_of,
                      forward_config_of, forward_kind, render_config, sm90_bwd_refusal)
from .kernel_model import early_kv_pays, forward_persistent_pays, fuses_convert
from .lower import lower, plan_tensors
from .problem import Mask, Problem
from .schedules import build_schedule
from .schedules.base import fewest_workers
from .verify import verify

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# Whether kernel="auto" picks the Hopper-native backward where it serves the problem (passed as
# `hopper` to dashgen.kernels.backward_kind/backward_blocks, which `dashgen emit` uses too).
SM90_DEFAULT = True
# setmaxnreg split (producer/writer warpgroup, each MMA warpgroup) of the Hopper backward.
SM90_REGISTERS = (24, 240)
# Switchable Sm90BwdConfig options of the backward, at their defaults (None: the config's own
# default for the head_dim): double_ds is an experiment (off; measured neutral at head_dim 128,
# does not fit head_dim 64's 128-row tasks), first_dq_store is on, overlap_softmax is an
# experiment (off; measured +1 to +6% main kernel at head_dim 64, -1 to +3% at 128),
# staged_stats is on where it fits (head_dim 128), fused_convert is decided per problem in the
# deterministic backward (None: kernel_model.fuses_convert, on for short sequences, where the
# convert kernel's ~50 us outweigh the converter's ~3% of the main kernel), early_kv is decided
# per problem (None: kernel_model.early_kv_pays, on where KV segments are short), ds_stmatrix
# is on where it fits (head_dim 128). Scripts switch them to compare (docs/perf-notes.md has
# the numbers).
SM90_BWD_OPTIONS = {"double_ds": False, "first_dq_store": True, "overlap_softmax": False,
                    "staged_stats": None, "fused_convert": None, "early_kv": None,
                    "ds_stmatrix": None}
# The Hopper forward on persistent CTAs (Sm90FwdConfig.persistent): None decides per problem
# (kernel_model.forward_persistent_pays: short KV loops); scripts set True or False to compare.
SM90_FWD_PERSISTENT: bool | None = None


def supported_head_dims() -> tuple[int, ...]:
    return SUPPORTED_HEAD_DIMS


class KernelConfig:
    """Tile sizes of the backward kernel that serves a problem; schedules are built with them."""

    def __init__(self, block_m: int, block_n: int):
        self.block_m = block_m
        self.block_n = block_n

    @classmethod
    def for_problem(cls, head_dim: int, dtype: str = "bf16", gqa: bool = False) -> "KernelConfig":
        return cls(*backward_blocks(dtype, head_dim, gqa, hopper=SM90_DEFAULT))


@lru_cache(maxsize=None)
def _load(cfg, device: int) -> dict[str, launch.Kernel]:
    """Compile (or read from the disk cache) and load a config's kernels, once per process; keyed
    by the frozen config, so a call never re-derives names or re-renders."""
    source = render_config(cfg)
    cubin, hit = get_or_compile(source)
    if not hit:
        main = cubin.resources.get(source.name)
        regs = f", {main.registers} registers, {main.spill_bytes} spill bytes" if main else ""
        print(f"dashgen: compiled {source.name} in {cubin.compile_seconds:.2f} s{regs}",
              file=sys.stderr)
    kernels = {}
    forward = isinstance(cfg, (FwdConfig, Sm90FwdConfig))
    for suffix in ("",) if forward else ("", "_preprocess", "_convert"):
        kernel = launch.load_kernel(cubin.data, source.name + suffix)
        if suffix == "":
            kernel.set_max_dynamic_shared_bytes(cfg.smem_bytes)
        kernels[suffix] = kernel
    return kernels


def _kernels(cfg, device: torch.device) -> dict[str, launch.Kernel]:
    launch.ensure_context(device.index or 0)
    return _load(cfg, device.index or 0)


def backward_kernel(q: torch.Tensor, k: torch.Tensor, kernel: str = "auto") -> str:
    """'sm90' (TMA + wgmma, warp-specialized) where it serves the problem, else 'mma'."""
    dtype, head_dim, gqa = _DTYPES[q.dtype], q.shape[3], q.shape[2] != k.shape[2]
    if kernel == "auto":
        return backward_kind(dtype, head_dim, gqa, hopper=SM90_DEFAULT)
    if kernel == "sm90" and not Sm90BwdConfig.supports(dtype, head_dim, gqa):
        raise ValueError("kernel='sm90' supports bf16 or fp16 with head_dim 64 or 128 only")
    if kernel not in ("sm90", "mma"):
        raise ValueError(f"kernel must be 'auto', 'sm90' or 'mma', got {kernel!r}")
    return kernel


def problem_of(q: torch.Tensor, k: torch.Tensor, causal: bool, kernel: str = "auto") -> Problem:
    """The schedule problem the backward kernel runs: its tile sizes come from the kernel."""
    return _problem(tuple(q.shape), tuple(k.shape), bool(causal),
                    backward_kernel(q, k, kernel))


@lru_cache(maxsize=256)
def _problem(q_shape: tuple, k_shape: tuple, causal: bool, kind: str) -> Problem:
    batch, seqlen_q, heads_q, head_dim = q_shape
    block_m, block_n = blocks_of(kind, head_dim)
    return Problem(batch=batch, heads_q=heads_q, heads_kv=k_shape[2], seqlen_q=seqlen_q,
                   seqlen_k=k_shape[1], head_dim=head_dim,
                   mask=Mask.causal() if causal else Mask.full(), block_m=block_m,
                   block_n=block_n)


def _int32_tensor(words) -> torch.Tensor:
    """An int32 array as a tensor that owns its memory: read as a buffer (torch.tensor walks it
    element by element, a second at 4M tasks), then cloned."""
    if not len(words):
        return torch.empty(0, dtype=torch.int32)
    return torch.frombuffer(words, dtype=torch.int32).clone()


_clock = time.perf_counter


@lru_cache(maxsize=4)  # the prepared launches keep theirs; this serves their construction
def _plan_tensors(problem: Problem, schedule: str, num_workers: int, device: torch.device):
    start = _clock()
    plan, hit = plan_cache.get_or_build(problem, schedule, num_workers,
                                        lambda: lower(_verified(problem, schedule, num_workers)))
    seconds = _clock() - start
    if not hit and seconds >= 1:  # long sequences: say why the first backward waits
        p = problem
        print(f"dashgen: built and verified the {schedule} schedule for batch {p.batch}, "
              f"{p.heads_q} heads, seqlen {p.seqlen_q}x{p.seqlen_k} ({plan.num_tasks} tasks, "
              f"{num_workers} workers) in {seconds:.1f} s",
              file=sys.stderr)
    tasks = _int32_tensor(plan.tasks).to(device)
    offsets = _int32_tensor(plan.worker_offsets).to(device)
    # The stream they were allocated on: a call on another stream must record its use of them
    # (several prepared launches may share these tensors, whatever stream each was built on).
    return plan, tasks, offsets, _allocation_stream(device)


def _conversion_plan(plan) -> tuple[list[int], list[int], list[int]]:
    """What the fused convert needs from a lowered plan: (counts, tiles, offsets).

    counts[m]: contributions to the dQ sum of a query tile in m_block m, one past its highest
    dq_rank (the tiles a task set covers are the same for every batch and head, so are the
    counts; checked). tiles/offsets: the dQ tiles, (batch * heads_q + head) * num_m_blocks +
    m_block, dealt round-robin to the workers in the order the schedule finishes them (the
    position of a tile's last add in its worker's task list), worker w's at
    tiles[offsets[w]:offsets[w + 1]]. Dealt, not left to the worker that adds last: the shift
    orders give some workers the last add of most of their tasks."""
    p = plan.problem
    words, offsets = plan_tensors(plan)
    tile = ((words[:, 0] >> 16) * p.heads_q + (words[:, 0] & 0xFFFF)) * p.num_m_blocks + (
        words[:, 1] & 0xFFFF)
    per_tile = torch.zeros(p.batch * p.heads_q * p.num_m_blocks, dtype=torch.int64)
    per_tile.scatter_reduce_(0, tile, words[:, 2] + 1, reduce="amax")
    per_m = per_tile.view(-1, p.num_m_blocks)
    if not torch.equal(per_m, per_m[:1].expand_as(per_m)):
        raise AssertionError("the schedule gives the query tiles of one m_block different counts")
    workers = len(offsets) - 1
    position = torch.arange(len(words)) - torch.repeat_interleave(offsets[:-1], offsets.diff())
    last = words[:, 2] + 1 == per_tile[tile]
    finished = torch.full_like(per_tile, -1)
    finished[tile[last]] = position[last]
    order = torch.argsort(finished, stable=True)  # ties: by tile
    order = order[finished[order] >= 0]  # tiles no task reaches: the convert kernel's
    dealt = torch.arange(len(order)) % workers
    by_worker = order[torch.argsort(dealt, stable=True)]
    bounds = torch.zeros(workers + 1, dtype=torch.int64)
    bounds[1:] = torch.bincount(dealt, minlength=workers).cumsum(0)
    return per_m[0].tolist(), by_worker.tolist(), bounds.tolist()


def _verified(problem: Problem, schedule: str, num_workers: int):
    # Not cached: only _plan_tensors (cached) asks, and the Schedule's Task objects are ~10x
    # the lowered table's bytes (tens of MB per signature at 16k tokens), garbage once lowered.
    s = build_schedule(schedule, problem, num_workers)
    verify(s)  # a schedule that could deadlock the kernel never reaches it
    return s


_TENSOR_MAPS: dict[tuple, object] = {}
_TENSOR_MAPS_MAX = 512


def _memo(cache: dict, key, make, *args, **kwargs):
    """cache[key], made by make(*args, **kwargs) on a miss. The caches keyed by tensor addresses
    grow with a job's address sets; one is emptied when it holds _TENSOR_MAPS_MAX entries (a
    rebuild costs microseconds). Callers keep what they got through their launch."""
    found = cache.get(key)
    if found is None:
        if len(cache) >= _TENSOR_MAPS_MAX:
            cache.clear()
        found = cache[key] = make(*args, **kwargs)
    return found


def _tensor_map(t: torch.Tensor, rows: int):
    """TMA descriptor of a (batch, seqlen, heads, head_dim) tensor in boxes of `rows` rows x 64
    columns (one 128-byte swizzle row); rows past seqlen read as zeros. A descriptor is a pure
    function of address, dtype, shape, strides and box, so it is cached under exactly those:
    training reuses the caching allocator's addresses, and encoding costs host time per call."""
    key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()), rows)
    return _memo(_TENSOR_MAPS, key, launch.encode_tensor_map, key[0], t.dtype, key[2], key[3],
                 (1, rows, 1, 64), swizzle=128)


# torch's raw getter is one C call; torch.cuda.current_stream builds a Stream object, host time
# the backward's first kernel waits on. CPU-only builds of torch lack it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device) -> int:
    """The CUstream handle of the current stream on `device` (a CUDA device with an index)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _allocation_stream(device: torch.device) -> int:
    """The stream tensors made now on `device` belong to (0 off CUDA), for record_stream."""
    return _stream(device) if device.type == "cuda" else 0


def _empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _empty_unfilled(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty without the NaN fill of deterministic mode: a bare storage from the same
    caching allocator (its constructor does not fill), viewed with the shape."""
    storage = torch.UntypedStorage(math.prod(shape) * dtype.itemsize, device=device)
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)


def _allocator():
    """How this call allocates its buffers. Under torch.use_deterministic_algorithms(True)
    torch fills every new tensor with NaN (so that a read of uninitialized memory gives the same
    bits each run). The buffers allocated here are written by the kernels before anything reads
    them (the outputs, the preprocess's rows, the dQ sums stored or zeroed by their first
    writer): the fill would be pure cost, ~0.3 GB of writes and four launches per backward at
    16384 tokens x hidden 2048. The global setting is left alone, so other threads' tensors
    keep their fill."""
    if (torch.are_deterministic_algorithms_enabled()
            and torch.utils.deterministic.fill_uninitialized_memory):
        return _empty_unfilled
    return _empty


def forward_kernel(q: torch.Tensor, kernel: str = "auto") -> str:
    """'sm90' (TMA + wgmma) or 'mma'; 'auto' takes the Hopper forward where it serves the problem
    (Sm90FwdConfig.serves)."""
    dtype, head_dim = _DTYPES[q.dtype], q.shape[3]
    if kernel == "auto":
        return forward_kind(dtype, head_dim, SM90_DEFAULT)
    if kernel == "sm90" and not Sm90FwdConfig.supports(dtype, head_dim):
        raise ValueError("kernel='sm90' supports bf16 or fp16 with head_dim 64 or 128 only")
    if kernel not in ("sm90", "mma"):
        raise ValueError(f"kernel must be 'auto', 'sm90' or 'mma', got {kernel!r}")
    return kernel


class _ForwardLaunch:
    """The forward's config and prepared launch for a signature, with the TMA descriptors of the
    q, k, v it has seen."""

    def __init__(self, kind: str, q_shape: tuple, dtype: str, causal: bool,
                 device: torch.device, persistent: bool = False):
        batch, seqlen_q, heads_q, head_dim = q_shape
        self.kind = kind
        block_m = Sm90FwdConfig.block_m if kind == "sm90" else BLOCK_M
        grid = (-(-seqlen_q // block_m), heads_q, batch)
        sms = _sm_count(device) if persistent and kind == "sm90" else 0
        # Under a causal mask the persistent order takes whole heads a round (grid[0] tiles
        # each); past the SM count the hardware's one-CTA-a-tile dispatch balances the tiles.
        persistent = persistent and sms > 0 and (not causal or grid[0] <= sms)
        cfg = self.cfg = forward_config_of(kind, dtype, head_dim, causal, persistent)  # validates
        kernel = _kernels(cfg, device)[""]
        if persistent:
            grid = (forward_ctas(grid[0], heads_q * batch, sms, causal), 1, 1)
        self.launcher = launch.Launcher(kernel, grid, 384 if kind == "sm90" else 128,
                                        cfg.smem_bytes)
        self._maps: dict[tuple, tuple] = {}

    def map_addresses(self, q, k, v) -> list[int]:
        """The Hopper forward's three descriptors (Q, K, V) as kernel-argument addresses. q, k
        and v are contiguous and q's shape is the signature's: their addresses and k's shape
        decide the descriptors, one lookup per call instead of three."""
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), k.shape)
        return _memo(self._maps, key, self._encode, q, k, v)[0]

    def _encode(self, q, k, v) -> tuple[list[int], tuple]:
        # Each MMA warpgroup loads its 64 query rows; K/V come in tiles of block_n keys.
        block_n = self.cfg.block_n
        maps = (_tensor_map(q, 64), _tensor_map(k, block_n), _tensor_map(v, block_n))
        # The addresses point into the descriptor objects: keep them with the addresses.
        return [int(m.getPtr()) for m in maps], maps


@lru_cache(maxsize=256)
def _forward_launch(kind: str, q_shape: tuple, dtype: str, causal: bool,
                    device: torch.device, persistent: bool) -> _ForwardLaunch:
    return _ForwardLaunch(kind, q_shape, dtype, causal, device, persistent)


def forward_ctas(m_tiles: int, heads: int, sms: int, causal: bool) -> int:
    """The persistent forward's grid for heads (batch x heads_q) of m_tiles query tiles each on
    `sms` SMs: as few CTAs as keep the busiest as busy as one a SM would (full mask), or whole
    heads' tiles a round (causal mask, m_tiles <= sms)."""
    tiles = m_tiles * heads
    if causal:
        return m_tiles * min(heads, sms // m_tiles)
    return fewest_workers(tiles, min(tiles, sms))


@lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def forward(q, k, v, *, causal: bool, softmax_scale: float, kernel: str = "auto"):
    """o and lse; q, k and v are contiguous."""
    kind = forward_kernel(q, kernel)
    persistent = SM90_FWD_PERSISTENT
    if persistent is None:
        persistent = forward_persistent_pays(k.shape[1], q.shape[3], bool(causal))
    fl = _forward_launch(kind, tuple(q.shape), _DTYPES[q.dtype], bool(causal), q.device,
                         persistent)
    batch, seqlen_q, heads_q, head_dim = q.shape
    empty = _allocator()
    o = empty(q.shape, q.dtype, q.device)  # q is contiguous: o is laid out like it
    lse = empty((batch, heads_q, seqlen_q), torch.float32, q.device)
    params = FwdParams(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                       batch, heads_q, k.shape[2], seqlen_q, k.shape[1],
                       q.stride(1), k.stride(1), o.stride(1), float(softmax_scale))
    addresses = [ctypes.addressof(params)]
    if kind == "sm90":
        addresses = fl.map_addresses(q, k, v) + addresses
    launch.make_current(q.device.index or 0)
    fl.launcher(_stream(q.device), addresses)
    return o, lse


class WorkspaceLayout:
    """The backward's fp32/int32 scratch, one allocation of `floats` words in parts (offsets in
    words, each on a 16-byte boundary): the fp32 dQ accumulator (zeroed row by row by the
    preprocess kernel, unless the Hopper backward's first writer of each tile stores into it:
    first_dq_store), rowsum(dO * O), the statistics per query tile that the preprocess kernel
    lays out for the Hopper backward's producer (staged_stats; empty without), then what the
    preprocess kernel clears as whole 16-byte vectors (`zeroed_offset` to the end): GQA's fp32
    dK/dV sums (empty without GQA), the dQ tile counters and the dK/dV tile counters."""

    PARTS = ("dq_accum", "dpsum", "stats", "dk_accum", "dv_accum", "dq_counters", "dkv_counters")

    def __init__(self, problem: Problem, staged_stats: bool = False):
        b, hq, hkv, d = problem.batch, problem.heads_q, problem.heads_kv, problem.head_dim
        gqa = problem.gqa
        kv = (b, hkv, problem.num_n_blocks * problem.block_n, d) if gqa else (0,)
        stats = (b, hq, problem.num_m_blocks, 2, problem.block_m) if staged_stats else (0,)
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


class _BackwardLaunch:
    """Everything a backward call needs that its shapes and options fix: the verified plan and
    its device tables, the workspace layout and the three prepared launches. Built once per
    signature, so a call only allocates, fills three parameter blocks and launches."""

    def __init__(self, kernel: str, problem: Problem, cfg, schedule: str, num_workers: int,
                 device: torch.device):
        self.problem, self.cfg = problem, cfg
        # first_dq_store: the first dQ writer of a tile stores, so the preprocess kernel does not
        # zero the accumulator and the convert kernel zeroes the tiles nobody wrote.
        self.first_dq_store = kernel == "sm90" and cfg.first_dq_store and cfg.deterministic
        self.plan, self.tasks, self.offsets, plan_stream = _plan_tensors(problem, schedule,
                                                                         num_workers, device)
        # (allocation stream, tensors) of every table the kernels read: see backward's end.
        self.tables = [(plan_stream, (self.tasks, self.offsets))]
        self.staged_stats = kernel == "sm90" and cfg.staged_stats
        # fused_convert: the main kernel writes dQ as each tile's sum becomes final. A
        # query tile no task reaches (causal, more query rows than keys) gets no contribution:
        # then the convert kernel still runs, and writes its zeros (first_dq_store's counters)
        # or the same bits again.
        self.converts_dq = kernel == "sm90" and cfg.converts_dq
        self.dq_counts = self.conv_tiles = self.conv_offsets = None
        self.runs_convert_q = True  # the convert kernel for dQ
        if self.converts_dq:
            counts, tiles, offsets = _conversion_plan(self.plan)
            self.dq_counts, self.conv_tiles, self.conv_offsets = (
                torch.tensor(x, dtype=torch.int32).to(device) for x in (counts, tiles, offsets))
            self.runs_convert_q = min(counts) == 0
            self.tables.append((_allocation_stream(device),
                                (self.dq_counts, self.conv_tiles, self.conv_offsets)))
        self.layout = WorkspaceLayout(problem, self.staged_stats)
        p = problem
        kernels = _kernels(cfg, device)
        padded_m, padded_n = p.num_m_blocks * p.block_m, p.num_n_blocks * p.block_n
        rows = PREP_ROWS_PER_BLOCK
        self.preprocess = launch.Launcher(kernels["_preprocess"],
                                          (-(-padded_m // rows), p.heads_q, p.batch), 128, 0)
        self.main = launch.Launcher(kernels[""], num_workers, 384 if kernel == "sm90" else 128,
                                    cfg.smem_bytes)
        self.convert_q = launch.Launcher(kernels["_convert"],
                                         (-(-p.seqlen_q // rows), p.heads_q, p.batch), 128, 0)
        self.convert_kv = launch.Launcher(kernels["_convert"],
                                          (-(-p.seqlen_k // rows), p.heads_kv, p.batch), 128, 0)
        self.padded_m, self.padded_n = padded_m, padded_n
        self.hopper = kernel == "sm90"
        # The workspace's parts as byte offsets from its start.
        self.part_bytes = tuple(4 * offset for offset in self.layout.offsets)
        self.zeroed_bytes = 4 * self.layout.zeroed_offset
        # The parameter blocks with what the signature fixes; a BackwardCall copies them and
        # fills in its pointers. Every tensor is contiguous, so its shape gives its row stride.
        q_stride, k_stride = p.heads_q * p.head_dim, p.heads_kv * p.head_dim
        self.prep_template = PrepParams(
            0, 0, 0, 0, 0, (self.layout.floats - self.layout.zeroed_offset) // 4, p.batch,
            p.heads_q, p.seqlen_q, q_stride, padded_m, not self.first_dq_store, 0, 0)
        self.params_template = BwdParams(
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, self.tasks.data_ptr(),
            self.offsets.data_ptr(), 0, p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k,
            q_stride, k_stride, p.num_m_blocks, p.num_n_blocks, 0.0, 0,
            *((0, self.dq_counts.data_ptr(), self.conv_tiles.data_ptr(),
               self.conv_offsets.data_ptr()) if self.converts_dq else (0, 0, 0, 0)))
        # The Hopper backward leaves dQ's sums in the accum_col layout; GQA's dK/dV sums
        # row-major.
        self.convert_q_template = ConvertParams(0, 0, 0, p.batch, p.heads_q, p.seqlen_q,
                                                q_stride, padded_m, self.hopper, p.block_m)
        self.convert_kv_template = ConvertParams(0, 0, 0, p.batch, p.heads_kv, p.seqlen_k,
                                                 k_stride, padded_n, False, p.block_n)
        self._maps: dict[tuple, tuple] = {}
        self._do_maps: dict[int, object] = {}

    def qkv_maps(self, q, k, v) -> tuple:
        """The Hopper backward's descriptors of q, k and v. Shapes and dtype are the
        signature's and the tensors contiguous, so their addresses decide the descriptors: one
        lookup instead of three."""
        return _memo(self._maps, (q.data_ptr(), k.data_ptr(), v.data_ptr()), self._encode_qkv,
                     q, k, v)

    def _encode_qkv(self, q, k, v) -> tuple:
        p = self.problem
        return _tensor_map(q, p.block_m), _tensor_map(k, p.block_n), _tensor_map(v, p.block_n)

    def do_map(self, do):
        """dO's TMA descriptor. Shape and dtype are the signature's and dO is contiguous, so its
        address alone decides the descriptor: one dictionary lookup per call."""
        return _memo(self._do_maps, do.data_ptr(), _tensor_map, do, self.problem.block_m)


def _backward_launch(kernel: str, q_shape: tuple, k_shape: tuple, dtype: str, causal: bool,
                     deterministic: bool, trace: bool, schedule: str, num_workers: int,
                     device: torch.device, registers: tuple[int, int],
                     options: tuple = ()) -> _BackwardLaunch:
    problem = _problem(q_shape, k_shape, causal, kernel)
    chosen = dict(options)
    if kernel == "sm90" and chosen.get("early_kv", False) is None:
        # None: per problem, from the plan's segment lengths (kernel_model.early_kv_pays).
        chosen["early_kv"] = early_kv_pays(
            _plan_tensors(problem, schedule, num_workers, device)[0])
    if kernel == "sm90" and deterministic and chosen.get("fused_convert", False) is None:
        # None: per problem, from the plan's longest worker (kernel_model.fuses_convert).
        fused = fuses_convert(_plan_tensors(problem, schedule, num_workers, device)[0])
        others = {name: value for name, value in chosen.items()
                  if value is not None and name != "fused_convert"}
        if fused and sm90_bwd_refusal(q_shape[3], problem.gqa, **others, fused_convert=True):
            fused = False  # the other options leave it no room (double_ds: shared memory)
        chosen["fused_convert"] = fused
    options = tuple((name, chosen[name]) for name, _ in options)
    cfg = _backward_config(kernel, dtype, q_shape[3], causal, problem.gqa, deterministic, trace,
                           registers, options)
    return _BackwardLaunch(kernel, problem, cfg, schedule, num_workers, device)


def _device_bytes(bl: _BackwardLaunch) -> int:
    return sum(t.numel() * t.element_size() for _, tables in bl.tables for t in tables)


# Prepared backward launches by signature, with their schedule tables on the GPU: at most 256,
# and at most 1 GiB of tables (a job with many sequence lengths rebuilds the rest, from the
# plan cache on disk in milliseconds).
_backward_launch = BoundedCache(_backward_launch, max_entries=256, max_bytes=1 << 30,
                                size=_device_bytes)


@lru_cache(maxsize=256)
def _backward_config(kernel: str, dtype: str, head_dim: int, causal: bool, gqa: bool,
                     deterministic: bool, trace: bool, registers: tuple[int, int],
                     options: tuple = ()):
    """`options`: (name, value) pairs of SM90_BWD_OPTIONS, hashable for the cache."""
    if kernel != "sm90":
        return config_of(kernel, dtype, head_dim, causal, gqa=gqa, deterministic=deterministic,
                         trace=trace)
    # Built with its options, so the defaults left at None resolve from the others (ds_stmatrix
    # gives way to double_ds).
    return Sm90BwdConfig(dtype, head_dim, causal, deterministic=deterministic, trace=trace,
                         gqa=gqa, producer_registers=registers[0], mma_registers=registers[1],
                         **{name: value for name, value in options if value is not None})


class BackwardCall:
    """A backward with everything but dO and its own buffers decided: the prepared launch of
    its signature, the parameter blocks filled with the forward's pointers, the tensor maps of
    q, k and v. The eager autograd node builds it during the forward, on the caller's thread,
    while the GPU runs the forward. Autograd runs the backward on its device thread, which wakes
    cold for each backward and runs Python 2-4x slower than the caller's thread, and the GPU
    waits on that thread until the first launch (docs/perf-notes.md): there a call only
    allocates, writes dO's and the buffers' addresses into the blocks, and launches.

    q, k, v, o and lse are contiguous; the call reads them through their addresses, so it holds
    no reference to them: `serves` tells whether a set of tensors is the one it was built for.
    Its parameter blocks are rewritten by each call: one call at a time."""

    def __init__(self, q, k, v, o, lse, *, causal: bool, softmax_scale: float,
                 deterministic: bool, schedule: str, num_workers: int, trace: bool = False,
                 kernel: str = "auto"):
        kernel = backward_kernel(q, k, kernel)
        dev = self.device = q.device
        bl = self.bl = _backward_launch(kernel, tuple(q.shape), tuple(k.shape), _DTYPES[q.dtype],
                                        bool(causal), bool(deterministic), bool(trace), schedule,
                                        num_workers, dev, SM90_REGISTERS,
                                        tuple(sorted(SM90_BWD_OPTIONS.items())))
        self.device_index = dev.index or 0
        self.pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
        self.q_shape, self.k_shape, self.dtype = q.shape, k.shape, q.dtype
        self.trace = trace
        prep = self.prep = PrepParams.from_buffer_copy(bl.prep_template)
        prep.o = self.pointers[3]
        if bl.staged_stats:
            prep.lse = self.pointers[4]
        params = self.params = BwdParams.from_buffer_copy(bl.params_template)
        params.q, params.k, params.v, _, params.lse = self.pointers
        params.softmax_scale = softmax_scale
        self.convert_q = ConvertParams.from_buffer_copy(bl.convert_q_template)
        self.convert_kv = ([ConvertParams.from_buffer_copy(bl.convert_kv_template)
                            for _ in range(2)] if bl.problem.gqa else [])
        self.prep_args = _addresses(prep)
        self.convert_q_args = _addresses(self.convert_q)
        self.convert_kv_args = [_addresses(c) for c in self.convert_kv]
        if bl.hopper:
            # The descriptors stay alive with the call; dO's slot is filled per call.
            self.maps = bl.qkv_maps(q, k, v)
            self.main_args = _addresses(*(int(m.getPtr()) for m in self.maps), 0, params)
        else:
            self.maps = None
            self.main_args = _addresses(params)

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
        launch.make_current(self.device_index)
        stream = _stream(dev)
        empty = _allocator()
        workspace = empty((bl.layout.floats,), torch.float32, dev)
        base = workspace.data_ptr()
        dq_accum, dpsum, stats, dk_accum, dv_accum, dq_counters, dkv_counters = (
            base + offset for offset in bl.part_bytes)
        stats = stats if bl.staged_stats else 0
        prep, params = self.prep, self.params
        do_ptr = do.data_ptr()
        prep.dout, prep.dpsum, prep.dq_accum, prep.zero, prep.stats = (
            do_ptr, dpsum, dq_accum, base + bl.zeroed_bytes, stats)
        bl.preprocess(stream, self.prep_args)

        # Until the main kernel is launched the GPU may be waiting on this code (the preprocess
        # is short): dQ, and dK/dV under GQA, are allocated after it, for the convert kernels,
        # unless the main kernel writes dQ itself.
        gqa = p.gqa
        dk, dv = ((None, None) if gqa else
                  (empty(self.k_shape, self.dtype, dev), empty(self.k_shape, self.dtype, dev)))
        dq = empty(self.q_shape, self.dtype, dev) if bl.converts_dq else None
        trace_buf = (torch.full((bl.plan.num_tasks, TRACE_COLUMNS), -1, dtype=torch.int32,
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
        if self.maps is not None:
            do_map = bl.do_map(do)  # a local reference keeps the descriptor through the launch
            self.main_args[3] = int(do_map.getPtr())
        bl.main(stream, self.main_args)

        if dq is None:
            dq = empty(self.q_shape, self.dtype, dev)
        if gqa:
            dk, dv = (empty(self.k_shape, self.dtype, dev), empty(self.k_shape, self.dtype, dev))
        if bl.runs_convert_q:
            convert = self.convert_q
            convert.src, convert.dst = dq_accum, dq.data_ptr()
            convert.counters = dq_counters if bl.first_dq_store else 0
            bl.convert_q(stream, self.convert_q_args)
        if gqa:
            for convert, args, src, dst in zip(self.convert_kv, self.convert_kv_args,
                                               (dk_accum, dv_accum), (dk, dv)):
                convert.src, convert.dst = src, dst.data_ptr()
                bl.convert_kv(stream, args)
        for tables_stream, tables in bl.tables:
            if stream != tables_stream:
                # These tables were allocated on another stream: should the cache drop them
                # while these kernels run, that stream could reuse their memory too early.
                current = torch.cuda.current_stream(dev)
                for table in tables:
                    table.record_stream(current)
        if self.trace:
            return dq, dk, dv, trace_buf
        return dq, dk, dv


def _addresses(*args) -> ctypes.Array:
    """kernelParams for a launch: each argument's address (an int is one already)."""
    return (ctypes.c_void_p * len(args))(*(a if isinstance(a, int) else ctypes.addressof(a)
                                           for a in args))


def backward(do, q, k, v, o, lse, *, causal: bool, softmax_scale: float, deterministic: bool,
             schedule: str, num_workers: int, trace: bool = False, kernel: str = "auto"):
    """dq, dk, dv (and the trace buffer if `trace`: a row of kernels.TRACE_COLUMNS int32 per
    task, in the plan's order). q, k, v, do and o are contiguous; do and o are shaped like q."""
    return BackwardCall(q, k, v, o, lse, causal=causal, softmax_scale=softmax_scale,
                        deterministic=deterministic, schedule=schedule, num_workers=num_workers,
                        trace=trace, kernel=kernel)(do)
