"""Command-line switches for the Hopper backward's options (runtime.SM90_BWD_OPTIONS), shared by
the scripts that check and time kernels on a GPU."""
from __future__ import annotations

import argparse

from dashgen import runtime


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--double-ds", action="store_true",
                        help="the Hopper backward with Sm90BwdConfig.double_ds (an experiment)")
    parser.add_argument("--overlap-softmax", action="store_true",
                        help="the Hopper backward with Sm90BwdConfig.overlap_softmax (an "
                             "experiment)")
    parser.add_argument("--staged-stats", action="store_true",
                        help="the Hopper backward with Sm90BwdConfig.staged_stats (an "
                             "experiment, head_dim 128)")
    parser.add_argument("--first-dq-store", action=argparse.BooleanOptionalAction,
                        default=None, help="the Hopper backward with or without "
                        "Sm90BwdConfig.first_dq_store (default: dashgen's, on)")


def apply(args: argparse.Namespace) -> str:
    """Set runtime.SM90_BWD_OPTIONS from the flags; returns a file-name suffix naming the
    options switched from their defaults ("" when none is)."""
    runtime.SM90_BWD_OPTIONS["double_ds"] = args.double_ds
    runtime.SM90_BWD_OPTIONS["overlap_softmax"] = args.overlap_softmax
    runtime.SM90_BWD_OPTIONS["staged_stats"] = args.staged_stats
    if args.first_dq_store is not None:
        runtime.SM90_BWD_OPTIONS["first_dq_store"] = args.first_dq_store
    return (("_doubleds" if args.double_ds else "") +
            ("_overlapsoftmax" if args.overlap_softmax else "") +
            ("_stagedstats" if args.staged_stats else "") +
            ("" if args.first_dq_store is None else f"_firstdqstore{int(args.first_dq_store)}"))
