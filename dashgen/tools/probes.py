"""The PTX probe kernels: one small template per wrapper family, with its launch geometry.

tests/gpu/test_probes_gpu.py launches each on an H200 against a host reference; tests/test_compile.py
compiles each on the CPU. The table is data, so both read the same geometry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..codegen.render import KernelConfig, KernelSource, render

SW128_ALIGN = 1024  # slack for aligning a 128B-swizzled tile inside dynamic shared memory


@dataclass(frozen=True)
class TmaProbeConfig(KernelConfig):
    prefix = "probe_mbarrier_tma"
    rank: int = 2
    box_rows: int = 64
    box_cols: int = 64
    threads: int = 128

    @property
    def tile_bytes(self) -> int:
        return self.box_rows * self.box_cols * 2


@dataclass(frozen=True)
class BulkReduceProbeConfig(KernelConfig):
    prefix = "probe_bulk_reduce"
    tile_floats: int = 4096
    chunks: int = 4
    threads: int = 128
    first_store: bool = False  # rank 0 stores (bulk_store_f32) instead of adding


@dataclass(frozen=True)
class BulkLoadProbeConfig(KernelConfig):
    prefix = "probe_bulk_load"
    chunks: int = 4
    chunk_floats: int = 128  # 512 bytes: one task's lse and D rows at block_m 64
    threads: int = 128

    @property
    def tile_floats(self) -> int:
        return self.chunks * self.chunk_floats


@dataclass(frozen=True)
class WgmmaProbeConfig(KernelConfig):
    prefix = "probe_wgmma"
    k_steps: int = 1


@dataclass(frozen=True)
class WgmmaSsProbeConfig(KernelConfig):
    """D(64 x n) = A(64 x 64) * B(64 x n), SS form, K = 64; trans_a / trans_b pick MN-major."""

    prefix = "probe_wgmma_ss"
    n: int = 64
    trans_a: int = 0
    trans_b: int = 0
    pad_bytes: int = 32768  # zero tail: a wrong LBO / SBO candidate stays inside the allocation

    @property
    def smem_bytes(self) -> int:
        return 64 * 128 + self.n * 128 + self.pad_bytes + SW128_ALIGN


@dataclass(frozen=True)
class WgmmaRsProbeConfig(KernelConfig):
    """P = X * Y^T (SS, 64 x 64, K = 64), then O(64 x n) = bf16(P) * Z, RS form (A in registers)."""

    prefix = "probe_wgmma_rs"
    n: int = 64
    trans_b: int = 0
    pad_bytes: int = 32768

    @property
    def smem_bytes(self) -> int:
        return 2 * 64 * 128 + self.n * 128 + self.pad_bytes + SW128_ALIGN


@dataclass(frozen=True)
class SetmaxnregProbeConfig(KernelConfig):
    prefix = "probe_setmaxnreg"
    producer_registers: int = 24
    consumer_registers: int = 240
    consumer_words: int = 64
    mix_rounds: int = 4


@dataclass(frozen=True)
class StmatrixProbeConfig(KernelConfig):
    prefix = "probe_stmatrix"
    row_stride: int = 48  # bytes between stored rows: rows apart, and gaps that must stay untouched


@dataclass(frozen=True)
class Probe:
    """One probe: which template, with which config, launched how."""

    name: str
    template: str
    config: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory per CTA

    @property
    def kernel_name(self) -> str:
        return self.config.kernel_name


def _probes() -> dict[str, Probe]:
    tma2 = TmaProbeConfig(rank=2)
    tma4 = TmaProbeConfig(rank=4)
    reduce = BulkReduceProbeConfig()
    first_store = BulkReduceProbeConfig(first_store=True)
    bulk_load = BulkLoadProbeConfig()
    setmaxnreg = SetmaxnregProbeConfig()
    table = [
        # rank 2: a [4*64, 2*64] bf16 matrix, one CTA per 64x64 tile.
        Probe("mbarrier_tma_2d", "probes/probe_mbarrier_tma.cu.j2", tma2,
              grid=(4, 2, 1), block=(tma2.threads, 1, 1), smem_bytes=tma2.tile_bytes + SW128_ALIGN),
        # rank 4: a [batch 2, heads 3, seqlen 2*64, head_dim 64] bf16 tensor.
        Probe("mbarrier_tma_4d", "probes/probe_mbarrier_tma.cu.j2", tma4,
              grid=(2, 3, 2), block=(tma4.threads, 1, 1), smem_bytes=tma4.tile_bytes + SW128_ALIGN),
        Probe("bulk_reduce", "probes/probe_bulk_reduce.cu.j2", reduce,
              grid=(8, 1, 1), block=(reduce.threads, 1, 1), smem_bytes=reduce.tile_floats * 4 + 128),
        Probe("bulk_store_first", "probes/probe_bulk_reduce.cu.j2", first_store,
              grid=(8, 1, 1), block=(first_store.threads, 1, 1),
              smem_bytes=first_store.tile_floats * 4 + 128),
        Probe("bulk_load", "probes/probe_bulk_load.cu.j2", bulk_load,
              grid=(6, 1, 1), block=(bulk_load.threads, 1, 1),
              smem_bytes=bulk_load.tile_floats * 4 + 16),
        Probe("wgmma_k16", "probes/probe_wgmma.cu.j2", WgmmaProbeConfig(k_steps=1),
              grid=(1, 1, 1), block=(128, 1, 1), smem_bytes=2 * 64 * 128 + SW128_ALIGN),
        Probe("wgmma_k64", "probes/probe_wgmma.cu.j2", WgmmaProbeConfig(k_steps=4),
              grid=(1, 1, 1), block=(128, 1, 1), smem_bytes=2 * 64 * 128 + SW128_ALIGN),
        Probe("setmaxnreg", "probes/probe_setmaxnreg.cu.j2", setmaxnreg,
              grid=(2, 1, 1), block=(384, 1, 1), smem_bytes=0),
        Probe("stmatrix_trans", "probes/probe_stmatrix.cu.j2", StmatrixProbeConfig(),
              grid=(1, 1, 1), block=(32, 1, 1), smem_bytes=0),
    ]
    # SS form, K = 64: K-major N = 32 / 128, and MN-major (transposed) A and / or B.
    for name, n, trans_a, trans_b in [
        ("wgmma_ss_n32", 32, 0, 0),
        ("wgmma_ss_n128", 128, 0, 0),
        ("wgmma_ss_n64_tb", 64, 0, 1),
        ("wgmma_ss_n128_tb", 128, 0, 1),
        ("wgmma_ss_n64_ta", 64, 1, 0),
        ("wgmma_ss_n128_tatb", 128, 1, 1),
    ]:
        cfg = WgmmaSsProbeConfig(n=n, trans_a=trans_a, trans_b=trans_b)
        table.append(Probe(name, "probes/probe_wgmma_ss.cu.j2", cfg,
                           grid=(1, 1, 1), block=(128, 1, 1), smem_bytes=cfg.smem_bytes))
    # RS form fed from a previous accumulator, B K-major or MN-major.
    for name, n, trans_b in [
        ("wgmma_rs_n64", 64, 0),
        ("wgmma_rs_n128", 128, 0),
        ("wgmma_rs_n64_tb", 64, 1),
        ("wgmma_rs_n128_tb", 128, 1),
    ]:
        cfg = WgmmaRsProbeConfig(n=n, trans_b=trans_b)
        table.append(Probe(name, "probes/probe_wgmma_rs.cu.j2", cfg,
                           grid=(1, 1, 1), block=(128, 1, 1), smem_bytes=cfg.smem_bytes))
    return {p.name: p for p in table}


PROBES: dict[str, Probe] = _probes()


def render_probe(name: str) -> KernelSource:
    try:
        probe = PROBES[name]
    except KeyError:
        raise KeyError(f"unknown probe {name!r}; known: {', '.join(PROBES)}") from None
    return render(probe.template, probe.config)
