"""No hang, ever: a schedule file whose order cannot be lived (loaded with verification
bypassed, the test-only path) makes the backward's watchdog fire: the kernel records the wait
and aborts, CUDA reports the failed launch, and dashgen raises ScheduleStallError naming the
schedule, the dQ tile and the rank. Run in a child process: the aborted launch ends its CUDA
context."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent(r"""
    import os, sys, torch
    sys.path.insert(0, sys.argv[1])
    os.environ["DASHGEN_WATCHDOG_MS"] = "300"
    from dashgen.runtime import watchdog
    from dashgen.runtime.backward import backward
    from dashgen.runtime.forward import forward
    from dashgen.runtime.select import problem_for
    from dashgen.runtime.tables import register
    from dashgen.schedule.builders import build_schedule
    from dashgen.schedule.ir import Task

    problem = problem_for(1, 1, 1, 256, 256, 64, False)  # 2 KV tiles, 2 Q tiles (128 rows)
    schedule = build_schedule("fa3", problem, 1)  # one worker: n0 m0 m1, then n1 m0 m1
    tasks = schedule.workers[0]
    # n0 waits for rank 1 of dQ tile 0, which only n1 (later on the same worker) can give.
    tasks[0] = Task(0, 0, 0, 0, 1, None)
    tasks[2] = Task(0, 0, 1, 0, 0, None)
    key = register(schedule)  # unverified: only a test may do this
    q, k, v, do = (torch.randn(1, 256, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = forward(q, k, v, causal=False, softmax_scale=0.125)
    try:
        backward(do, q, k, v, o, lse, causal=False, softmax_scale=0.125, deterministic=True,
                 schedule=key, num_workers=1)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print("CUDA:", str(exc).splitlines()[0])
    try:
        watchdog.check()
    except watchdog.ScheduleStallError as exc:
        print("STALL:", exc)
        sys.exit(0)
    print("no stall recorded")
    sys.exit(1)
""")


def test_an_unlivable_schedule_file_raises_instead_of_hanging(tmp_path):
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    start = time.time()
    proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True,
                          text=True, timeout=120)
    seconds = time.time() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "CUDA:" in out, out  # the aborted launch surfaced as a CUDA error
    stall = next(line for line in out.splitlines() if line.startswith("STALL:"))
    assert "dQ writer of worker 0" in stall and "to reach 1" in stall and "'table'" in stall, stall
    assert seconds < 60, seconds
