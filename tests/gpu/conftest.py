"""GPU tests need CUDA torch on a compute capability 9.0 GPU (H100/H200); elsewhere (CI, CPU
machines) they are collected and skipped, with the reason."""
from __future__ import annotations

import pytest


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        return f"needs compute capability 9.0 (H100/H200), this GPU has {capability}"
    return None


SKIP_REASON = _skip_reason()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sm_count() -> int:
    import torch
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.fixture
def seed(request) -> int:
    """A seed per test, stable across runs, so a failure can be replayed."""
    import zlib

    import torch
    value = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(value)
    return value
