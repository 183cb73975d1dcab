"""lab/patched_tree.py: every patch applies to today's templates (alone and all together) and
changes only its own files; an unknown name or a template that changed under a patch is
refused by name; the patched kernels compile for sm_90a (NVRTC, no GPU) at the entry register
cap without ptxas's slow paths (serialized wgmmas among them)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import patched_tree as tool  # lab/ is on the path (the root conftest.py)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(tool.PATCHES))
def test_each_patch_applies_and_changes_only_its_files(tmp_path, name):
    out = tmp_path / "tree"
    tool.make_tree(ROOT, out, [name])
    touched = {e.path for e in tool.PATCHES[name]}
    for path in touched:
        assert (out / path).read_text() != (ROOT / path).read_text()
        # the package's view of the templates is the patched folder, not a copy
        assert (out / "dashgen" / "templates").resolve() == (out / "templates").resolve()
    for path in (ROOT / "templates").rglob("*"):
        rel = str(path.relative_to(ROOT))
        if path.is_file() and rel not in touched:
            assert (out / rel).read_bytes() == path.read_bytes(), rel


def test_no_dq_traffic_leaves_no_send():
    writer = tool.apply((ROOT / tool.WRITER).read_text(), tool.WRITER,
                        tool.PATCHES["no-dq-traffic"], "no-dq-traffic")
    assert "bulk_reduce_add_f32(" not in writer and "bulk_store_f32(" not in writer
    assert writer.count(tool.NO_SEND) == 4


def test_unknown_names_and_changed_templates_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown patch\(es\) nope; known: no-dq-traffic"):
        tool.make_tree(ROOT, tmp_path / "tree", ["nope"])
    text = (ROOT / tool.WRITER).read_text().replace("bulk_reduce_add_f32(dst", "add(dst")
    with pytest.raises(ValueError, match=r"patch no-dq-traffic: .*bwd_dq_writer.cuh: expected 1"):
        tool.apply(text, tool.WRITER, tool.PATCHES["no-dq-traffic"], "no-dq-traffic")


COMPILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import dashgen
assert dashgen.__file__.startswith(sys.argv[1])
from dashgen.codegen.compile import compile_kernel
from dashgen.codegen.render import include_dir, render_variant
from dashgen.codegen.variants import BackwardVariant
from pathlib import Path
# the copy's own headers, the patched ones, reach the compiler
assert str(include_dir().resolve()).startswith(str(Path(sys.argv[1]).resolve())), include_dir()
out = {}
for hd, causal, schedule, gqa in ((192, False, "shift", False),
                                  (192, True, "symmetric_shift", False),
                                  (192, True, "symmetric_shift", True),
                                  (256, False, "shift", True),
                                  (128, True, "symmetric_shift", False),
                                  (64, False, "shift", False)):
    v = BackwardVariant("bf16", hd, causal, schedule, gqa=gqa)
    cubin = compile_kernel(render_variant(v))
    usage = cubin.resources[v.kernel_name]
    out[v.kernel_name] = [usage.registers, usage.spill_bytes, list(cubin.warnings)]
print(json.dumps(out))
"""


def test_the_patched_kernels_compile_without_slow_paths(tmp_path):
    out = tmp_path / "tree"
    tool.make_tree(ROOT, out, list(tool.PATCHES))
    result = subprocess.run([sys.executable, "-c", COMPILE, str(out)], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name, (registers, spill, warnings) in json.loads(result.stdout).items():
        assert registers == 168, name
        assert not any(code in w for w in warnings for code in ("C7508", "C7511", "C7519")), \
            (name, warnings)
        # tests/test_kernels_compile.py's bounds at 192 for a named walk (24, 24 more under
        # GQA, 16 for the walk in the scheduler lane)
        assert spill <= (64 if name.endswith("_gqa") else 40), (name, spill)
