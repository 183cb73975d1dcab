"""The benchmark's timing and provenance, shared by `dashgen bench` and `dashgen bench --varlen`:
one call between CUDA events on an idle GPU, the median of repeats after warm-ups, the rows of
a configuration timed in rounds, the commit id a run records, and loading a shape's kernels
before its first call is timed."""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout, for the commit id


def event_ms(fn, before=None) -> float:
    """One call of fn between two CUDA events on an idle GPU, in ms. `before` (a diagnostic:
    lab/overhead.py queues a GPU sleep there) runs between the synchronize and the start."""
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


# rounds_ms: each row of a configuration is timed in six blocks of five calls, spread over the
# configuration's time. With two blocks of five, two rows of the same kernel and schedule (the
# auto row and its pick's) differed by up to 16% at 1k in one run: more blocks, so that no
# block's state decides a row's median.
ROUNDS = 6
REPEATS = 30
# warmup_ms: after its warm-up calls, each row runs on for this much GPU time before its timed
# calls, every round. A slow row leaves the GPU below its power limit and the next row's first
# ~60 ms run at higher clocks: on the H200 symmetric_shift (d128 causal 16k) measured 497
# TFLOP/s for its 3rd-12th calls after three calls of fa3's slower kernel and 473 after its own
# (docs/design.md, `bench-warmup-ms`), so a fast row that followed a slow one measured up to 5%
# above the same kernel timed after a fast one.
WARMUP_MS = 80.0


def rounds_ms(fns: dict, warmup: int, repeats: int, rounds: int = ROUNDS,
              time_once=None, warmup_ms: float = 0.0,
              blocks: dict | None = None) -> tuple[dict, dict]:
    """Median ms of every fn over `rounds` rounds: in each round every fn in turn gets `warmup`
    calls and then untimed-for-the-median calls until they add up to `warmup_ms` of its own
    time, then its share of the `repeats` timed calls back to back (ceil(repeats / rounds),
    so at least `repeats` in all). Each timed call follows a call of the same fn, as in the
    ANCHORS.md protocol (timing calls round-robin, each after another library's kernels, cost
    every 1k row 10-20%), while drift over the run (clocks, allocator state) falls on every row
    of a configuration alike instead of on whichever row ran last. Odd rounds take the fns in
    reverse, so no row always runs last: in one run the row timed last measured 6% below a row
    of the same kernel and schedule timed fifth. Returns (medians, errors) keyed like `fns`; a
    fn that raises gets no more calls. `blocks`, if given, receives each fn's timed calls as
    one list per round."""
    time_once = time_once or event_ms
    per_round = -(-repeats // rounds)
    errors = {}
    blocks = {} if blocks is None else blocks
    for round_index in range(rounds):
        order = list(fns.items())
        for key, fn in (order[::-1] if round_index % 2 else order):
            if key in errors:
                continue
            try:
                for _ in range(warmup):
                    fn()
                spent = 0.0
                while spent < warmup_ms:
                    spent += max(time_once(fn), 1e-3)  # a 0 ms fake clock still ends
                blocks.setdefault(key, []).append([time_once(fn) for _ in range(per_round)])
            except Exception as exc:
                errors[key] = exc
    return {key: statistics.median(t for block in b for t in block) for key, b in blocks.items()
            if key not in errors}, errors


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
    from ..runtime.device import DTYPE_NAMES, kernels, sm_count
    from ..runtime.forward import forward_variant
    from ..runtime.select import Overrides, selection
    t0 = time.perf_counter()
    sms = sm_count(q.device)
    dtype = DTYPE_NAMES[q.dtype]
    sel = selection(tuple(q.shape), tuple(k.shape), dtype, causal, True, False, "auto", None,
                    sms, Overrides())
    kernels(sel.backward, q.device)
    kernels(forward_variant(tuple(q.shape), tuple(k.shape), dtype, causal, sms), q.device)
    return time.perf_counter() - t0
