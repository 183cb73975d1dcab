"""The benchmark's timing and provenance, shared by `dashgen bench` and `dashgen bench --varlen`:
one call between CUDA events on an idle GPU, the median of repeats after warm-ups, the commit id
a run records, and loading a shape's kernels before its first call is timed."""
from __future__ import annotations

import os
import statistics
import subprocess
import time
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
    """`override`, else $DASHGEN_COMMIT, else git's HEAD (a copied tree's .git may be stale,
    so the variable set by whoever copied it wins)."""
    if override or os.environ.get("DASHGEN_COMMIT"):
        return override or os.environ["DASHGEN_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout
        return head + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_kernels(q, k, causal: bool) -> float:
    """Compile or load (disk cache) the kernels dashgen.attention runs at q's and k's shapes,
    deterministic, schedule="auto", so that a first call timed after it times the call alone:
    seconds taken."""
    from ..runtime.backward import selection
    from ..runtime.device import DTYPE_NAMES, kernels, sm_count
    from ..runtime.forward import forward_variant
    from ..runtime.select import Overrides
    t0 = time.perf_counter()
    sms = sm_count(q.device)
    dtype = DTYPE_NAMES[q.dtype]
    sel = selection(tuple(q.shape), tuple(k.shape), dtype, causal, True, False, "auto", None,
                    sms, Overrides())
    kernels(sel.backward, q.device)
    kernels(forward_variant(tuple(q.shape), tuple(k.shape), dtype, causal, sms), q.device)
    return time.perf_counter() - t0
