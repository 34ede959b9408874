from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..wrap import wrap_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tinyfmt", description=__doc__)
    parser.add_argument("--width", type=int, default=72)
    parser.add_argument("--version", action="store_true")
    args = parser.parse_args(argv)
    if args.version:
        print(f"tinyfmt {__version__}")
        return 0
    print(wrap_text(sys.stdin.read(), width=args.width))
    return 0
