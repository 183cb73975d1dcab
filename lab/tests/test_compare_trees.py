"""lab/compare_trees.py's table, on figures written here: the ratios and geometric means
it reports, and its bits column, which calls a shape "same" only when every run of both trees
hashed the same (a tree that differs from itself between runs is not the same either)."""
from __future__ import annotations

import sys
from pathlib import Path

import compare_trees  # lab/ is on the path (the root conftest.py)


def run(bwd: float, fwd: float, hashes=("a", "b"), gpu: float | None = None) -> dict:
    row = {"bwd_ms": bwd, "fwd_ms": fwd, "hashes": list(hashes)}
    if gpu is not None:
        row["bwd_gpu_ms"] = gpu
    return row


def test_ratios_are_old_over_new_medians_and_geomeans():
    old = [{"s1": run(2.0, 1.0), "s2": run(4.0, 1.0)}, {"s1": run(2.2, 1.0), "s2": run(4.0, 3.0)},
           {"s1": run(2.4, 1.0), "s2": run(4.0, 1.0)}]
    new = [{"s1": run(1.0, 1.0), "s2": run(4.0, 2.0)}, {"s1": run(1.1, 1.0), "s2": run(4.0, 2.0)},
           {"s1": run(1.2, 1.0), "s2": run(4.0, 2.0)}]
    text = compare_trees.report(old, new)
    assert "| s1 | 2.200 | 1.100 | 2.000 | 1.000 | 1.000 | 1.000 | same |" in text
    assert "| s2 | 4.000 | 4.000 | 1.000 | 1.000 | 2.000 | 0.500 | same |" in text
    assert ("geomean old/new: backward 1.414 (min 1.000), forward 0.707 (min 0.500); "
            "3 runs of each tree, alternated") in text
    assert "host hidden" not in text


def test_bits_differ_when_any_run_of_either_tree_hashes_otherwise():
    same = [{"s": run(1.0, 1.0)}]
    assert "| same |" in compare_trees.report(same * 2, same * 2)
    other_tree = [{"s": run(1.0, 1.0, hashes=("a", "c"))}]
    assert "| DIFFER |" in compare_trees.report(same * 2, other_tree * 2)
    unsteady_old = [{"s": run(1.0, 1.0)}, {"s": run(1.0, 1.0, hashes=("x", "b"))}]
    assert "| DIFFER |" in compare_trees.report(unsteady_old, same * 2)


def test_time_mode_rows_without_hashes_and_with_the_host_hidden_column():
    def timed(bwd, gpu):
        return {"s": {"bwd_ms": bwd, "fwd_ms": 1.0, "bwd_gpu_ms": gpu}}
    text = compare_trees.report([timed(3.0, 2.0)], [timed(2.0, 2.5)])
    row = "| s | 3.000 | 2.000 | 1.500 | 1.000 | 1.000 | 1.000 | - | 2.000 | 2.500 | 0.800 |"
    assert row in text
    assert "backward with the host hidden 0.800 (min 0.800)" in text


def test_forward_only_runs_get_the_forward_table_and_its_three_bit_verdicts():
    def fwd(ms, hashes=("o",)):
        return {"fwd_ms": ms, "hashes": list(hashes)}

    old = [{"s1": fwd(2.0), "s2": fwd(1.0)}, {"s1": fwd(2.2), "s2": fwd(1.0)}]
    new = [{"s1": fwd(1.0), "s2": fwd(2.0, ("p",))}, {"s1": fwd(1.1), "s2": fwd(2.0, ("p",))}]
    text = compare_trees.report(old, new)
    assert text.startswith("| shape | fwd old ms | fwd new ms | old/new | o bits |")
    assert "| s1 | 2.1000 | 1.0500 | 2.000 | same |" in text
    assert "| s2 | 1.0000 | 2.0000 | 0.500 | differ, each tree repeats |" in text
    assert "geomean old/new: forward 1.000 (min 0.500, max 2.000); 2 runs" in text
    unsteady = [{"s1": fwd(1.0), "s2": fwd(1.0, ("q",))}, {"s1": fwd(1.0), "s2": fwd(1.0)}]
    assert "| s2 | 1.0000 | 2.0000 | 0.500 | NOT REPEATED |" in compare_trees.report(unsteady, new)


def test_configs_select_configurations_in_table_order_and_refuse_unknown_names():
    assert compare_trees.configurations(None) == [(64, False), (64, True), (128, False),
                                                  (128, True)]
    assert compare_trees.configurations(("d128_causal", "d64_full")) == [(64, False),
                                                                         (128, True)]
    assert compare_trees.configurations(("d256_causal", "d64_full", "d192_full")) == [
        (64, False), (192, False), (256, True)]
    assert compare_trees.heads(192) == 10 and compare_trees.heads(192, 4) == 8
    try:
        compare_trees.configurations(("d128_full", "d80_full"))
    except ValueError as exc:
        assert "--configs" in str(exc) and "d80_full" in str(exc)
    else:
        raise AssertionError("an unknown configuration was accepted")


def test_gqa_mode_runs_llamas_grouping_and_hashes_all_four_outputs(monkeypatch):
    # measure_gqa on the CPU with a stand-in dashgen (attention over K/V heads repeated per
    # group, as the kernels read them) and a timer that calls once: the shapes it builds, its
    # keys, and that the hashes cover dq, dk, dv and o.
    import torch
    monkeypatch.setattr(compare_trees, "GQA_SEQLENS", (128,))
    seen = []

    class Stand:
        @staticmethod
        def attention(q, k, v, causal, deterministic):
            seen.append((tuple(q.shape), tuple(k.shape), causal, deterministic))
            group = q.shape[2] // k.shape[2]
            k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=causal).transpose(1, 2)

    res = compare_trees.measure_gqa(Stand, lambda fn: (fn(), 1.0)[1], ("d128_causal",),
                                    device="cpu", tokens=256)
    assert list(res) == ["gqa4_d128_causal_128"]
    row = res["gqa4_d128_causal_128"]
    assert row["bwd_ms"] == row["fwd_ms"] == 1.0 and len(row["hashes"]) == 4
    assert seen[0] == ((2, 128, 16, 128), (2, 128, 4, 128), True, True)


def test_several_new_trees_run_alternated_and_each_gets_its_table(monkeypatch, tmp_path):
    # main() with its children replaced by a stand-in that writes one figure per tree: every
    # run visits old, new1, new2 in turn, and each new tree is reported against the old one.
    import json
    figures = {"A": 2.0, "B": 1.0, "C": 4.0}
    visits = []

    def child(cmd, timeout):
        tree, path = cmd[-2:]
        visits.append(tree)
        Path(path).write_text(json.dumps({"s": run(figures[tree], 1.0, hashes=(tree,) if
                                                   tree == "C" else ("a",))}))
        return compare_trees.subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(compare_trees.subprocess, "run", child)
    monkeypatch.setattr(sys, "argv", ["compare_trees.py", "A", "B", "C", "--mode", "bits",
                                      "--runs", "2", "--out", str(tmp_path)])
    compare_trees.main()
    assert visits == ["A", "B", "C", "A", "B", "C"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        f"bits_{n}_{r}.json" for n in ("new1", "new2", "old") for r in (0, 1)]
    text = (tmp_path / "bits.md").read_text()
    first, second = text.split("## new2: C against A")
    assert first.startswith("## new1: B against A")
    assert "| s | 2.000 | 1.000 | 2.000 | 1.000 | 1.000 | 1.000 | same |" in first
    assert "| s | 2.000 | 4.000 | 0.500 | 1.000 | 1.000 | 1.000 | DIFFER |" in second


def test_one_new_tree_keeps_the_old_and_new_names_and_the_plain_table():
    assert compare_trees.run_names(1) == ["old", "new"]
    assert compare_trees.run_names(3) == ["old", "new1", "new2", "new3"]
    runs = {"old": [{"s": run(2.0, 1.0)}], "new": [{"s": run(1.0, 1.0)}]}
    text = compare_trees.report_all({"old": "A", "new": "B"}, runs)
    assert text == compare_trees.report(runs["old"], runs["new"])


def test_a_child_that_hangs_is_killed_and_one_that_fails_is_reported():
    py = sys.executable
    assert compare_trees.run_child([py, "-c", "pass"], timeout=60) is None
    assert compare_trees.run_child([py, "-c", "raise SystemExit(3)"], timeout=60) == (
        "exit status 3")
    assert compare_trees.run_child([py, "-c", "import time; time.sleep(60)"], timeout=0.5) == (
        "killed after --child-timeout (0.5 s)")


def _stand_in_children(monkeypatch, tmp_path, fails: dict[tuple[str, int], int], argv):
    """main() over stand-in children: tree T's r-th visit exits with fails[(T, r)] (a written
    figure and 0 otherwise); returns the visits in order."""
    import json
    visits = []

    def child(cmd, timeout):
        tree, path = cmd[-2:]
        code = fails.get((tree, visits.count(tree)), 0)
        visits.append(tree)
        if code == 0:
            Path(path).write_text(json.dumps({"s": run(2.0, 1.0)}))
        return compare_trees.subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(compare_trees.subprocess, "run", child)
    monkeypatch.setattr(sys, "argv", ["compare_trees.py", *argv, "--mode", "bits", "--runs",
                                      "2", "--out", str(tmp_path)])
    return visits


def test_a_new_tree_that_fails_is_left_out_of_later_runs_and_named(monkeypatch, tmp_path):
    visits = _stand_in_children(monkeypatch, tmp_path, {("B", 0): 1}, ["A", "B", "C"])
    compare_trees.main()
    assert visits == ["A", "B", "C", "A", "C"]
    text = (tmp_path / "bits.md").read_text()
    first, second = text.split("## new2: C against A")
    assert first.strip() == "## new1: B against A\n\nB: left out (run 1: exit status 1)"
    assert "| s | 2.000 | 2.000 | 1.000 | 1.000 | 1.000 | 1.000 | same |" in second


def test_without_the_old_tree_the_comparison_stops(monkeypatch, tmp_path):
    visits = _stand_in_children(monkeypatch, tmp_path, {("A", 1): 2}, ["A", "B"])
    try:
        compare_trees.main()
    except SystemExit as exc:
        assert "old tree A failed (run 2: exit status 2)" in str(exc.code)
    else:
        raise AssertionError("main() went on without the old tree")
    assert visits == ["A", "B", "A"]
    assert not (tmp_path / "bits.md").exists()


def test_long_rows_get_the_price_of_the_order_table_and_no_host_hidden_cells():
    def timed(bwd, nondet=None, gpu=None):
        row = {"bwd_ms": bwd, "fwd_ms": 1.0}
        if nondet is not None:
            row["bwd_nondet_ms"] = nondet
        if gpu is not None:
            row["bwd_gpu_ms"] = gpu
        return row
    old = [{"short": timed(2.0, gpu=2.0), "long": timed(1300.0, nondet=1000.0)}] * 3
    new = [{"short": timed(2.0, gpu=1.0), "long": timed(1000.0, nondet=1000.0)}] * 3
    text = compare_trees.report(old, new)
    assert "| short | 2.000 | 2.000 | 1.000 | 1.000 | 1.000 | 1.000 | - | 2.000 | 1.000 | 2.000 |" \
        in text
    assert "| long | 1300.000 | 1000.000 | 1.300 | 1.000 | 1.000 | 1.000 | - | - | - | - |" in text
    assert "| long | 1300.0 | 1000.0 | 1.300 | 1000.0 | 1000.0 | 1.000 |" in text
    assert "backward with the host hidden 2.000 (min 2.000)" in text


def test_long_rows_are_in_the_default_rows():
    assert set(compare_trees.LONG_SEQLENS) >= {131072, 1048576}
    assert compare_trees.LONG_FROM < min(compare_trees.LONG_SEQLENS)
