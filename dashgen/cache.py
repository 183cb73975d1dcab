"""Content-addressed disk cache of compiled cubins, safe for concurrent processes.

The key covers everything that decides the bytes: source text, the headers it may include,
NVRTC options (which name the architecture and include paths), NVRTC and dashgen versions.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from . import __version__
from .compile import (DEFAULT_ARCH, Cubin, ResourceUsage, compile_kernel, compile_options,
                      nvrtc_version)
from .render import INCLUDE_DIR, KernelSource

CACHE_ENV = "DASHGEN_CACHE_DIR"
_FORMAT = 1  # bump when the sidecar layout changes


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dashgen")


@lru_cache(maxsize=1)
def _headers_digest() -> str:
    """Digest of templates/include: a header edit must miss, whatever includes it."""
    h = hashlib.sha256()
    for path in sorted(INCLUDE_DIR.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(INCLUDE_DIR).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: KernelSource, options: Sequence[str] = (), arch: str = DEFAULT_ARCH) -> str:
    payload = {
        "format": _FORMAT,
        "text": source.text,
        "options": list(compile_options(arch, options)),
        "nvrtc": list(nvrtc_version()),
        "dashgen": __version__,
        "headers": _headers_digest(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _load(cubin_path: Path, meta_path: Path, source: KernelSource) -> Cubin | None:
    try:
        meta = json.loads(meta_path.read_text())
        data = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("format") != _FORMAT or meta.get("sha256") != hashlib.sha256(data).hexdigest():
        return None  # torn or foreign entry: recompile and overwrite
    resources = {name: ResourceUsage(**{**usage, "warnings": tuple(usage["warnings"])})
                 for name, usage in meta["resources"].items()}
    return Cubin(name=source.name, data=data, log=meta["log"], resources=resources,
                 compile_seconds=meta["compile_seconds"], options=tuple(meta["options"]))


def get_or_compile(source: KernelSource, options: Sequence[str] = (), arch: str = DEFAULT_ARCH,
                   directory: Path | None = None) -> tuple[Cubin, bool]:
    """The cubin for `source` compiled with extra `options`, and whether it came from the cache."""
    key = cache_key(source, options, arch)
    folder = Path(directory) if directory is not None else cache_dir()
    folder = folder / key[:2]
    cubin_path = folder / f"{key}.cubin"
    meta_path = folder / f"{key}.json"
    if meta_path.exists():
        cached = _load(cubin_path, meta_path, source)
        if cached is not None:
            return cached, True
    cubin = compile_kernel(source, arch=arch, extra_options=options)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": _FORMAT,
        "name": cubin.name,
        "template": source.template,
        "sha256": hashlib.sha256(cubin.data).hexdigest(),
        "log": cubin.log,
        "resources": {name: asdict(usage) for name, usage in cubin.resources.items()},
        "options": list(cubin.options),
        "compile_seconds": cubin.compile_seconds,
    }
    # The sidecar goes last: it marks the entry complete, and it names the cubin's hash.
    _atomic_write(cubin_path, cubin.data)
    _atomic_write(meta_path, json.dumps(meta, indent=1, sort_keys=True).encode())
    return cubin, False
