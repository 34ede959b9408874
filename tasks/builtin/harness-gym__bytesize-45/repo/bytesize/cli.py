from __future__ import annotations

import argparse
import os
from pathlib import Path

from .report import usage_table


def directory_sizes(root: Path) -> dict[str, int]:
    """Total size of the files under each direct child of `root`."""
    sizes = {}
    for child in sorted(root.iterdir()):
        if child.is_file():
            sizes[child.name] = child.stat().st_size
        else:
            sizes[child.name] = sum(
                (Path(folder) / name).stat().st_size
                for folder, _, names in os.walk(child)
                for name in names
            )
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bytesize")
    parser.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    print(usage_table(directory_sizes(args.root)))
    return 0
