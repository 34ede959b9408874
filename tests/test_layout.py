"""The layout shows the architecture: the package is built in floors, and no import runs back
up a floor (invariant of STYLE: "a reader should find where a request becomes tokens in one hop").

Every import in the source is read with `ast`, the ones inside functions too (a lazy import is
still a dependency), and mapped to the unit it names: a top-level module (`config`, `trace`) or a
wing (`proxy`, `scaleout`, ...). A unit may import units on lower floors only.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the import package it installs as (setup.cfg's package_dir).
PACKAGE_DIRS = {"harness_gym": "harness_gym", "harnesses": "harness_gym.harnesses",
                "tasks": "harness_gym.tasks", "wrappers": "harness_gym.wrappers"}
FLOORS = [
    {"plugins", "trace", "rewards", "_moved"},          # foundations: the segment schema, rewards
    {"engines", "sandbox"},                              # what samples, where code runs
    {"proxy", "harness", "tasks", "wrappers"},           # the wire, the CLI seam, tasks, wrappers
    {"config", "harnesses"},                             # one record of the settings; CLI specs
    {"episode", "harness_check"},                        # one macro-step; a CLI checked alone
    {"env", "scaleout"},                                 # the env; where episodes run
    {"vector_env"},
    {"integrations", "training", "runs"},                # trainers, SFT, run files
    {"cli", "__init__"},
]
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *parts[:-1]] if is_package else [package, *parts])
            found[name] = (path, is_package)
    return found


def _imports(name: str, path: Path, is_package: bool) -> set[str]:
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in named if n.startswith("harness_gym.")}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _unit_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, (path, is_package) in _modules().items():
        for target in _imports(name, path, is_package):
            if _unit(target) != _unit(name):
                edges[_unit(name)].add(_unit(target))
    return edges


def test_every_unit_of_the_package_has_a_floor():
    units = {_unit(name) for name in _modules()}
    assert units - FLOOR.keys() == set(), "give each new module or wing a floor in FLOORS"


def test_no_import_runs_back_up_a_floor():
    upward = sorted(f"{a} (floor {FLOOR[a]}) imports {b} (floor {FLOOR[b]})"
                    for a, targets in _unit_edges().items() for b in targets
                    if b in FLOOR and FLOOR[b] >= FLOOR[a])
    assert upward == []


def test_no_two_modules_import_each_other_even_lazily():
    # A module reading names from its own package's facade (`from . import X`) is not a circle
    # between concepts; every other import counts, lazy ones included.
    modules = _modules()
    edges = {name: {t for t in _imports(name, *where)
                    if t in modules and t != name and not name.startswith(t + ".")}
             for name, where in modules.items()}
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_ray_cluster_record_does_not_import_the_executor():
    path, is_package = _modules()["harness_gym.scaleout.ray_cluster"]
    assert "harness_gym.scaleout.ray_executor" not in _imports(
        "harness_gym.scaleout.ray_cluster", path, is_package)


@pytest.mark.parametrize("old, new", sorted(importlib.import_module("harness_gym._moved").MOVED.items()))
def test_a_moved_module_still_imports_from_its_old_path_with_a_warning(old, new):
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_public_names_import_from_the_top():
    import harness_gym
    from harness_gym.scaleout.ray_cluster import RayCluster

    assert harness_gym.RayCluster is RayCluster
    assert set(harness_gym.__all__) >= {"EpisodeConfig", "HarnessSWEEnv", "InterceptionProxy",
                                        "RayCluster", "RewardConfig"}
