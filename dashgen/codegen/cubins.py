"""The disk cache of compiled cubins, safe for concurrent processes.

The key covers everything that decides the bytes: source text, the headers it may include,
NVRTC options (which name the architecture and include paths), NVRTC and dashgen versions.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from ..version import __version__
from ..caches import DiskCache, digest, memo
from .compile import (DEFAULT_ARCH, Cubin, ResourceUsage, compile_kernel, compile_options,
                      nvrtc_version)
from .render import KernelSource, include_dir

_CUBINS = DiskCache(subfolder="", suffix=".cubin", format_version=1)


@memo(max_entries=1)
def _headers_digest() -> str:
    """Digest of templates/include: a header edit must miss, whatever includes it."""
    h = hashlib.sha256()
    root = include_dir()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: KernelSource, options: Sequence[str] = (), arch: str = DEFAULT_ARCH) -> str:
    return digest({
        "format": _CUBINS.format,
        "text": source.text,
        "options": list(compile_options(arch, options)),
        "nvrtc": list(nvrtc_version()),
        "dashgen": __version__,
        "headers": _headers_digest(),
    })


def get_or_compile(source: KernelSource, options: Sequence[str] = (), arch: str = DEFAULT_ARCH,
                   directory: Path | None = None) -> tuple[Cubin, bool]:
    """The cubin for `source` compiled with extra `options`, and whether it came from the cache."""
    key = cache_key(source, options, arch)
    found = _CUBINS.get(key, directory)
    if found is not None:
        data, meta = found
        resources = {name: ResourceUsage(**{**usage, "warnings": tuple(usage["warnings"])})
                     for name, usage in meta["resources"].items()}
        return Cubin(name=source.name, data=data, log=meta["log"], resources=resources,
                     compile_seconds=meta["compile_seconds"],
                     options=tuple(meta["options"])), True
    cubin = compile_kernel(source, arch=arch, extra_options=options)
    _CUBINS.put(key, cubin.data, {
        "name": cubin.name,
        "template": source.template,
        "log": cubin.log,
        "resources": {name: asdict(usage) for name, usage in cubin.resources.items()},
        "options": list(cubin.options),
        "compile_seconds": cubin.compile_seconds,
    }, directory)
    return cubin, False
