"""Faults in a pack's offsets on the GPU, host side: where the kernels record them, and the
error that reports them.

The host sizes a packed launch by max_seqlen_q/k (the grids) and by the packed tokens (the
buffers), but reads offsets on the GPU only in the kernels: reading them on the host would
synchronize. Offsets that break those promises (a sequence longer than its max_seqlen, offsets
that fall, do not start at 0 or do not end at the packed tokens) would leave rows unwritten or
address rows that do not exist. So the packed forward's CTAs and the backward's plan kernel
check them first (templates/include/dashgen/attn/pack_check.cuh); on a fault the first thread
to find one fills a pinned host record and aborts the launch, as PyTorch's device-side asserts
do: CUDA reports an error at the next synchronization, no output of the launch is returned,
and the CUDA context cannot run more work. The next packed dashgen call, or `check()`, raises
PackOffsetsError with what the record says. The record is host memory: reading it needs no
synchronization.
"""
from __future__ import annotations

import ctypes

import torch

from .device import host_record

PACK_RECORD_MAGIC = 0x0FF5E75  # pack_check.cuh, kPackRecordMagic
PACK_RECORD_WORDS = 16
KERNELS = {1: "forward", 2: "backward"}
ARRAYS = {0: ("cu_seqlens_q", "max_seqlen_q", "q"), 1: ("cu_seqlens_k", "max_seqlen_k", "k")}
# PackFault codes (pack_check.cuh) -> what the offsets broke.
PACK_FAULTS = {
    1: "does not start at 0",
    2: "falls",
    3: "leaves the packed tokens",
    4: "does not end at the packed tokens",
    5: "holds a sequence longer than",
}
_records: dict[int, torch.Tensor] = {}


class PackOffsetsError(ValueError):
    """A packed kernel found cu_seqlens on the GPU that break what the call was sized by."""


def record(device: torch.device) -> int:
    """The address of the fault record the packed kernels on `device` write (pinned, zeroed
    once)."""
    return host_record(_records, device, PACK_RECORD_WORDS)


def describe(words: list[int]) -> str:
    """The error message of a filled record's words 1.. (pack_check.cuh, pack_faulted)."""
    kernel, array, fault, b, start, end, total, longest, batch = words[:9]
    name, max_name, tensor = ARRAYS.get(array, (f"offsets {array}", "max_seqlen", "?"))
    what = PACK_FAULTS.get(fault, f"has fault {fault}")
    if fault == 5:
        what = f"{what} {max_name}={longest}"
    elif fault in (3, 4):
        what = f"{what} ({total} rows of {tensor})"
    return (f"{name} (on the GPU) {what}: sequence {b} of {batch} spans [{start}, {end}), "
            f"{end - start} tokens. Found by the packed {KERNELS.get(kernel, kernel)} kernel "
            f"before it read or wrote any row; the launch was aborted, so this CUDA context "
            f"cannot run more work (offsets must rise from 0 to the packed tokens, each "
            f"sequence at most max_seqlen long)")


def check() -> None:
    """Raise PackOffsetsError if a packed kernel recorded a fault (reads host memory)."""
    for buf in _records.values():
        if ctypes.c_uint32.from_address(buf.data_ptr()).value != PACK_RECORD_MAGIC:
            continue
        raise PackOffsetsError(describe(buf.tolist()[1:]))
