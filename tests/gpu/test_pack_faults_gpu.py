"""Offsets on the GPU that break what a packed call was sized by (a sequence longer than its
max_seqlen, offsets past the packed tokens) never give a silently wrong output: the packed
forward's CTAs and the backward's plan kernel find them before any row is read or written,
record them and abort the launch; CUDA reports the failed launch and dashgen raises
PackOffsetsError naming the offsets. Each case runs in a child process: the aborted launch ends
its CUDA context."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent(r"""
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    case = sys.argv[2]
    import dashgen
    from dashgen.runtime import pack_faults, varlen

    torch.manual_seed(0)
    def make(total, heads=2):
        return torch.randn(total, heads, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = make(400), make(400), make(400)
    good = torch.tensor([0, 200, 400], dtype=torch.int32, device="cuda")
    try:
        if case == "forward":
            # Sequence 0 has 300 tokens; max_seqlen 256 sizes the grid (2 x 256 >= 400 passes
            # the host's check, which cannot read offsets on the GPU).
            bad = torch.tensor([0, 300, 400], dtype=torch.int32, device="cuda")
            dashgen.attention_varlen(q, k, v, bad, bad, 256, 256)
        else:
            # The forward on good offsets, then the backward told the pack ends past k's rows.
            o, lse = varlen.forward(q, k, v, good, good, 200, 200, causal=True,
                                    softmax_scale=0.125)
            torch.cuda.synchronize()
            print("FORWARD OK")
            bad_k = torch.tensor([0, 200, 450], dtype=torch.int32, device="cuda")
            varlen.backward(torch.randn_like(o), q, k, v, o, lse, good, bad_k, 200, 250,
                            causal=True, softmax_scale=0.125, deterministic=True,
                            schedule="auto", workers=132)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print("CUDA:", str(exc).splitlines()[0])
    try:
        pack_faults.check()
    except pack_faults.PackOffsetsError as exc:
        print("FAULT:", exc)
        sys.exit(0)
    print("no fault recorded")
    sys.exit(1)
""")


@pytest.mark.parametrize("case, expected", [
    ("forward", ("cu_seqlens_q (on the GPU) holds a sequence longer than max_seqlen_q=256",
                 "sequence 0 of 2 spans [0, 300)", "packed forward")),
    ("backward", ("cu_seqlens_k (on the GPU) leaves the packed tokens (400 rows of k)",
                  "sequence 1 of 2 spans [200, 450)", "packed backward")),
])
def test_offsets_that_break_the_launch_raise_instead_of_a_wrong_output(tmp_path, case,
                                                                       expected):
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), str(root), case], capture_output=True,
                          text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "CUDA:" in out, out  # the aborted launch surfaced as a CUDA error
    if case == "backward":
        assert "FORWARD OK" in out, out
    fault = next(line for line in out.splitlines() if line.startswith("FAULT:"))
    for part in expected:
        assert part in fault, fault
