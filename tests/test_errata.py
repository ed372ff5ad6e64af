"""The errata and the module table are data (docs/errata.toml, docs/modules.toml): every
erratum names a note, a section and a test that exists; the Markdown tables of
docs/errata.md and docs/reading.md are drawn from the data; every topic module is listed."""
import ast
import pathlib
import re

import pytest

import numpytfmr
from numpytfmr.site.collect import NOTES, parse_refs
from numpytfmr.site.tables import load_errata, load_modules, write_tables

REPO = pathlib.Path(__file__).resolve().parents[1]
ERRATA = load_errata(REPO)


def _test_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_there_are_errata_and_each_has_every_field_filled():
    assert len(ERRATA) >= 20
    for e in ERRATA:
        for field in ("note", "section", "where", "says", "correct", "test"):
            assert isinstance(e[field], str) and e[field].strip(), (field, e)


@pytest.mark.parametrize("erratum", ERRATA, ids=[e["test"].split("::")[-1] for e in ERRATA])
def test_erratum_locates_a_note_and_names_an_existing_test(erratum):
    assert erratum["note"] in NOTES
    first = parse_refs(erratum["where"])[0]
    assert (first.note, first.label) == (erratum["note"], erratum["section"])
    path, _, name = erratum["test"].partition("::")
    assert re.fullmatch(r"tests/test_\w+\.py", path) and name.startswith("test_"), erratum["test"]
    assert name in _test_names(REPO / path), f"{erratum['test']} does not exist"


def test_the_errata_are_distinct():
    assert len({e["test"] for e in ERRATA}) == len(ERRATA)
    assert len({e["says"] for e in ERRATA}) == len(ERRATA)


def test_markdown_tables_are_drawn_from_the_data():
    stale = write_tables(REPO, check=True)
    assert not stale, f"run python -m numpytfmr.site.tables to redraw {stale}"


def test_module_table_lists_every_topic_module_once():
    listed = [m for row in load_modules(REPO) for m in row["files"]]
    assert len(listed) == len(set(listed))
    package = pathlib.Path(numpytfmr.__file__).parent
    on_disk = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert set(listed) == on_disk
    for row in load_modules(REPO):
        for ref in parse_refs(row["notes"]):
            assert ref.note in NOTES
