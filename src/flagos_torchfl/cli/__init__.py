"""Command-line interface: thin commands that parse, call the API and print.

Each command module offers ``add_parser(subparsers)`` which registers itself and sets
``func(args) -> exit code``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from ..errors import ConfigError

#: the command modules of this package, in the order help lists them
COMMANDS = ["detect", "env", "run", "ops", "k8s", "surface"]


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command ``only`` alone: ``run`` then imports neither
    the other commands nor what they need (the routing tables ``detect`` and ``ops`` show)."""
    parser = argparse.ArgumentParser(
        prog="flagos-torchfl",
        description="Run CUDA-written PyTorch code unchanged on whatever AI chip is present.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only else COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # a bad FL_* value or option: say so, no traceback
        print(f"flagos-torchfl {args.command}: error: {exc}", file=sys.stderr)
        return 2
