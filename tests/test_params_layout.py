"""The kernels' parameter blocks (templates/include/dashgen/attn/params.cuh) against their
ctypes mirrors (dashgen.codegen.variants): every field at the same offset with the same size,
the fields in the same order, and the same sizeof (the entry templates' static_assert checks only
sizeof). params.cuh is compiled here as host code with g++, `__device__` defined away."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from dashgen.codegen.render import include_dir
from dashgen.codegen.variants import (BwdParams, ConvertParams, FwdParams, FwdWindowParams,
                                      PrepParams)

# (A derived block's mirror lists its own fields, as the struct declares them.)
MIRRORS = {"FwdParams": FwdParams, "BwdParams": BwdParams, "PrepParams": PrepParams,
           "ConvertParams": ConvertParams, "FwdWindowParams": FwdWindowParams}
HEADER = "dashgen/attn/params.cuh"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (host C++)")


def struct_fields(name: str) -> list[str]:
    """The field names of `struct name` in params.cuh, in order (declarations such as
    `const i32* a;` or `i32 a, b;`; member functions and comments skipped)."""
    text = (include_dir() / HEADER).read_text()
    body = re.search(r"struct %s(?: : \w+)? \{(.*?)\n\};" % name, text, re.S).group(1)
    fields = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line.endswith(";") or "(" in line:
            continue
        declarators = line[:-1].split(",")
        first = declarators[0].split()[-1].lstrip("*")
        fields += [first] + [d.strip().lstrip("*") for d in declarators[1:]]
    return fields


@pytest.fixture(scope="module")
def offsets(tmp_path_factory):
    """{struct: (sizeof, {field: (offset, size)})} from the header, compiled on the host."""
    # What NVRTC provides and g++ lacks: the qualifiers, uint4, the shared-window conversion.
    lines = ["#include <cstdio>", "#include <cstddef>", "#define __device__",
             "#define __forceinline__ inline", "struct alignas(16) uint4 { unsigned x, y, z, w; };",
             "static inline unsigned long __cvta_generic_to_shared(const void* p) "
             "{ return (unsigned long)p; }",
             f'#include "{HEADER}"', "using namespace dashgen;", "int main() {"]
    for name in MIRRORS:
        lines.append(f'  std::printf("S {name} %zu\\n", sizeof({name}));')
        for field in struct_fields(name):
            lines.append(f'  std::printf("F {name} {field} %zu %zu\\n", offsetof({name}, {field}), '
                         f'sizeof((({name}*)nullptr)->{field}));')
    lines.append("  return 0;\n}")
    folder = tmp_path_factory.mktemp("params")
    (folder / "layout.cpp").write_text("\n".join(lines))
    proc = subprocess.run(["g++", "-std=c++17", "-Wno-invalid-offsetof", f"-I{include_dir()}",
                           str(folder / "layout.cpp"), "-o", str(folder / "layout")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(folder / "layout")], capture_output=True, text=True,
                         check=True).stdout
    result: dict[str, tuple[int, dict]] = {}
    for line in out.splitlines():
        kind, name, *rest = line.split()
        if kind == "S":
            result[name] = (int(rest[0]), {})
        else:
            result[name][1][rest[0]] = (int(rest[1]), int(rest[2]))
    return result


@needs_gxx
@pytest.mark.parametrize("name", list(MIRRORS))
def test_every_field_sits_where_the_mirror_puts_it(offsets, name):
    mirror = MIRRORS[name]
    size, fields = offsets[name]
    assert [f for f, _ in mirror._fields_] == list(fields), f"{name}: field order or names"
    for field, ctype in mirror._fields_:
        got = (getattr(mirror, field).offset, ctypes.sizeof(ctype))
        assert got == fields[field], f"{name}.{field}: mirror {got}, C++ {fields[field]}"
    assert ctypes.sizeof(mirror) == size


def test_the_field_reader_sees_declarations_only():
    assert struct_fields("ConvertParams")[:3] == [f for f, _ in ConvertParams._fields_[:3]]


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_parameter_blocks_are_filled_by_name_only(name):
    block = MIRRORS[name]
    with pytest.raises(TypeError):
        block(1, 2)  # by position: refused, a misplaced value would still launch
    with pytest.raises(TypeError, match=rf"^{name} has no field 'seqlen_x'$"):
        block(seqlen_x=1)
    first, _ = block._fields_[0]
    last_int = next(f for f, t in reversed(block._fields_) if t is ctypes.c_int32)
    filled = block(**{first: 0x1000, last_int: 7})
    assert getattr(filled, first) == 0x1000 and getattr(filled, last_int) == 7
    # A field not named is zero, as the kernels expect of every pointer they do not use.
    assert all(not getattr(filled, f) for f, _ in block._fields_ if f not in (first, last_int))
