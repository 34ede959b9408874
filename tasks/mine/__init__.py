"""Tasks from real code: bugs injected into a registry package, and a repository's own history.

    from harness_gym.tasks.mine import make_tasks
    make_tasks(pypi="inflection==0.5.1", n=20, out=Path("mined"))      # mutants its suite catches
    make_tasks(git=Path("mylib"), since="v1.0", n=20, out=Path("mined"))  # SWE-bench's rule
    make_tasks(git=[Path("lib_a"), Path("lib_b")], n=20, out=Path("suite"))  # several, in turn
    # then: gym.make("HarnessSWE-v0", tasks="mined", ...)

Also `harness-gym tasks make --pypi NAME==VER | --git PATH... [--since REV] --n N --out DIR`.
docs/own-tasks-mining.md says how to turn a repository into a training suite.

Modules, one concept each: `pypi` (sdist and declared test dependencies), `envs` (the cached
venv a task's tests run with, and its read-only mount), `image_env` (that venv for a docker
image's own Python), `releases` (a package's releases as a git history), `project` (layout:
tests, sources, test command), `runs` (a suite run in the sandbox, cached by content), `mutate`
(the `ast` bugs), `inject` (mutants -> candidates), `history` (commits -> candidates), `several`
(repositories taken in turn), `candidate` (rows, statement, difficulty, writing), `split`
(train/held-out by file or function), `make` (the mining loop: validation, duplicates, resume,
summary), `cli` (`harness-gym tasks make`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MiningSummary", "make_tasks"]


def __getattr__(name: str) -> Any:
    # Lazy: `tasks.validation` imports `envs` from here, and `make` imports `validation`.
    if name in __all__:
        from . import make

        return getattr(make, name)
    raise AttributeError(name)
