"""What every test of the checkout shares, dashgen's (tests/) and the lab's (lab/tests/).

- One cache folder for the whole test run: a kernel compiled (or a plan built) by one test is
  read from disk by the next, and nothing lands in the user's ~/.cache/dashgen.
- lab/ on the path: the lab's tests import its scripts as modules (`import compare_trees`), as
  running `python3 lab/X.py` puts lab/ there. dashgen itself never imports them
  (tests/test_layout.py).
- The `gpu` marker: such a test needs CUDA torch on a compute capability 9.0 GPU (H100/H200);
  elsewhere (CI, CPU machines) it is collected and skipped, with the reason.

This file sits at the root, not in tests/: pytest imports every conftest.py outside a package
as the module `conftest`, and with --doctest-modules a second one beside a test path (say in
lab/tests) would stand in sys.modules for the other when that one is collected.
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest

from dashgen.caches import CACHE_ENV

LAB = Path(__file__).resolve().parent / "lab"
if str(LAB) not in sys.path:
    sys.path.insert(0, str(LAB))


@pytest.fixture(scope="session", autouse=True)
def shared_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("dashgen-cache")
        patch.setenv(CACHE_ENV, str(path))
        yield path


def _gpu_skip_reason() -> str | None:
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


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _gpu_skip_reason() if gpu_items else None  # torch only where a test needs a GPU
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def sm_count() -> int:
    import torch
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.fixture
def seed(request) -> int:
    """A seed per test, stable across runs, so a failure can be replayed."""
    import torch
    value = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(value)
    return value
