"""lab/no_dq_traffic_tree.py: the copy's dQ writer sends nothing to global memory (all four
sends gone, nothing else of the tree changed), a writer that changed is refused by name, and
the copy's 256 backward still compiles for sm_90a (NVRTC, no GPU)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import no_dq_traffic_tree as tool  # lab/ is on the path (the root conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def test_the_copy_sends_no_dq_and_keeps_the_rest(tmp_path):
    out = tmp_path / "tree"
    tool.make_tree(ROOT, out)
    writer = (out / tool.WRITER).read_text()
    assert "bulk_reduce_add_f32(" not in writer and "bulk_store_f32(" not in writer
    assert writer.count(tool.MARK.strip()) == 4
    original = (ROOT / tool.WRITER).read_text()
    assert tool.strip_sends(original) == writer
    mainloop = "templates/include/dashgen/attn/bwd_mainloop_swapped.cuh"
    assert (out / mainloop).read_text() == (ROOT / mainloop).read_text()


def test_a_changed_writer_is_refused_by_name():
    text = (ROOT / tool.WRITER).read_text().replace("bulk_reduce_add_f32(dst", "add(dst")
    with pytest.raises(ValueError, match=r"bwd_dq_writer.cuh: expected 1 of .*found 0"):
        tool.strip_sends(text)


def test_the_copys_backward_compiles(tmp_path):
    out = tmp_path / "tree"
    tool.make_tree(ROOT, out)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import dashgen; assert dashgen.__file__.startswith(sys.argv[1])\n"
        "from dashgen.codegen.compile import compile_kernel\n"
        "from dashgen.codegen.render import render_variant\n"
        "from dashgen.codegen.variants import BackwardVariant\n"
        "v = BackwardVariant('bf16', 256, False, 'shift')\n"
        "print(compile_kernel(render_variant(v)).resources[v.kernel_name].registers)\n")
    result = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "168"
