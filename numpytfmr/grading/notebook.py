"""Submissions as code: a .py file, or the code cells of a Jupyter notebook.

A notebook becomes one chunk per code cell (``homework.ipynb [cell 4]`` in tracebacks), with
IPython shell and magic lines (``!pip ...``, ``%timeit ...``, ``x = !ls``) replaced by ``pass``
and cell magics (``%%bash``) dropped. The submission process runs the cells in order; a cell
that raises is reported and the next cells still run, as in a notebook.
"""
import json
import os
import re

__all__ = ["SubmissionError", "find_submission", "read_submission", "notebook_to_chunks",
           "make_notebook"]

# `!cmd`, `%magic`, `x = !cmd`, `x = %magic` at any indentation
_MAGIC = re.compile(r"^(\s*)(?:[!%]|[\w.,\s\[\]]+=\s*[!%])")


class SubmissionError(ValueError):
    """The submission cannot be read (missing file, unknown type, broken notebook)."""


def find_submission(path, name=None):
    """The file to grade: ``path`` itself, or the .py/.ipynb inside a directory.

    In a directory, ``{name}.py`` / ``{name}.ipynb`` win; otherwise there must be exactly one
    .py or .ipynb file (as in a Gradescope submission folder).
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise SubmissionError(f"submission {path!r} not found")
    if name:
        for ext in (".py", ".ipynb"):
            candidate = os.path.join(path, name + ext)
            if os.path.isfile(candidate):
                return candidate
    found = sorted(f for f in os.listdir(path)
                   if f.endswith((".py", ".ipynb")) and os.path.isfile(os.path.join(path, f)))
    if len(found) == 1:
        return os.path.join(path, found[0])
    if not found:
        raise SubmissionError(f"no .py or .ipynb file in {path!r}")
    raise SubmissionError(f"several candidate files in {path!r} ({', '.join(found)}); expected one"
                          + (f", or one named {name}.py / {name}.ipynb" if name else ""))


def read_submission(path):
    """The chunks of code to run for the file at ``path`` (a .py file or a notebook)."""
    path = os.fspath(path)
    base = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8 << 20)
    except OSError as exc:
        raise SubmissionError(f"cannot read {path!r}: {exc.strerror}") from None
    text = raw.decode("utf-8", errors="replace")
    if path.endswith(".ipynb"):
        return notebook_to_chunks(text, base)
    if path.endswith(".py"):
        return [{"filename": base, "source": text, "continue_on_error": False}]
    raise SubmissionError(f"{base}: expected a .py file or a .ipynb notebook")


def _clean_cell(source):
    """The cell's code with shell/magic lines made ``pass`` (None for a cell magic)."""
    lines = source.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("%%"):
        return None
    out = []
    for line in lines:
        m = _MAGIC.match(line)
        out.append(f"{m.group(1)}pass  # IPython line dropped" if m else line)
    return "\n".join(out) + "\n"


def notebook_to_chunks(text, name="notebook.ipynb"):
    """The code cells of a notebook (JSON text) as chunks, one per cell."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"{name}: not a valid notebook (JSON error: {exc.msg} at line "
                              f"{exc.lineno})") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        # nbformat 3 kept cells under worksheets
        sheets = nb.get("worksheets") if isinstance(nb, dict) else None
        cells = [c for ws in sheets or [] for c in ws.get("cells", [])] if isinstance(sheets, list) else None
    if cells is None:
        raise SubmissionError(f"{name}: not a notebook (no cells)")
    chunks = []
    for k, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", cell.get("input", ""))
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str):
            continue
        code = _clean_cell(src)
        if code is None or not code.strip():
            continue
        chunks.append({"filename": f"{name} [cell {k}]", "source": code, "continue_on_error": True})
    if not chunks:
        raise SubmissionError(f"{name}: the notebook has no code cells")
    return chunks


def make_notebook(cells):
    """An nbformat-4 notebook (a dict) from ``(cell_type, source, nbgrader_or_None)`` triples.

    ``nbgrader`` metadata (``{"grade_id": ..., "solution": True, ...}``) marks the cells
    students answer in, as nbgrader's assignment notebooks do.
    """
    nb_cells = []
    for k, (cell_type, source, nbgrader) in enumerate(cells, start=1):
        lines = source.splitlines(True)
        cell = {"cell_type": cell_type, "id": f"cell-{k}", "metadata": {}, "source": lines}
        if nbgrader:
            cell["metadata"]["nbgrader"] = dict(nbgrader, schema_version=3)
        if cell_type == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
        nb_cells.append(cell)
    return {"cells": nb_cells,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}
