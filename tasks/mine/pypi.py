"""A package from the registry as a tree to mine: its sdist, unpacked, and what its tests
need.

`fetch_sdist("inflection==0.5.1", dest)` (`cached_sdist(pin)`: once, in the cache) runs
`pip download --no-deps --no-binary :all:` (the sdist is the one artifact that ships the tests)
and unpacks it. `test_requirements(root)` reads what the sdist declares: `Requires-Dist` of
`PKG-INFO` (or `*.egg-info/requires.txt`) without an extra or with a test extra (`test`,
`tests`, `testing`), `pyproject.toml`'s dependencies and test extras, and
`requirements*test*.txt` files.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

__all__ = ["SdistError", "cached_sdist", "fetch_sdist", "parse_pin", "test_requirements"]

TEST_EXTRAS = ("test", "tests", "testing")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
DOWNLOAD_TIMEOUT_S = 300


class SdistError(ValueError):
    """The requirement is malformed, or its sdist cannot be fetched or unpacked."""


def parse_pin(requirement: str) -> tuple[str, str]:
    match = _PIN.match(requirement.strip())
    if not match:
        raise SdistError(f"--pypi wants NAME==VERSION (an exact pin), got {requirement!r}")
    return match.group(1), match.group(2)


def fetch_sdist(requirement: str, dest: Path) -> Path:
    """Download and unpack the sdist of `NAME==VERSION` into `dest`; return the project root."""
    name, version = parse_pin(requirement)
    with tempfile.TemporaryDirectory(prefix="harness-gym-sdist-") as scratch:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--no-binary", ":all:", "--disable-pip-version-check", "-d", scratch,
                   f"{name}=={version}"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  timeout=DOWNLOAD_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SdistError(f"pip download {name}=={version} ran past {DOWNLOAD_TIMEOUT_S}s")
        archives = sorted(Path(scratch).iterdir())
        if done.returncode != 0 or not archives:
            raise SdistError(f"no sdist of {name}=={version} on the registry: "
                             f"{done.stderr.strip()[-800:]}")  # fmt: skip
        _unpack(archives[0], dest)
    tops = [p for p in dest.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else dest


def cached_sdist(requirement: str) -> Path:
    """The unpacked sdist of `NAME==VERSION`, fetched once into the cache; its project root."""
    from ...engines._cache import build_once

    name, version = parse_pin(requirement)
    built = build_once(f"mine-sdist-{name}-{version}",
                       lambda d: fetch_sdist(requirement, d / "unpacked"))  # fmt: skip
    unpacked = built / "unpacked"
    entries = list(unpacked.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():
                _inside(dest, member)
            zipped.extractall(dest)
        return
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")  # refuses links and paths out of dest


def _inside(dest: Path, member: str) -> None:
    if not (dest / member).resolve().is_relative_to(dest.resolve()):
        raise SdistError(f"the sdist holds a path outside its folder: {member}")


def test_requirements(root: Path) -> list[str]:
    """What the project's tests need from the registry, as pip requirement strings."""
    from packaging.requirements import InvalidRequirement, Requirement

    declared: list[str] = []
    info = root / "PKG-INFO"
    if info.is_file():
        metadata = Parser().parsestr(info.read_text(encoding="utf-8", errors="replace"))
        declared += metadata.get_all("Requires-Dist") or []
    declared += _pyproject_requirements(root / "pyproject.toml")
    for requires in root.glob("*.egg-info/requires.txt"):
        declared += _requires_txt(requires.read_text())
    for listed in [*root.glob("requirements*test*.txt"), *root.glob("test*requirements*.txt"),
                   *root.glob("requirements/test*.txt")]:  # fmt: skip
        declared += [line.split("#")[0].strip() for line in listed.read_text().splitlines()]
    wanted: set[str] = set()
    for text in declared:
        if not text or text.startswith(("-", ".")):
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *TEST_EXTRAS)):
            requirement.marker = None
            wanted.add(str(requirement))
    return sorted(wanted)


def _pyproject_requirements(path: Path) -> list[str]:
    """`[project] dependencies` and the test extras of `optional-dependencies`."""
    import tomllib

    if not path.is_file():
        return []
    try:
        project = tomllib.loads(path.read_text()).get("project", {})
    except (tomllib.TOMLDecodeError, UnicodeError):
        return []
    extras = project.get("optional-dependencies", {})
    found = list(project.get("dependencies", []))
    for extra in TEST_EXTRAS:
        found += extras.get(extra, [])
    return [r for r in found if isinstance(r, str)]


def _requires_txt(text: str) -> list[str]:
    """egg-info's requires.txt: plain lines, then `[extra]` or `[extra:marker]` sections."""
    out, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif line and section.split(":")[0] in ("", *TEST_EXTRAS):
            out.append(line if ":" not in section else f"{line}; {section.split(':', 1)[1]}")
    return out
