"""tests/lanes.txt, the lanes scripts/test-lanes runs (lanes `a` and `b` at once, then `alone`),
holds every test module exactly once, so a module added without a lane is caught here rather than
left out of a laned run, and that the runner hands each lane its modules (its dry run: no pytest
run)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LANES = TESTS / "lanes.txt"
NAMES = ("a", "b", "alone")


def lanes() -> list[tuple[str, str]]:
    """(lane, module path) per line, in the file's order; comments and blank lines left out."""
    rows = []
    for line in LANES.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            assert len(fields) == 2, f"not `<lane> <path>`: {line!r}"
            rows.append((fields[0], fields[1]))
    return rows


def test_every_test_module_is_in_exactly_one_lane() -> None:
    listed = Counter(path for _, path in lanes())
    modules = {f"tests/{p.name}" for p in TESTS.glob("test_*.py")}
    assert sorted(m for m in modules if m not in listed) == [], "modules without a lane"
    assert sorted(p for p in listed if p not in modules) == [], "lanes name missing modules"
    assert sorted(p for p, n in listed.items() if n > 1) == [], "modules in more than one lane"


def test_each_line_names_a_known_lane_and_a_path_the_runner_can_pass_as_one_word() -> None:
    for lane, path in lanes():
        assert lane in NAMES, (lane, path)
        assert re.fullmatch(r"tests/test_\w+\.py", path), path


def test_the_modules_that_start_a_local_ray_instance_never_run_at_the_same_time() -> None:
    """A `RayCluster` given `init_kwargs` and no address is `ray.init()` starting a local
    instance, on the default /tmp/ray and the fixed dashboard-agent port 52365: two at once would
    share both, so such modules are never split over lanes `a` and `b`."""
    needle = "RayCluster(init_kwargs="
    starts = {(lane, path) for lane, path in lanes()
              if path != f"tests/{Path(__file__).name}"  # this file names the needle
              and needle in (TESTS.parent / path).read_text()}
    assert starts, "no module starts a local Ray instance: drop this test"
    assert not {"a", "b"} <= {lane for lane, _ in starts}, sorted(starts)


def test_the_runner_hands_each_lane_its_modules_in_order_with_the_arguments_given() -> None:
    done = subprocess.run([str(TESTS.parent / "scripts" / "test-lanes"), "--dry-run", "-x"],
                          capture_output=True, text=True, timeout=60, check=True)
    commands = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert sorted(commands) == sorted(NAMES)
    for name in NAMES:
        words = commands[name].split()
        modules = [w for w in words if w.startswith("tests/")]
        assert modules == [path for lane, path in lanes() if lane == name]
        assert "-x" in words and any(w.startswith("--basetemp=") and w.endswith(f"/{name}")
                                     for w in words)
