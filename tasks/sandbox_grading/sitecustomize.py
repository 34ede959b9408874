"""The grader's sitecustomize, shipped next to the `_harness_gym_grading` package for unittest
and Django tasks: arms the unittest hooks at interpreter startup (before the test runner or any
code under test is imported), then runs the interpreter's own sitecustomize, if it has one."""

import os
import sys


def _arm():
    if os.environ.get("HARNESS_GYM_GRADER_UNITTEST") == "1":
        os.environ.pop("HARNESS_GYM_GRADER_UNITTEST", None)
        from _harness_gym_grading.unittest_hooks import arm

        arm()


def _chain():
    """Run the next `sitecustomize` on sys.path, which this module shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec("sitecustomize", rest)
    except Exception:  # noqa: BLE001
        return
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_arm()
_chain()
