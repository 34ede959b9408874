"""The notebooks run top to bottom in a real Jupyter kernel, and are stored executed (their
plots and token views visible to a reader of the repository; `scripts/execute-notebooks`)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
TRACE_VIEWS = {"quickstart", "grpo_loop"}  # the notebooks that run episodes show their tokens

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="the notebooks run Pi")


def _kernel_name() -> str:
    """`python3` where it is this interpreter's kernel (the venv's, as registered by
    `python -m ipykernel install --sys-prefix`), else skip: another Python lacks the package."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no python3 Jupyter kernel: python -m ipykernel install --sys-prefix")
    executable = spec.argv[0]
    if executable not in ("python", sys.executable) and Path(executable).resolve() != Path(sys.executable).resolve():
        pytest.skip(f"the python3 kernel runs {executable}, not this interpreter")
    return "python3"


def test_both_notebooks_are_there():
    assert {"quickstart", "grpo_loop"} <= set(NAMES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_a_notebook_is_stored_executed_top_to_bottom(path: Path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        f"run scripts/execute-notebooks {path.relative_to(path.parent.parent)}"
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    data = [kind for o in outputs for kind in o.get("data", {})]
    assert "image/png" in data  # a plot
    if path.stem in TRACE_VIEWS:
        assert any("harness-gym-trace" in o.get("data", {}).get("text/html", "")
                   for o in outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_a_notebook_runs_top_to_bottom_in_minutes(path: Path, tmp_path: Path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, kernel_name=_kernel_name(), timeout=120,
        resources={"metadata": {"path": str(tmp_path)}},  # runs in a scratch dir
    )
    started = time.monotonic()
    client.execute()  # raises CellExecutionError with the cell's traceback on failure
    elapsed = time.monotonic() - started
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    # Quiet, each takes 10-40 s here; the bound (not a speed test) catches a notebook that
    # starts a real training run, with room for a loaded CI machine.
    assert elapsed < 180, f"{path.name} took {elapsed:.0f} s"
