"""Split units of a mined history are the functions a commit changes (`tasks.mine.functions`):
a history whose fixes all live in one file still holds some of them out, a fix spanning a
held-out and a trained function is `mixed`, and the units are named as mutants name theirs."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from harness_gym.tasks import load_tasks
from harness_gym.tasks.mine import make_tasks
from harness_gym.tasks.mine.functions import changed_units
from harness_gym.tasks.mine.history import HistorySource, git
from harness_gym.tasks.mine.mutate import mutants
from harness_gym.tasks.mine.split import heldout_units

from test_task_mining import _commit

CORE = """\
    UNITS = ("m", "cm")


    def area(w, h):
        return w + h


    def perimeter(w, h):
        return w + h


    class Box:
        def __init__(self, w, h):
            self.w, self.h = w, h

        def width(self):
            return self.h

        def scale(self, k):
            return Box(self.w * k, self.h)
    """
TESTS = """\
    from geo.core import UNITS, Box, area, perimeter


    def test_box_keeps_its_sides():
        assert Box(1, 2).h == 2
    """


def _fix(repo: Path, message: str, replacements: list[tuple[str, str]], test: str) -> None:
    core = (repo / "geo/core.py").read_text()
    for old, new in replacements:
        assert old in core, old
        core = core.replace(old, new)
    _commit(repo, message, {"geo/core.py": core,
                            "tests/test_geo.py": (repo / "tests/test_geo.py").read_text() + test})


@pytest.fixture(scope="module")
def one_file_history(tmp_path_factory) -> Path:
    """Six fixes, each with its new test, all in geo/core.py: four functions, a module
    constant, a fix spanning two functions, and a second fix to `Box.width` whose assertion
    extends the test of the first."""
    repo = tmp_path_factory.mktemp("one-file") / "geo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    _commit(repo, "geo: areas and boxes", {"geo/__init__.py": "", "geo/core.py": CORE,
                                           "tests/test_geo.py": TESTS})
    _fix(repo, "area is the product of the sides", [("    return w + h\n\n\ndef perimeter",
                                                     "    return w * h\n\n\ndef perimeter")],
         "\n\ndef test_area():\n    assert area(2, 3) == 6\n")
    _fix(repo, "a box's width is its w", [("        return self.h\n", "        return self.w\n")],
         "\n\ndef test_width():\n    assert Box(2, 3).width() == 2\n")
    _fix(repo, "the perimeter goes round", [("    return w + h\n", "    return 2 * (w + h)\n")],
         "\n\ndef test_perimeter():\n    assert perimeter(2, 3) == 10\n")
    _fix(repo, "millimetres", [('UNITS = ("m", "cm")', 'UNITS = ("m", "cm", "mm")')],
         '\n\ndef test_millimetres():\n    assert "mm" in UNITS\n')
    _fix(repo, "scaling keeps the ratio; no negative areas", [
        ("    return w * h\n", "    return w * h if w > 0 and h > 0 else 0\n"),
        ("Box(self.w * k, self.h)", "Box(self.w * k, self.h * k)")],
        "\n\ndef test_scale():\n    assert Box(1, 2).scale(2).h == 4\n\n\n"
        "def test_no_negative_area():\n    assert area(-1, 2) == 0\n")
    tests = (repo / "tests/test_geo.py").read_text()
    _commit(repo, "the width of a flipped box", {
        "geo/core.py": (repo / "geo/core.py").read_text().replace("return self.w\n",
                                                                  "return abs(self.w)\n"),
        "tests/test_geo.py": tests.replace("assert Box(2, 3).width() == 2\n",
                                           "assert Box(2, 3).width() == 2\n"
                                           "    assert Box(-2, 3).width() == 2\n")})
    return repo


def _units_by_message(repo: Path) -> dict[str, list[str]]:
    source = HistorySource(repo, None, since=None, label="geo", scratch=repo.parent / "scratch")
    return {c.message.split("\n")[0]: source.units(c) for c in source.items()}


def test_each_commit_is_split_by_the_functions_it_changes(one_file_history):
    assert _units_by_message(one_file_history) == {
        "area is the product of the sides": ["geo/core.py::area"],
        "a box's width is its w": ["geo/core.py::Box.width"],
        "the perimeter goes round": ["geo/core.py::perimeter"],
        "millimetres": ["geo/core.py::<module>"],
        "scaling keeps the ratio; no negative areas": ["geo/core.py::area",
                                                       "geo/core.py::Box.scale"],
        "the width of a flipped box": ["geo/core.py::Box.width"],
    }


def test_a_one_file_history_holds_out_a_function_and_a_fix_spanning_two_is_mixed(
        one_file_history, tmp_path):  # fmt: skip
    units = {u for us in _units_by_message(one_file_history).values() for u in us}
    # the seed that holds out `area`: its own fix is held out, the fix of area and scale mixed
    seed = next(s for s in range(200) if heldout_units(units, seed=s) == {"geo/core.py::area"})
    out = tmp_path / "mined"
    summary = make_tasks(git=one_file_history, n=10, out=out, seed=seed, progress=False)
    assert summary.kept == 6 and summary.rejected == {}, summary
    assert summary.split == {"train": 4, "heldout": 1, "mixed": 1}, summary
    split = json.loads((out / "split.json").read_text())
    assert split["unit"] == "function" and split["heldout_units"] == ["geo/core.py::area"]
    tasks = {t.problem_statement.split("\n")[0]: t for t in load_tasks(out)}
    assert tasks["area is the product of the sides"].extra["mine"]["split"] == "heldout"
    spanning = tasks["scaling keeps the ratio; no negative areas"].extra["mine"]
    assert spanning["split"] == "mixed"
    assert spanning["functions"] == ["geo/core.py::area", "geo/core.py::Box.scale"]
    # two fixes of `Box.width`, both failing `test_width` first: two tasks, not a duplicate
    width = [t for t in tasks.values()
             if t.extra["mine"]["functions"] == ["geo/core.py::Box.width"]]  # fmt: skip
    assert [t.FAIL_TO_PASS for t in width] == [["tests/test_geo.py::test_width"]] * 2


SCOPES = """\
    \"\"\"A cache.

    1.0: first release
    \"\"\"

    import functools

    __version__ = "1.0"

    # how many
    LIMIT = 3


    def helper(x):
        return x


    class Cache:
        size = 1

        @property
        def full(self):
            return False

        def get(self, key):
            def inner():
                return key + 1

            return inner()
    """


def test_decorators_classes_nested_deleted_and_new_functions_name_their_scope(tmp_path):
    repo = tmp_path / "lib"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    _commit(repo, "lib", {"lib/core.py": SCOPES, "tests/test_core.py": "def test_x(): pass\n"})
    changed = (textwrap.dedent(SCOPES)
               .replace("# how many", "# how many at most")  # a comment: no code
               .replace("def helper(x):\n    return x\n\n\n", "")  # deleted
               .replace("    size = 1", "    size = 2")  # the class body
               .replace("    @property", "    @functools.cached_property")  # a decorator
               .replace("return key + 1", "return key + 2")  # a nested function
               + "\n\ndef twice(x):\n    return 2 * x\n")  # new, after two blank lines  # fmt: skip
    _commit(repo, "many scopes", {"lib/core.py": changed,
                                  "tests/test_core.py": "def test_y(): pass\n"})
    # release metadata (the version, the module docstring's history) is no code
    released = changed.replace('"1.0"', '"1.1"').replace("first release", "first release\n1.1")
    constant = released.replace("LIMIT = 3", "LIMIT = 4")
    bumped = constant.replace('"1.1"', '"1.2"')
    fixed = bumped.replace('"1.2"', '"1.3"').replace("1.1\n", "1.1\n1.3: twice\n").replace(
        "return 2 * x", "return x + x")
    for message, text in (("a constant", constant), ("a release", bumped), ("a fix", fixed)):
        _commit(repo, message, {"lib/core.py": text, "tests/test_core.py": f"# {message}\n"})
    assert _units_by_message(repo) == {
        "many scopes": ["lib/core.py::helper", "lib/core.py::Cache", "lib/core.py::Cache.full",
                        "lib/core.py::Cache.get.inner", "lib/core.py::twice"],
        "a constant": ["lib/core.py::<module>"],
        "a fix": ["lib/core.py::twice"],
        "a release": ["lib/core.py::<module>"],  # nothing else changed: still one unit
    }


def test_a_mutants_change_is_the_unit_the_mutation_source_names(tmp_path):
    # A bug injected into `Class.method` and a commit changing that method are one unit.
    path = "lib/core.py"
    source = textwrap.dedent(CORE) + "\n\n" + textwrap.dedent(SCOPES)
    (tmp_path / "lib").mkdir()
    (tmp_path / path).write_text(source)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    git(tmp_path, "add", "-A")
    found = mutants(path, source)
    assert {m.function for m in found} >= {"area", "Box.width", "Cache.get.inner"}
    for mutant in found:
        (tmp_path / path).write_text(mutant.source)
        diff = git(tmp_path, "diff", "-U0", "--", path)
        assert changed_units(diff, {path: source}, {path: mutant.source}) == [
            f"{path}::{mutant.function}"], (mutant.kind, mutant.line)
