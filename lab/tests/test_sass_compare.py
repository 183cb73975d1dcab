"""lab/sass_compare.py's reading of nvdisasm listings and its verdicts, on listings written
here in nvdisasm's layout (sections, addresses, predicates, labels), without a compiler."""
from __future__ import annotations


import sass_compare  # lab/ is on the path (the root conftest.py)

LISTING = """\
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
\t.section\t.text.k_preprocess,"ax",@progbits
.text.k_preprocess:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   EXIT ;
.L_x_0:
        /*0020*/                   BRA `(.L_x_0) ;
\t.section\t.text.k,"ax",@progbits
.text.k:
        /*0000*/                   CS2R R24, SRZ ;
        /*0010*/                   CS2R R26, SRZ ;
        /*0020*/              @!P0 BRA `(.L_x_3) ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], RZ, !UPT ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
.L_x_3:
        /*0050*/                   EXIT ;
"""


def test_functions_are_read_per_section_without_addresses_or_labels():
    funcs = sass_compare.functions(LISTING)
    assert list(funcs) == ["k_preprocess", "k"]
    assert funcs["k_preprocess"] == ["LDC R1, c[0x0][0x28]", "EXIT", "BRA `(.L_x_0)"]
    assert funcs["k"] == ["CS2R R24, SRZ", "CS2R R26, SRZ", "@!P0 BRA `(.L_x_3)",
                          "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], RZ, !UPT",
                          "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]


def test_addresses_do_not_decide_but_order_and_operands_do():
    old = sass_compare.functions(LISTING)["k"]
    moved = sass_compare.functions(LISTING.replace("/*0000*/", "/*0100*/"))["k"]
    assert sass_compare.verdict(old, moved) == ("same", {})
    swapped = [old[1], old[0], *old[2:]]
    assert sass_compare.verdict(old, swapped) == ("reordered", {})
    renamed = [old[0], "CS2R R28, SRZ", *old[2:]]
    assert sass_compare.verdict(old, renamed) == ("differs", {})


def test_differs_names_the_opcodes_whose_counts_moved():
    old = sass_compare.functions(LISTING)["k"]
    new = [i for i in old if not i.startswith("CS2R")]
    new += ["@P1 FSEL R1, R1, -INF , !P0", "MUFU.EX2 R2, R2"]
    what, moved = sass_compare.verdict(old, new)
    assert what == "differs"
    assert moved == {"CS2R": -2, "FSEL": 1, "MUFU": 1}


def test_report_counts_functions_by_verdict_and_one_sided_kernels():
    funcs = sass_compare.functions(LISTING)
    other = dict(funcs, k=[*funcs["k"][:-1], "NOP", "EXIT"])
    text = sass_compare.report({"a": funcs, "gone": funcs}, {"a": other, "added": funcs})
    assert "| a | k | 6 / 7 | differs | NOP +1 |" in text
    assert "| a | k_preprocess | 3 / 3 | same |  |" in text
    assert "| gone | k | 6 / 0 | only in old |  |" in text
    assert "| added | k | 0 / 6 | only in new |  |" in text
    assert text.splitlines()[-1] == "functions: 1 differs, 2 only in new, 2 only in old, 1 same"


def test_nvdisasm_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("NVDISASM", "/opt/somewhere/nvdisasm")
    assert sass_compare.find_nvdisasm() == "/opt/somewhere/nvdisasm"
