"""Modules that moved into wings keep importing from their old flat paths, with a warning.

`harness_gym.ray_cluster` became `harness_gym.scaleout.ray_cluster` (and so on, `MOVED`);
code and pickles written against the old names still load: the old name resolves to the very
module object at the new path, so classes compare equal and state is shared.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "harness_gym.executors": "harness_gym.scaleout.executors",
    "harness_gym.node_runner": "harness_gym.scaleout.node_runner",
    "harness_gym.ray_cluster": "harness_gym.scaleout.ray_cluster",
    "harness_gym.ray_executor": "harness_gym.scaleout.ray_executor",
    "harness_gym.ray_placement": "harness_gym.scaleout.ray_placement",
    "harness_gym.runner_workspace": "harness_gym.scaleout.runner_workspace",
    "harness_gym.trace_view": "harness_gym.runs.trace_view",
    "harness_gym.trace_page": "harness_gym.runs.trace_page",
    "harness_gym.sft": "harness_gym.training.sft",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's API)
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: ANN001
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; import it from there",
                      DeprecationWarning, stacklevel=4)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:  # noqa: ANN001
        # The module is the new one, already executed; keep its own spec and name.
        pass


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
