"""The notebooks in notebooks/: each one executes top to bottom in a fresh kernel and draws at
least one figure, and the committed files carry no outputs.

Executing needs the ``notebooks`` extra (matplotlib, nbclient, nbformat, ipykernel); without it
those tests skip. The checks of the committed files need only the standard library.
"""
import json
import os
import sys
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = [
    "01_attention.ipynb",
    "02_multihead_attention.ipynb",
    "03_positional_encodings.ipynb",
    "04_layernorm_ffn_residuals.ipynb",
    "05_kv_cache.ipynb",
    "06_training_gpt_encdec.ipynb",
    "07_lora.ipynb",
    "08_dpo.ipynb",
    "09_gradcheck_exercises.ipynb",
    "10_classical_nlp.ipynb",
    "11_pretraining.ipynb",
]
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# Outputs a committed notebook may carry, in characters of JSON (none is the rule; this
# leaves room for a short printed line, never for images).
MAX_OUTPUT_CHARS = 2000
CELL_TIMEOUT = 300     # seconds per cell; the slowest cell trains a small model in seconds


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _ids(paths):
    return [p.name for p in paths]


# ---------------------------------------------------------------------------------------
# The committed files
# ---------------------------------------------------------------------------------------

def test_every_notebook_is_present():
    missing = sorted(set(EXPECTED) - {p.name for p in NOTEBOOKS})
    assert not missing, f"notebooks missing from {NOTEBOOK_DIR}: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_notebook_is_clean(path):
    nb = _read(path)
    assert nb["nbformat"] == 4
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cell"
    assert any(c["cell_type"] == "markdown" for c in nb["cells"])
    size = 0
    for cell in code:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            assert not any(k.startswith("image/") for k in data), \
                f"{path.name} is committed with an image output; strip the outputs"
            size += len(json.dumps(out))
    assert size <= MAX_OUTPUT_CHARS, \
        f"{path.name} carries {size} characters of outputs; commit notebooks without outputs"


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def notebook_runner(tmp_path_factory):
    """Execute a notebook in a fresh kernel of this interpreter; returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")

    # A "python3" kernel that runs this interpreter (the one numpytfmr is installed in),
    # whatever "python" on PATH is: the directory goes first on JUPYTER_PATH.
    jupyter_dir = tmp_path_factory.mktemp("jupyter")
    spec_dir = jupyter_dir / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")

    patch = pytest.MonkeyPatch()
    old = os.environ.get("JUPYTER_PATH")
    patch.setenv("JUPYTER_PATH", str(jupyter_dir) + (os.pathsep + old if old else ""))
    patch.setenv("MPLBACKEND", "Agg")           # headless; the notebooks draw inline
    # the models are tiny: one BLAS thread is faster than several fighting over two cores
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        patch.setenv(var, "1")

    def run(path):
        nb = nbformat.read(str(path), as_version=4)
        client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                         resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
        client.execute()                        # raises CellExecutionError on any error
        return nb

    yield run
    patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes_and_draws(notebook_runner, path):
    nb = notebook_runner(path)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert figures, f"{path.name} drew no figure"
