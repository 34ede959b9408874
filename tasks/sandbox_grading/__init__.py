"""The grader's in-process half: code that runs inside the sandbox, in the tests' interpreter.

The grader copies this package into a fresh directory in the sandbox (as the top-level package
`_harness_gym_grading`) right before the tests run, puts that directory first on PYTHONPATH,
and loads it into the test runner:

- `pytest_plugin`, loaded with `-p` (through PYTEST_ADDOPTS), before any conftest, test module or
  code under test is imported;
- `entrypoints`, loaded through PYTEST_PLUGINS: it stands in for pytest's plugin autoload, which
  the grader turns off, and loads only plugins installed outside the work tree;
- `unittest_hooks`, armed by the shipped `sitecustomize` for unittest/Django tasks.

Each reports every test's outcome on the `channel` (a file whose records are MAC'd with a key
that only the runner process holds) and watches the runner for tampering (`watch`). The code
under test can print anything; it cannot write a record the grader accepts.

Everything here runs on the task's interpreter, which may be old: Python 3.6+ syntax, no
imports outside the standard library and the test runner, no annotations.
"""

# Environment variables the grader sets for the test command; each process that claims a key
# removes them from its own environment before any code under test runs.
ENV_KEYS = "HARNESS_GYM_GRADER_KEYS"  # a directory of one-time keys, one per runner session
ENV_CHANNEL = "HARNESS_GYM_GRADER_CHANNEL"  # the report file, appended to
ENV_WORKDIR = "HARNESS_GYM_GRADER_WORKDIR"  # the repository under test
ENV_UNITTEST = "HARNESS_GYM_GRADER_UNITTEST"  # "1": arm the unittest hooks at startup

KEY_COUNT = 16  # runner sessions one test command may start (a list of commands, reruns)
SANDBOX_PACKAGE = "_harness_gym_grading"  # the package's name inside the sandbox
