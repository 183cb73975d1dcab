"""The benchmark's timing and provenance, shared by `dashgen bench` and `dashgen bench --varlen`:
one call between CUDA events on an idle GPU, the median of repeats after warm-ups, and the
commit id a run records."""
from __future__ import annotations

import os
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout, for the commit id


def event_ms(fn, before=None) -> float:
    """One call of fn between two CUDA events on an idle GPU, in ms. `before` (a diagnostic:
    scripts/overhead.py queues a GPU sleep there) runs between the synchronize and the start."""
    import torch
    torch.cuda.synchronize()  # the GPU is idle when the clock starts, as for every timed call
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fn, warmup: int, repeats: int) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_ms(fn) for _ in range(repeats))


def commit_id(override: str | None) -> str:
    if override:
        return override
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout
        return head + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("DASHGEN_COMMIT", "unknown")
