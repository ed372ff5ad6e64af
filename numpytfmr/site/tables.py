"""The data files the reader and the tests read: ``docs/errata.toml`` (where the notes are
wrong) and ``docs/modules.toml`` (the topic modules, what each holds, where the notes
treat it), and their Markdown tables in ``docs/errata.md`` and ``docs/reading.md``.

``python -m numpytfmr.site.tables [CHECKOUT]`` rewrites the two tables from the data;
``tests/test_errata.py`` fails when they differ.
"""
import pathlib
import sys

try:
    import tomllib
except ModuleNotFoundError:                     # Python 3.10: the docs and test extras bring tomli
    import tomli as tomllib

__all__ = ["load_errata", "load_modules", "errata_markdown", "modules_markdown", "write_tables"]

ERRATA_FIELDS = ("note", "section", "where", "says", "correct", "test")
MODULE_FIELDS = ("files", "what", "notes")
TABLE_START = "<!-- table drawn from docs/{} by python -m numpytfmr.site.tables -->"
TABLE_END = "<!-- end of table -->"


def _load(path, key, fields):
    with open(path, "rb") as f:
        rows = tomllib.load(f).get(key, [])
    for i, row in enumerate(rows, 1):
        missing = [k for k in fields if k not in row]
        if missing:
            raise ValueError(f"{path}: [[{key}]] number {i} lacks {', '.join(missing)}")
    return rows


def load_errata(root):
    """The errata of ``root/docs/errata.toml``: a list of dicts with ``note``, ``section``,
    ``where``, ``says``, ``correct`` and ``test`` (``tests/test_X.py::test_name``)."""
    return _load(pathlib.Path(root) / "docs" / "errata.toml", "erratum", ERRATA_FIELDS)


def load_modules(root):
    """The topic modules of ``root/docs/modules.toml`` in reading order: dicts with
    ``files`` (module names without ``.py``), ``what`` and ``notes``."""
    return _load(pathlib.Path(root) / "docs" / "modules.toml", "module", MODULE_FIELDS)


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def errata_markdown(errata):
    rows = ["| where | the notes say | correct | test |", "| --- | --- | --- | --- |"]
    rows += [f"| {_cell(e['where'])} | {_cell(e['says'])} | {_cell(e['correct'])} | `{e['test']}` |"
             for e in errata]
    return "\n".join(rows)


def modules_markdown(modules):
    rows = ["| module | what | notes |", "| --- | --- | --- |"]
    rows += [f"| {', '.join(f'`{m}.py`' for m in e['files'])} | {_cell(e['what'])} | "
             f"{_cell(e['notes']) or '—'} |" for e in modules]
    return "\n".join(rows)


def _with_table(text, name, table):
    start, end = TABLE_START.format(name), TABLE_END
    if start not in text:
        raise ValueError(f"no line {start!r} to put the table after")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{table}\n{end}{tail}"


def write_tables(root, check=False):
    """Redraw the tables of ``docs/errata.md`` and ``docs/reading.md`` from the data. With
    ``check``, write nothing and return the files whose table differs."""
    root = pathlib.Path(root)
    stale = []
    for md, name, table in (("errata.md", "errata.toml", errata_markdown(load_errata(root))),
                            ("reading.md", "modules.toml", modules_markdown(load_modules(root)))):
        path = root / "docs" / md
        text = path.read_text(encoding="utf-8")
        new = _with_table(text, name, table)
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    for p in write_tables(root):
        print(f"rewrote the table of {p}")
