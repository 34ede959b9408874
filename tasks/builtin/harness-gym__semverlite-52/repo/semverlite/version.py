from __future__ import annotations

import functools
from dataclasses import dataclass

from .errors import InvalidVersion


@functools.total_ordering
@dataclass(frozen=True, eq=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core

    def _key(self):
        # A release sorts after its prereleases; numeric identifiers sort before alphanumeric.
        pre = tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in self.prerelease)
        return (self.major, self.minor, self.patch, not self.prerelease, pre)

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()


def parse(text: str) -> Version:
    """Parse 'MAJOR.MINOR.PATCH[-PRERELEASE]'.

    Raises InvalidVersion (a ValueError) for anything that is not a semantic version.
    """
    core, _, prerelease = text.strip().partition("-")
    major, minor, patch = core.split(".")
    return Version(int(major), int(minor), int(patch), tuple(prerelease.split(".")) if prerelease else ())
