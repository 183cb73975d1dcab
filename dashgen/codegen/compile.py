"""Compile a KernelSource to an sm_90a CUBIN with NVRTC and parse ptxas's resource report.

Headers come only from the pinned nvidia-cuda-runtime wheel and templates/include, never from a
system CUDA, so CI and the H200 build the same bytes.
"""
from __future__ import annotations

import importlib.util
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from cuda.bindings import nvrtc

from ..caches import memo
from .render import KernelSource, include_dir

DEFAULT_ARCH = "sm_90a"
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v", "-lineinfo", "--use_fast_math")
# ptxas diagnostics arrive as "ptxas info : (Cnnnn) ..." lines, not as "warning" lines. These mean
# a Hopper feature silently fell back to a slow path.
SETMAXNREG_IGNORED = "C7508"          # setmaxnreg ignored (no register cap at entry)
WGMMA_SERIALIZED = "C7511"            # wgmma.mma_async serialized (register pressure etc.)
WGMMA_ARRIVE_INJECTED = "C7519"       # warpgroup.arrive injected: registers touched between wgmmas
WGMMA_WAIT_INJECTED = "C7517"         # warpgroup.wait injected: accumulators read before the wait


class CompileError(RuntimeError):
    """NVRTC rejected a source; `log` is the full program log, `source` the kernel name."""

    def __init__(self, message: str, *, log: str, source: str) -> None:
        super().__init__(message)
        self.log = log
        self.source = source


@dataclass(frozen=True)
class ResourceUsage:
    """ptxas's report for one entry function."""

    function: str
    registers: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    shared_bytes: int = 0
    barriers: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    def has_warning(self, code: str) -> bool:
        return any(code in w for w in self.warnings)


@dataclass(frozen=True)
class Cubin:
    name: str
    data: bytes = field(repr=False)
    log: str = field(repr=False)
    resources: dict[str, ResourceUsage]
    compile_seconds: float
    options: tuple[str, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(line.strip() for line in self.log.splitlines() if _is_diagnostic(line))

    def constant(self, symbol: str) -> int:
        """The int32 value of an initialized `extern "C" __constant__ int` in the cubin, read
        from its ELF symbol table (the kernels export their shared-memory sizes this way, so
        the host reads the C++ layout instead of repeating it)."""
        return elf_int_constant(self.data, symbol)


def elf_int_constant(data: bytes, symbol: str) -> int:
    """The int32 an ELF64 image stores at `symbol` (an initialized constant); KeyError if the
    image has no such symbol."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize) per section
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    wanted = symbol.encode()
    for section in sections:
        if section[1] != 2:  # SHT_SYMTAB
            continue
        strings = sections[section[6]][4]
        for entry in range(section[4], section[4] + section[5], section[9]):
            name, _, _, index, value, _ = struct.unpack_from("<IBBHQQ", data, entry)
            start = strings + name
            if data[start:data.index(b"\0", start)] == wanted:
                return struct.unpack_from("<i", data, sections[index][4] + value)[0]
    raise KeyError(f"the cubin has no symbol {symbol!r}")


def _check(result: tuple, call: str) -> tuple:
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeError(f"{call} failed: {text.decode(errors='replace')} ({err!r})")
    return result[1:]


def nvrtc_version() -> tuple[int, int]:
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


@memo(max_entries=1)
def cuda_include_dir() -> Path:
    """<site-packages>/nvidia/cu13/include from the nvidia-cuda-runtime wheel (never /usr/local/cuda)."""
    spec = importlib.util.find_spec("nvidia")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "cu13" / "include"
        if (candidate / "cuda_bf16.h").is_file():
            return candidate
    raise FileNotFoundError(
        "CUDA headers not found: expected nvidia/cu13/include (with cuda_bf16.h) from the "
        f"nvidia-cuda-runtime wheel under {locations or 'no installed nvidia package'}; "
        "install nvidia-cuda-runtime==13.0.96 (dashgen does not use a system CUDA)"
    )


def compile_options(arch: str = DEFAULT_ARCH, extra_options: Sequence[str] = ()) -> tuple[str, ...]:
    """The full NVRTC option list, include paths included (part of the cache key)."""
    return (f"--gpu-architecture={arch}", *BASE_OPTIONS, f"-I{cuda_include_dir()}",
            f"-I{include_dir()}", *extra_options)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARS = re.compile(r"used (\d+) barriers")
_CODE = re.compile(r"\(C\d{4}\)")
_NAMED = re.compile(r"(?:function|entry) '([^']+)'")


def _is_diagnostic(line: str) -> bool:
    return bool(_CODE.search(line)) or "warning" in line.lower()


def parse_resource_usage(log: str) -> dict[str, ResourceUsage]:
    """Per-function ptxas figures from an NVRTC log compiled with --ptxas-options=-v.

    Diagnostics ("(C7508) ...", warnings) go to the function they name; ptxas prints an unnamed
    one before the "Compiling entry function" line of its function, so it goes to the next entry
    (or the last, if none follows).
    """
    stats: dict[str, dict] = {}
    current: str | None = None
    unnamed: list[str] = []

    def entry(name: str) -> dict:
        return stats.setdefault(name, {"function": name, "warnings": []})

    for line in log.splitlines():
        if _is_diagnostic(line):
            if m := _NAMED.search(line):
                entry(m.group(1))["warnings"].append(line.strip())
            else:
                unnamed.append(line.strip())
        elif m := _ENTRY.search(line):
            current = m.group(1)
            entry(current)["warnings"].extend(unnamed)
            unnamed = []
        elif m := _PROPS.search(line):
            current = m.group(1)
            entry(current)
        elif current is not None and (m := _FRAME.search(line)):
            entry(current).update(stack_frame_bytes=int(m.group(1)),
                                  spill_store_bytes=int(m.group(2)),
                                  spill_load_bytes=int(m.group(3)))
        elif current is not None and (m := _USED.search(line)):
            s = entry(current)
            s["registers"] = int(m.group(1))
            if sm := _SMEM.search(line):
                s["shared_bytes"] = int(sm.group(1))
            if bm := _BARS.search(line):
                s["barriers"] = int(bm.group(1))
    if unnamed and current is not None:
        entry(current)["warnings"].extend(unnamed)
    return {name: ResourceUsage(**{**s, "warnings": tuple(s["warnings"])})
            for name, s in stats.items()}


def _error_excerpt(log: str, limit: int = 8) -> str:
    lines = [line for line in log.splitlines() if "error" in line.lower()]
    return "\n".join((lines or log.splitlines())[:limit])


def compile_kernel(source: KernelSource, arch: str = DEFAULT_ARCH,
                   extra_options: Sequence[str] = ()) -> Cubin:
    """NVRTC-compile `source` to a CUBIN for `arch`; raises CompileError with the log on failure."""
    options = compile_options(arch, extra_options)
    start = time.perf_counter()
    (program,) = _check(nvrtc.nvrtcCreateProgram(source.text.encode(), f"{source.name}.cu".encode(),
                                                 0, [], []), "nvrtcCreateProgram")
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        buffer = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
        log = buffer.rstrip(b"\x00").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(
                f"NVRTC failed to compile {source.name} (from templates/{source.template}) "
                f"with {status.name}:\n{_error_excerpt(log)}",
                log=log, source=source.name)
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        data = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, data), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return Cubin(name=source.name, data=bytes(data), log=log, resources=parse_resource_usage(log),
                 compile_seconds=time.perf_counter() - start, options=options)
