"""Load cubins and launch their kernels through the CUDA driver API (cuda.bindings.driver).

The only dashgen module (besides the torch op) that talks to the driver. The driver is
initialised on first use, so importing this on a machine without a GPU works.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

from cuda.bindings import driver as cu

_initialized = False


def _check(result: Any, call: str) -> Any:
    """Raise RuntimeError naming `call` unless the CUresult is CUDA_SUCCESS; return the rest."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        raise RuntimeError(f"{call} failed: {name}: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def ensure_context(device: int = 0) -> None:
    """cuInit once; if no context is current (no torch yet), make the device's primary current."""
    global _initialized
    if not _initialized:
        _check(cu.cuInit(0), "cuInit")
        _initialized = True
    ctx = _check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = _check(cu.cuDeviceGet(device), "cuDeviceGet")
        primary = _check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel; `module` is kept so the code stays loaded while the kernel is alive."""

    name: str
    module: Any
    function: Any

    def set_max_dynamic_shared_bytes(self, nbytes: int) -> None:
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(cu.cuFuncSetAttribute(self.function, attr, int(nbytes)),
               f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) for {self.name}")


def load_kernel(cubin: bytes, name: str) -> Kernel:
    """cuModuleLoadData + cuModuleGetFunction for the extern "C" kernel `name`."""
    ensure_context()
    module = _check(cu.cuModuleLoadData(cubin), f"cuModuleLoadData for {name}")
    function = _check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
    return Kernel(name=name, module=module, function=function)


_DTYPES = {
    "bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    "bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    "fp16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    "float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    "fp32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    "float32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
}
_ELEMENT_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4}
_SWIZZLES = {
    0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
    32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
    64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
    128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
}


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"tensor map dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return name


def encode_tensor_map(ptr: int, dtype: Any, shape: Sequence[int], strides: Sequence[int],
                      box: Sequence[int], swizzle: int = 128) -> Any:
    """A tiled CUtensorMap for a tensor at `ptr`.

    `shape`, `strides` (in elements, like torch's .stride()) and `box` are given outermost first,
    as torch lists them; the innermost stride must be 1. The kernel's coordinates are innermost
    first (the driver's order). `swizzle` is 0, 32, 64 or 128 bytes.
    """
    name = _dtype_name(dtype)
    rank = len(shape)
    if not (len(strides) == len(box) == rank and 1 <= rank <= 5):
        raise ValueError(f"shape, strides and box must have one equal rank in 1..5, got "
                         f"{list(shape)}, {list(strides)}, {list(box)}")
    if strides[-1] != 1:
        raise ValueError(f"the innermost stride must be 1, got strides={list(strides)}")
    if swizzle not in _SWIZZLES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLES)} bytes, got {swizzle!r}")
    elem = _ELEMENT_BYTES[name]
    if swizzle and box[-1] * elem > swizzle:
        raise ValueError(f"box inner extent {box[-1] * elem} B exceeds the {swizzle} B swizzle")
    dims = [cu.cuuint64_t(int(d)) for d in reversed(shape)]
    byte_strides = [cu.cuuint64_t(int(s) * elem) for s in reversed(strides[:-1])]
    box_dims = [cu.cuuint32_t(int(b)) for b in reversed(box)]
    element_strides = [cu.cuuint32_t(1)] * rank
    return _check(cu.cuTensorMapEncodeTiled(
        _DTYPES[name], rank, int(ptr), dims, byte_strides, box_dims, element_strides,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, _SWIZZLES[swizzle],
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled(shape={list(shape)}, box={list(box)}, swizzle={swizzle})")


def addresses(*args) -> ctypes.Array:
    """kernelParams for a launch, the one packer of kernel arguments: each argument's address,
    in order. An int is an address already (a tensor map's getPtr(), a slot to fill later); a
    ctypes object (a parameter block, a scalar) gives its own, so it must outlive the launch."""
    return (ctypes.c_void_p * len(args))(*[a if isinstance(a, int) else ctypes.addressof(a)
                                           for a in args])


def pack_args(args: Sequence[Any]) -> tuple[ctypes.Array, list]:
    """The void** array cuLaunchKernel wants, and the objects it points into (keep them alive).

    A plain int is a device pointer (64 bits); ctypes scalars pass as their type; a CUtensorMap
    passes its 128 bytes by value. Anything else (a float, a bool) is ambiguous and rejected.
    The values are held in ctypes objects, whose addresses `addresses` packs.
    """
    keep: list = []
    held: list = []
    for i, arg in enumerate(args):
        if isinstance(arg, cu.CUtensorMap):
            keep.append(arg)
            held.append(int(arg.getPtr()))
        elif isinstance(arg, (ctypes._SimpleCData, ctypes.Structure)):
            keep.append(arg)
            held.append(arg)
        elif isinstance(arg, int) and not isinstance(arg, bool):
            holder = ctypes.c_uint64(arg)
            keep.append(holder)
            held.append(holder)
        else:
            raise TypeError(f"kernel argument {i} has type {type(arg).__name__}: pass a device "
                            "pointer as int, a ctypes scalar (e.g. ctypes.c_int32), or a CUtensorMap")
    return (addresses(*held) if held else (ctypes.c_void_p * 1)()), keep


def _dim3(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    # Without generators: a pack of new lengths prepares its launches on the call's path.
    dims = (value,) if isinstance(value, int) else tuple(value)
    if 1 <= len(dims) <= 3:
        dims = tuple(map(int, dims))
        if min(dims) >= 1:
            return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]
    raise ValueError(f"{what} must be 1 to 3 positive ints, got {value!r}")


_LIBCUDA = None


def _libcuda() -> ctypes.CDLL:
    """The driver library itself, for the launch: through ctypes a launch costs a few
    microseconds of host time, against 10-15 through the bindings' wrapper, and the backward's
    first kernel waits on exactly that host time."""
    global _LIBCUDA
    if _LIBCUDA is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuCtxGetCurrent.restype = ctypes.c_int
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuCtxSetCurrent.restype = ctypes.c_int
        _LIBCUDA = lib
    return _LIBCUDA


_PRIMARY: dict[int, int] = {}  # device index -> its primary context (what torch runs in)


def make_current(device: int) -> None:
    """Make `device`'s primary context current on the calling thread. Every launch needs it:
    autograd runs a backward on its own per-device thread, where nothing may have made a context
    current yet, and a launch there fails with CUDA_ERROR_INVALID_CONTEXT."""
    primary = _PRIMARY.get(device)
    if primary is None:
        ensure_context(device)
        handle = _check(cu.cuDeviceGet(device), "cuDeviceGet")
        primary = _PRIMARY[device] = int(_check(cu.cuDevicePrimaryCtxRetain(handle),
                                                "cuDevicePrimaryCtxRetain"))
    lib = _libcuda()
    current = ctypes.c_void_p()
    err = lib.cuCtxGetCurrent(ctypes.byref(current))
    if not err and current.value != primary:
        err = lib.cuCtxSetCurrent(primary)
    if err:
        _check(cu.CUresult(err), f"making device {device}'s primary context current")


class Launcher:
    """One kernel with a fixed grid, block and dynamic shared memory, ready to launch: what a
    call needs beyond this is the stream and the argument addresses."""

    __slots__ = ("kernel", "handle", "dims", "smem")

    def __init__(self, kernel: Kernel, grid: int | Sequence[int], block: int | Sequence[int],
                 smem: int):
        self.kernel = kernel
        self.handle = int(kernel.function)
        self.dims = _dim3(grid, "grid") + _dim3(block, "block")
        self.smem = int(smem)

    def __call__(self, stream_handle: int, addresses: Sequence[int] | ctypes.Array) -> None:
        """cuLaunchKernel with kernelParams = the addresses of the arguments, in order (the
        driver copies the arguments during the call); a ctypes array of them is passed as it
        is."""
        params = (addresses if isinstance(addresses, ctypes.Array)
                  else (ctypes.c_void_p * len(addresses))(*addresses))
        err = _libcuda().cuLaunchKernel(self.handle, *self.dims, self.smem, stream_handle,
                                        params, None)
        if err:
            _check(cu.CUresult(err), f"cuLaunchKernel({self.kernel.name}, grid={self.dims[:3]}, "
                                     f"block={self.dims[3:]}, smem={self.smem})")


def launch(kernel: Kernel, grid: int | Sequence[int], block: int | Sequence[int], smem: int,
           stream_handle: int, args: Sequence[Any]) -> None:
    """Launch `kernel` on the stream whose CUstream handle is `stream_handle` (an int), with
    arguments as pack_args takes them."""
    pointers, keep = pack_args(args)
    Launcher(kernel, grid, block, smem)(int(stream_handle), pointers)
    del keep  # the driver copied the arguments during the call
