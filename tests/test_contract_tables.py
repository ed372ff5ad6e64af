"""docs/contract.md's tables agree with the registry: every registered op has a row (its
``_forward`` named in a table), every ``_forward``/``_backward`` a table names is a registered
op's, the parameters a row shows are the forward's own in their order, and the "backward
returns" column has one gradient per positional input."""
import inspect
import pathlib
import re

import pytest

import numpytfmr
from numpytfmr.registry import input_names, registry

CONTRACT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "contract.md"
_CALL = re.compile(r"^(\w+_(?:forward|backward))\((.*)\)")


def _rows():
    """The table rows of docs/contract.md (header and rule rows left out), as lists of cells."""
    rows, header = [], None
    for line in CONTRACT.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def _calls(rows):
    """(name, the parameters shown, row) for each op function a code span of a row calls."""
    out = []
    for row in rows:
        for cell in row.values():
            for span in re.findall(r"`([^`]+)`", cell):
                m = _CALL.match(span.split(" -> ")[0].strip())
                if m:
                    shown = [a.split("=")[0].strip() for a in m.group(2).split(",")]
                    out.append((m.group(1), [a for a in shown if a and a != "*"], row))
    return out


ROWS = _rows()
CALLS = _calls(ROWS)
NAMED = {name for name, _, _ in CALLS}


def test_the_tables_are_read():
    assert len(ROWS) > 40 and "attention_forward" in NAMED and "layernorm_forward" in NAMED


@pytest.mark.parametrize("op", list(registry()))
def test_every_registered_op_has_a_row(op):
    assert f"{op}_forward" in NAMED, f"{op} is registered but no table of docs/contract.md names it"


def test_every_op_a_table_names_is_registered_and_exported():
    ops = registry()
    for name in NAMED:
        base = name.rsplit("_", 1)[0]
        assert base in ops, f"docs/contract.md names {name}, but {base!r} is not a registered op"
        assert getattr(numpytfmr, name) is getattr(ops[base], name.rsplit("_", 1)[1])


@pytest.mark.parametrize("name, shown", [(n, s) for n, s, _ in CALLS if n.endswith("_forward")])
def test_a_row_shows_the_forward_parameters_in_their_order(name, shown):
    params = list(inspect.signature(getattr(numpytfmr, name)).parameters)
    assert set(shown) <= set(params), f"{name}: the table shows {shown}, the function has {params}"
    assert [p for p in params if p in shown] == shown


def _returned(cell):
    text = cell.strip("`")
    return [g.strip() for g in text.strip("()").split(",")] if text.startswith("(") else [text]


def test_the_backward_column_has_one_gradient_per_positional_input():
    ops = registry()
    checked = 0
    for name, _, row in CALLS:
        if "backward returns" not in row or not name.endswith("_forward"):
            continue
        spec = ops[name[:-len("_forward")]]
        returned = _returned(row["backward returns"].split(";")[0].strip())
        assert len(returned) == len(input_names(spec.forward)), (name, returned)
        checked += 1
    assert checked >= len(ops) - 3      # rope, flash_attention: rows of their own form
