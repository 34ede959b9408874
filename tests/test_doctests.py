"""The docstrings' examples run: every module of the package with `>>>` examples is checked with
`doctest`, under its installed name (so `harness_gym.tasks`, not the `tasks/` folder).

Examples that need a harness CLI or a remote service are written as plain code blocks, not
`>>>` examples; everything written as `>>>` runs here, on the cheap engines (tiny, oracle), and
no `>>>` example is skipped: a module's examples either run or the module needs something this
machine lacks (`NEEDS`), and then the whole module is skipped with that reason.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import shutil

import pytest

import harness_gym

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.IGNORE_EXCEPTION_DETAIL


# Folders installed into the package through setup.cfg's package_dir: an editable install does
# not put them under harness_gym.__path__, so they are walked on their own.
MAPPED = ("harness_gym.harnesses", "harness_gym.tasks", "harness_gym.wrappers")


def _bwrap_works() -> bool:
    from harness_gym.sandbox.bwrap import bwrap_available

    return shutil.which("bwrap") is not None and bwrap_available()


# Modules whose examples need a machine part; the check says whether it is there.
NEEDS = {
    "harness_gym.sandbox": ("a working bubblewrap (the default sandbox)", _bwrap_works),
    "harness_gym.sandbox.bwrap": ("a working bubblewrap", _bwrap_works),
}


def modules_with_examples() -> list[str]:
    names = [harness_gym.__name__, *MAPPED]
    for package in (harness_gym, *map(importlib.import_module, MAPPED)):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if ".tasks.builtin" not in info.name:
                names.append(info.name)
    found = []
    for name in dict.fromkeys(names):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and ">>>" in open(spec.origin, encoding="utf-8").read():
            found.append(name)
    return found


@pytest.mark.parametrize("module", modules_with_examples())
def test_the_examples_in_the_docstrings_run(module: str) -> None:
    if module in NEEDS and not NEEDS[module][1]():
        pytest.skip(f"{module}'s examples need {NEEDS[module][0]}")
    tests = doctest.DocTestFinder().find(importlib.import_module(module))
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0, f"{module} has `>>>` examples but none of them ran"
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed"
