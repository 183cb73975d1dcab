"""lab/ncu_backward.py's arguments: what it cannot run is refused before torch or a GPU is
touched, naming the argument."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ncu_backward  # lab/ is on the path (the root conftest.py)


@pytest.mark.parametrize("argv, named", [
    (["--impl", "dashgen", "--head-dim", "72", "--mask", "full", "--seqlen", "1024"],
     "--head-dim"),
    (["--impl", "dashgen", "--head-dim", "64", "--mask", "sliding", "--seqlen", "1024"],
     "--mask"),
    (["--impl", "dashgen", "--head-dim", "64", "--mask", "full", "--seqlen", "3000"],
     "--seqlen"),
    (["--impl", "fa3", "--head-dim", "64", "--mask", "full", "--seqlen", "1024"], "--fa3-path"),
])
def test_bad_arguments_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        ncu_backward.parse(argv)
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("head_dim", [32, 48, 64, 80, 96, 112, 128, 192, 256])
def test_every_served_head_dim_is_taken(head_dim):
    args = ncu_backward.parse(["--impl", "dashgen", "--head-dim", str(head_dim), "--mask", "full",
                               "--seqlen", "16384"])
    assert args.head_dim == head_dim


def test_fa3_path_must_hold_its_interface(tmp_path, capsys):
    argv = ["--impl", "fa3", "--fa3-path", str(tmp_path), "--head-dim", "128", "--mask",
            "causal", "--seqlen", "8192"]
    with pytest.raises(SystemExit):
        ncu_backward.parse(argv)
    assert "flash_attn_interface.py" in capsys.readouterr().err
    (tmp_path / "flash_attn_interface.py").write_text("")
    args = ncu_backward.parse(argv)
    assert (args.impl, args.head_dim, args.mask, args.seqlen) == ("fa3", 128, "causal", 8192)


def test_nondeterministic_reaches_fa3s_call(tmp_path):
    """--nondeterministic is FA3's deterministic=False (a stand-in flash_attn_interface records
    the call); without it the call is deterministic."""
    (tmp_path / "flash_attn_interface.py").write_text(
        "calls = []\n"
        "def flash_attn_func(q, k, v, **kwargs):\n"
        "    calls.append(kwargs)\n"
        "    return ('o', 'lse')\n")
    base = ["--impl", "fa3", "--fa3-path", str(tmp_path), "--head-dim", "128", "--mask", "full",
            "--seqlen", "8192"]
    try:
        for argv, deterministic in ((base, True), (base + ["--nondeterministic"], False)):
            assert ncu_backward.attention_fn(ncu_backward.parse(argv))(1, 2, 3) == "o"
            import flash_attn_interface
            assert flash_attn_interface.calls[-1] == {"causal": False,
                                                      "deterministic": deterministic}
    finally:
        sys.modules.pop("flash_attn_interface", None)
        while str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_override_flags_reach_dashgens_runtime_only(tmp_path, capsys):
    """--early-kv on (lab/time_kernels.py's flags) selects the runtime's backward with those
    Overrides; FA3 takes none and is refused by name."""
    args = ncu_backward.parse(["--impl", "dashgen", "--head-dim", "256", "--mask", "full",
                               "--seqlen", "4096", "--early-kv", "on"])
    assert ncu_backward.overridden(args) and args.early_kv == "on"
    plain = ncu_backward.parse(["--impl", "dashgen", "--head-dim", "256", "--mask", "full",
                                "--seqlen", "4096"])
    assert not ncu_backward.overridden(plain)
    (tmp_path / "flash_attn_interface.py").write_text("")
    with pytest.raises(SystemExit):
        ncu_backward.parse(["--impl", "fa3", "--fa3-path", str(tmp_path), "--head-dim", "256",
                            "--mask", "full", "--seqlen", "4096", "--early-kv", "on"])
    assert "--impl dashgen" in capsys.readouterr().err
