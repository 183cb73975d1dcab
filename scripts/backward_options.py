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
    parser.add_argument("--staged-stats", action=argparse.BooleanOptionalAction, default=None,
                        help="the Hopper backward with or without Sm90BwdConfig.staged_stats "
                        "(default: dashgen's, on at head_dim 128; offered there only)")
    parser.add_argument("--fused-convert", action=argparse.BooleanOptionalAction, default=None,
                        help="the Hopper backward with or without Sm90BwdConfig.fused_convert "
                        "(dQ converted in the main kernel; default: dashgen's, per problem)")
    parser.add_argument("--first-dq-store", action=argparse.BooleanOptionalAction,
                        default=None, help="the Hopper backward with or without "
                        "Sm90BwdConfig.first_dq_store (default: dashgen's, on)")
    parser.add_argument("--ds-stmatrix", action=argparse.BooleanOptionalAction, default=None,
                        help="the Hopper backward with or without Sm90BwdConfig.ds_stmatrix "
                        "(default: dashgen's, on at head_dim 128)")
    parser.add_argument("--early-kv", action=argparse.BooleanOptionalAction, default=None,
                        help="the Hopper backward with or without Sm90BwdConfig.early_kv "
                        "(K/V of the next KV segment loaded early; default: dashgen's, per "
                        "problem)")


def apply(args: argparse.Namespace) -> str:
    """Set runtime.SM90_BWD_OPTIONS from the flags; returns a file-name suffix naming the
    options switched from their defaults ("" when none is)."""
    runtime.SM90_BWD_OPTIONS["double_ds"] = args.double_ds
    runtime.SM90_BWD_OPTIONS["overlap_softmax"] = args.overlap_softmax
    switched = {name: getattr(args, name) for name in ("first_dq_store", "staged_stats",
                                                       "fused_convert", "early_kv",
                                                       "ds_stmatrix")
                if getattr(args, name) is not None}
    runtime.SM90_BWD_OPTIONS.update(switched)
    return (("_doubleds" if args.double_ds else "") +
            ("_overlapsoftmax" if args.overlap_softmax else "") +
            "".join(f"_{name.replace('_', '')}{int(value)}" for name, value in switched.items()))
