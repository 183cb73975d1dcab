"""scripts/sass_ctrl.py's reading of `nvdisasm -c -hex` listings: the instructions, their
functions and the control fields of their encodings, on lines nvdisasm wrote for dashgen's
head_dim-64 persistent forward (NVRTC 13.0, sm_90a), without a compiler."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sass_ctrl  # noqa: E402

LISTING = """\
.text.dashgen_fwd_bf16_d64_full_persistent:
        /*4a90*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                                   /* 0x00008000000079c5 */
                                                                                                     /* 0x000fe40000010000 */
        /*4aa0*/                   UIADD3 UR14, UR14, 0x1, URZ ;                                     /* 0x000000010e0e7890 */
                                                                                                     /* 0x000fe2000fffe03f */
.L_x_55:
        /*4ab0*/                   SHFL.BFLY PT, R9, R16, 0x1, 0x1f ;                                /* 0x0c201f0010097f89 */
                                                                                                     /* 0x000e2600000e0000 */
        /*4ac0*/                   UISETP.GE.AND UP0, UPT, UR14, UR5, UPT ;                          /* 0x000000050e00728c */
                                                                                                     /* 0x000fe2000bf06270 */
.L_x_56:
        /*4ad0*/                   SHFL.BFLY PT, R20, R11, 0x1, 0x1f ;                               /* 0x0c201f000b147f89 */
                                                                                                     /* 0x000e6200000e0000 */
        /*4ae0*/                   FMNMX.FTZ R9, R16, R9, !PT ;                                      /* 0x0000000910097209 */
                                                                                                     /* 0x001fc40007810000 */
        /*4af0*/                   FMNMX.FTZ R20, R11, R20, !PT ;                                    /* 0x000000140b147209 */
        /*4cc0*/                   FFMA.FTZ R26, R5.reuse, R26, R18.reuse ;                          /* 0x0000001a051a7223 */
                                                                                                     /* 0x140fe20000010012 */
        /*4cd0*/                   FFMA.FTZ R27, R5.reuse, R27, R18.reuse ;                          /* 0x0000001b051b7223 */
                                                                                                     /* 0x140fe20000010012 */
        /*4ce0*/                   MUFU.EX2 R24, R24 ;                                               /* 0x0000001800187308 */
                                                                                                     /* 0x000e220000000800 */
        /*4cf0*/                   FFMA.FTZ R30, R5.reuse, R30, R18.reuse ;                          /* 0x0000001e051e7223 */
                                                                                                     /* 0x140fe20000010012 */
        /*4d00*/                   FFMA.FTZ R31, R5.reuse, R31, R18.reuse ;                          /* 0x0000001f051f7223 */
                                                                                                     /* 0x140fe20000010012 */
        /*4d10*/                   FFMA.FTZ R34, R5, R34, R18.reuse ;                                /* 0x0000002205227223 */
                                                                                                     /* 0x100fe20000010012 */
        /*4d20*/              @!P0 LEA R7, R7, UR6, 0x3 ;                                            /* 0x0000000607078c11 */
                                                                                                     /* 0x000fe2000f8e18ff */
        /*4d30*/                   FFMA.FTZ R35, R5.reuse, R35, R18.reuse ;                          /* 0x0000002305237223 */
                                                                                                     /* 0x140fe20000010012 */
        /*4d40*/                   FFMA.FTZ R38, R5.reuse, R38, R18.reuse ;                          /* 0x0000002605267223 */
"""


def by_address():
    return {ins.address: ins for ins in sass_ctrl.instructions(LISTING)}


def test_instructions_take_their_function_text_and_second_word():
    found = by_address()
    # 4af0 and the last FFMA have no second word in the excerpt: left out, not misread.
    assert sorted(found) == [0x4A90, 0x4AA0, 0x4AB0, 0x4AC0, 0x4AD0, 0x4AE0, 0x4CC0, 0x4CD0,
                             0x4CE0, 0x4CF0, 0x4D00, 0x4D10, 0x4D20, 0x4D30]
    assert {ins.function for ins in found.values()} == {"dashgen_fwd_bf16_d64_full_persistent"}
    assert found[0x4D20].text == "@!P0 LEA R7, R7, UR6, 0x3"
    assert found[0x4A90].control == sass_ctrl.decode(0x000FE40000010000)


def test_reuse_flags_match_the_reuse_marks_nvdisasm_prints():
    """Source operand slots a, b, c of an FFMA are its three sources in text order; bit i of
    the reuse field is slot i. nvdisasm marks a reused operand `.reuse`: both must agree."""
    ffmas = [ins for ins in sass_ctrl.instructions(LISTING) if ins.text.startswith("FFMA")]
    assert len(ffmas) == 6
    patterns = set()
    for ins in ffmas:
        sources = [s.strip() for s in ins.text.split(",")[1:4]]
        marked = sum(1 << i for i, s in enumerate(sources) if s.endswith(".reuse"))
        assert ins.control.reuse == marked, ins.text
        patterns.add(marked)
    assert patterns == {0b101, 0b100}  # a and c, and c alone (4d10)


def test_variable_latency_results_set_a_scoreboard_that_their_consumer_waits_on():
    found = by_address()
    shfl = found[0x4AB0].control  # SHFL.BFLY ... R9
    assert shfl.write_sb != sass_ctrl.NO_SCOREBOARD
    # FMNMX R9, R16, R9 reads the shuffled R9: it waits on the SHFL's scoreboard.
    assert shfl.write_sb in found[0x4AE0].control.waits_on()
    assert found[0x4CE0].control.write_sb != sass_ctrl.NO_SCOREBOARD  # MUFU.EX2
    for address in (0x4CC0, 0x4CD0, 0x4D10, 0x4A90):  # FFMA, WARPGROUP.DEPBAR: fixed latency
        assert found[address].control.write_sb == sass_ctrl.NO_SCOREBOARD
    assert all(0 <= ins.control.stall <= 15 for ins in found.values())


def test_the_formatted_line_names_the_fields():
    line = sass_ctrl.format_instruction(by_address()[0x4AE0])
    assert re.match(r"04ae0  stall +\d+  y[01]  set -  read -  wait \d", line), line
    assert line.endswith("FMNMX.FTZ R9, R16, R9, !PT")
