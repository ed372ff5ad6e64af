"""numpytfmr/__init__.py: every name of docs/contract.md resolves as ``numpytfmr.NAME``, the
machinery's names load when first used, and ``import numpytfmr`` stays light.

The names are read from the contract's Markdown tables, so a name added to the page is
checked without touching this file. A table's columns are either names or prose; each
column heading of the page is sorted into one of the two sets below, and a heading in
neither fails, so a new table cannot slip past unread.
"""
import json
import pathlib
import re
import subprocess
import sys

import pytest

import numpytfmr

REPO = pathlib.Path(__file__).resolve().parents[1]
CONTRACT = REPO / "docs" / "contract.md"

# Columns whose code spans start with a Python name: the name (or forward) of each row.
NAME_COLUMNS = {"name", "forward"}
# The validators' table: names of numpytfmr.contract (the page says so above the table).
CONTRACT_LAYER_COLUMNS = {"validator"}
# Columns of prose, formulas, shapes or shell commands: no Python name to resolve.
OTHER_COLUMNS = {"op", "contract", "notes", "backward returns", "spec", "meaning", "part",
                 "forms", "accepts", "command", "what it does"}
_LEADING_NAME = re.compile(r"@?([A-Za-z_]\w*)")


def _cells(line):
    """The cells of a Markdown table row; a ``|`` inside a code span is text, not a border."""
    cells, cell, in_code = [], [], False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(ch)
    cells.append("".join(cell).strip())
    return cells


def contract_tables(text):
    """Each Markdown table of ``text``: (its column headings, its rows of cells)."""
    tables, lines = [], text.splitlines()
    for i in range(len(lines) - 1):
        starts = lines[i].startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
        if starts and re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", lines[i + 1].strip()):
            header = [h.lower() for h in _cells(lines[i])]
            rows = []
            for line in lines[i + 2:]:
                if not line.startswith("|"):
                    break
                rows.append(_cells(line))
            tables.append((header, rows))
    return tables


def _code_spans(cell):
    return re.findall(r"`([^`]+)`", cell)


def contract_names(text):
    """``(top-level names, numpytfmr.contract names)`` of the contract's tables.

    A "name" cell contributes every code span's leading name (``alibi_slopes(...)``,
    ``alibi_bias(...)``); a "forward" cell its first code span's (the rest are formulas), and,
    where the table has a "backward returns" column, the matching ``_backward``."""
    top, layer = set(), set()
    for header, rows in contract_tables(text):
        unknown = set(header) - NAME_COLUMNS - CONTRACT_LAYER_COLUMNS - OTHER_COLUMNS
        assert not unknown, (f"docs/contract.md has a table column {sorted(unknown)} that "
                             f"tests/test_package.py does not know: add it to NAME_COLUMNS "
                             f"or OTHER_COLUMNS")
        for row in rows:
            for heading, cell in zip(header, row):
                spans = _code_spans(cell)
                if heading == "forward":
                    spans = spans[:1]
                if heading in NAME_COLUMNS | CONTRACT_LAYER_COLUMNS:
                    assert spans, f"docs/contract.md: a {heading!r} cell names nothing: {cell!r}"
                    names = {_LEADING_NAME.match(s).group(1) for s in spans}
                    (layer if heading in CONTRACT_LAYER_COLUMNS else top).update(names)
                    if heading == "forward" and "backward returns" in header:
                        top.update(n[:-len("_forward")] + "_backward" for n in names)
    return top, layer


TOP, LAYER = contract_names(CONTRACT.read_text(encoding="utf-8"))


def test_the_contract_tables_are_read():
    """The parser sees every kind of table: the gradient checker, the core ops and their
    backwards, positional encodings, the other fixed names and the validators."""
    for name in ("check_gradients", "rel_error", "linear_forward", "linear_backward",
                 "mha_forward", "dpo_loss_backward", "alibi_bias", "rope_backward",
                 "flash_attention_backward", "gpt_from_hf", "load_hf_checkpoint", "matmul_cost"):
        assert name in TOP, name
    assert {"positive", "one_of", "axis_of"} <= LAYER
    # a formula in a forward cell is not a name, nor is a word of prose
    assert not TOP & {"softmax", "max", "act", "x", "RRF"}


def test_cells_keep_a_bar_inside_code():
    assert _cells("| `rel_error(a, b)` | `max(|a - b|)` over |") == \
        ["`rel_error(a, b)`", "`max(|a - b|)` over"]
    tables = contract_tables("text\n| name | contract |\n| --- | --- |\n| `f(x)` | y |\n\nmore")
    assert tables == [(["name", "contract"], [["`f(x)`", "y"]])]


def test_an_unknown_column_is_refused():
    with pytest.raises(AssertionError, match="does not know"):
        contract_names("| symbol | meaning |\n| --- | --- |\n| `f` | g |\n")


@pytest.mark.parametrize("name", sorted(TOP))
def test_every_contract_name_resolves_at_the_top(name):
    value = getattr(numpytfmr, name)            # AttributeError names the missing one
    assert callable(value) or isinstance(value, type), (name, value)
    assert name in dir(numpytfmr), f"dir(numpytfmr) does not list {name}"
    namespace = {}
    exec(f"from numpytfmr import {name}", namespace)
    assert namespace[name] is value


@pytest.mark.parametrize("name", sorted(LAYER))
def test_every_validator_of_the_contract_layer_resolves(name):
    from numpytfmr import contract
    assert callable(getattr(contract, name)), name


def test_machinery_names_of_the_contract_are_the_machinery_s_own():
    from numpytfmr.run import hf
    assert numpytfmr.gpt_from_hf is hf.gpt_from_hf
    assert numpytfmr.load_hf_checkpoint is hf.load_hf_checkpoint
    assert set(numpytfmr._ENTRY_POINTS) <= set(dir(numpytfmr))


def test_import_is_light_and_the_machinery_loads_on_first_use():
    """A fresh interpreter: ``import numpytfmr`` and ``dir(numpytfmr)`` load no machinery;
    ``numpytfmr.gpt_from_hf`` loads numpytfmr.run.hf, and only then."""
    script = ("import json, sys, numpytfmr\n"
              "names = dir(numpytfmr)\n"
              "before = sorted(m for m in sys.modules if m.startswith('numpytfmr.'))\n"
              "numpytfmr.gpt_from_hf\n"
              "after = sorted(m for m in sys.modules if m.startswith('numpytfmr.'))\n"
              "print(json.dumps([before, after, 'gpt_from_hf' in names]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, check=True)
    before, after, listed = json.loads(proc.stdout.splitlines()[-1])
    machinery = ("numpytfmr.run", "numpytfmr.grading", "numpytfmr.site", "numpytfmr.fast",
                 "numpytfmr.registry")
    assert not [m for m in before if m.startswith(machinery)], before
    assert "numpytfmr.run.hf" in after and listed


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        numpytfmr.no_such_name
    assert not hasattr(numpytfmr, "gpt_from_hugging_face")
