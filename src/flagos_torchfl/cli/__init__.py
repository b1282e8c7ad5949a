"""Command-line interface: thin commands that parse, call the API and print.

Each command module offers ``add_parser(subparsers)`` which registers itself and sets
``func(args) -> exit code``.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import ConfigError
from . import detect, env, k8s, ops, run

COMMANDS = [detect, env, run, ops, k8s]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flagos-torchfl",
        description="Run CUDA-written PyTorch code unchanged on whatever AI chip is present.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # a bad FL_* value or option: say so, no traceback
        print(f"flagos-torchfl {args.command}: error: {exc}", file=sys.stderr)
        return 2
