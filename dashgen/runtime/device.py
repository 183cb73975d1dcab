"""The kernels on a device, for torch tensors: compiled (or read from the disk cache) and loaded
once per process, their shared-memory sizes read from the cubins, TMA descriptors of tensors,
PyTorch's current stream, and the host records the kernels fill when they abort. The kernels'
argument arrays are runtime.launch's (`addresses`)."""
from __future__ import annotations

import sys

import torch

from ..caches import Memo, memo
from ..codegen.cubins import get_or_compile
from ..codegen.render import render_variant
from ..codegen.variants import BackwardVariant, ForwardVariant
from . import launch

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}  # torch dtype -> variant dtype


class LoadedKernels:
    """A variant's module: its main kernel (and the backward's `_preprocess`, `_convert` and, for
    a pack, `_plan`),
    and the main kernel's dynamic shared memory as the C++ layout computed it."""

    def __init__(self, variant: ForwardVariant | BackwardVariant):
        source = render_variant(variant)
        cubin, hit = get_or_compile(source)
        if not hit:
            main = cubin.resources.get(source.name)
            regs = f", {main.registers} registers, {main.spill_bytes} spill bytes" if main else ""
            print(f"dashgen: compiled {source.name} in {cubin.compile_seconds:.2f} s{regs}",
                  file=sys.stderr)
        self.smem_bytes = cubin.constant(variant.smem_symbol)
        self.main = launch.load_kernel(cubin.data, source.name)
        self.main.set_max_dynamic_shared_bytes(self.smem_bytes)
        if isinstance(variant, BackwardVariant):
            self.preprocess = launch.load_kernel(cubin.data, source.name + "_preprocess")
            self.convert = launch.load_kernel(cubin.data, source.name + "_convert")
            if variant.varlen:
                self.plan = launch.load_kernel(cubin.data, source.name + "_plan")


@memo(max_entries=256)
def _loaded(variant, device_index: int) -> LoadedKernels:
    return LoadedKernels(variant)


def kernels(variant: ForwardVariant | BackwardVariant, device: torch.device) -> LoadedKernels:
    """The variant's loaded kernels (compiled on first use, once per process)."""
    index = device.index or 0
    launch.ensure_context(index)
    return _loaded(variant, index)


# Descriptors by (address, dtype, shape, strides, box): a training loop reuses the caching
# allocator's addresses, and encoding one costs host time per call.
_TENSOR_MAPS = Memo(None, max_entries=512)


def tensor_map(t: torch.Tensor, rows: int):
    """TMA descriptor of a (batch, seqlen, heads, head_dim) tensor in boxes of `rows` rows x 64
    columns (one 128-byte swizzle row); rows past seqlen read as zeros. A pure function of
    address, dtype, shape, strides and box, so it is memoized under exactly those."""
    key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()), rows)
    return _TENSOR_MAPS.get(key, lambda: launch.encode_tensor_map(
        key[0], t.dtype, key[2], key[3], (1, rows, 1, 64), swizzle=128))


# torch's raw getter is one C call; torch.cuda.current_stream builds a Stream object, host time
# the backward's first kernel waits on. CPU-only builds of torch lack it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(device: torch.device) -> int:
    """The CUstream handle of the current stream on `device` (a CUDA device with an index)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def allocation_stream(device: torch.device) -> int:
    """The stream tensors made now on `device` belong to (0 off CUDA), for record_stream."""
    return stream(device) if device.type == "cuda" else 0


@memo(max_entries=16)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def host_record(records: dict[int, torch.Tensor], device: torch.device, words: int) -> int:
    """The address of the int32 record of `words` words the kernels on `device` fill when they
    abort (the watchdog's, a pack's offsets'), kept in `records` by device index: pinned, so
    they write it through the unified address space and the host reads it without a
    synchronization, and zeroed once. A process without CUDA (the host path's tests) runs no
    kernel that could write it."""
    index = device.index or 0
    buf = records.get(index)
    if buf is None:
        buf = torch.zeros(words, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        records[index] = buf
    return buf.data_ptr()
