"""What the reader shows, gathered from the code and the checkout (docs/reader.md): the topic
modules and their ops, docs/modules.toml and docs/errata.toml, the tests (parsed, not
imported), the notebooks, and the notes' section references (``004 eq. 27``) everywhere.
Nothing here writes a file; :mod:`numpytfmr.site.build` turns a :class:`Model` into pages.
"""
import ast
import importlib
import inspect
import json
import pathlib
import re
import sys
import types
from collections import Counter
from dataclasses import dataclass, field

from .tables import load_errata, load_modules

__all__ = ["Ref", "parse_refs", "Entry", "Topic", "TestRef", "Notebook", "Erratum", "Model",
           "collect", "find_source_tree", "NOTES"]

# The notes, in order: number -> title (the notes themselves are not distributed).
NOTES = {
    "000": "Natural Language Processing: Understanding Language Models (Aug 2025 edition)",
    "001": "Deep Learning System Design",
    "002": "Lecture 7-1: Attention (slides)",
    "003": "Natural Language Processing: Understanding Language Models (Oct 2025 edition)",
    "004": "GEN-AI course notes: Transformers",
}


# ---------------------------------------------------------------------------------------
# Section references
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ref:
    """One reference into the notes: ``note`` ("004"), ``label`` ("eq. 27-28", "§5.1.1",
    "'Future masking'", or "" for the note as a whole) and a sort ``key``."""
    note: str
    label: str
    key: tuple

    def __str__(self):
        return f"{self.note} {self.label}".strip()


_NUM = r"\d+(?:\.\d+)*"
_PART = (rf"(?:§\s*{_NUM}(?:\s*[-–]\s*{_NUM})?|eqs?\.\s*{_NUM}(?:\s*[-–]\s*{_NUM})?"
         rf"|ch\.\s*\d+(?:\s*[-–]\s*\d+)?|Figure\s+\d+|'[^'\n]+'|\"[^\"\n]+\")")
_REF = re.compile(rf"(?<![\w.])(00[0-4])(?![\w.])((?:\s*,?\s*{_PART}(?!\s*00[0-4]))*)")
_PARTS = re.compile(_PART)


def _key(label):
    m = re.search(_NUM, label)
    if label.startswith(("'", '"')) or not m:
        return (10 ** 6,)
    return tuple(int(x) for x in m.group().split("."))


def parse_refs(text):
    """The notes' references in ``text``, in order of appearance.

    ``"(003 §5.1.1-5.1.2, 000 §2.1, 002, 004 eq. 8)"`` -> 003 §5.1.1-5.1.2, 000 §2.1, 002,
    004 eq. 8; a list after one note number (``003 eq. 2.2, §3.7``) belongs to that note.
    """
    out = []
    for m in _REF.finditer(text or ""):
        note = m.group(1)
        parts = [re.sub(r"\s+", " ", p.group()).replace("§ ", "§") for p in _PARTS.finditer(m.group(2))]
        parts = ['"' + p[1:-1] + '"' if p.startswith("'") else p for p in parts]
        if not parts:
            out.append(Ref(note, "", (10 ** 6 + 1,)))
        for p in parts:
            out.append(Ref(note, p, _key(p)))
    return out


# ---------------------------------------------------------------------------------------
# The code
# ---------------------------------------------------------------------------------------

@dataclass
class Entry:
    """A public function of a topic module, or a forward/backward pair (one entry).

    ``name``: what the reader calls it (``layernorm`` for a pair, else the function's name);
    ``anchor``: the id of its entry (the forward's name for a pair); ``kind``: "op" (a
    registered op), "pair", "function" or "class"; ``functions``: the forward and backward
    (a pair) or the one object.
    """
    name: str
    anchor: str
    module: str
    kind: str
    functions: list
    spec: object = None
    refs: list = field(default_factory=list)
    section: str = ""

    @property
    def names(self):
        return [f.__name__ for f in self.functions]


@dataclass
class Topic:
    """A topic module: its entries in source order, its constants, and its words in docs/modules.toml."""
    module: str
    doc: str
    what: str
    entries: list
    constants: list
    refs: list


@dataclass
class TestRef:
    file: str          # "test_norms.py"
    name: str          # "test_layernorm_constant_row_is_finite" (Class.test for methods)
    line: int
    names: set
    every_op: bool = False

    @property
    def label(self):
        return f"{self.file}::{self.name.replace('.', '::')}"


@dataclass
class Notebook:
    stem: str          # "01_attention"
    title: str
    cells: list        # [(kind, source)]
    names: list        # per cell: set of identifiers (code cells)
    refs: list
    outputs: list = None   # per cell: nbformat outputs after running it; None: not run
    error: str = ""        # why it could not be run


@dataclass
class Erratum:
    where: str
    says: str
    correct: str
    test: str          # "tests/test_attention.py::test_..."
    refs: list
    module: str = ""
    index: int = 0

    @property
    def test_file(self):
        return self.test.split("::")[0].split("/")[-1]

    @property
    def test_name(self):
        return self.test.split("::")[-1] if "::" in self.test else ""


@dataclass
class Model:
    topics: list
    public: list               # [(name, object, module name)] of ``dir(numpytfmr)``
    tests: list
    test_sources: dict         # file -> source text
    notebooks: list
    errata: list
    contract_md: str


NOT_TOPICS = {"__init__", "__main__"}


def topic_module_names(package_dir):
    return sorted(p.stem for p in pathlib.Path(package_dir).glob("*.py")
                  if p.stem not in NOT_TOPICS and not p.stem.startswith("_"))


def _line(obj):
    try:
        return inspect.getsourcelines(inspect.unwrap(obj))[1]
    except (OSError, TypeError):
        return 10 ** 9


def _defined_here(obj, modname):
    return (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == modname


def _entries(module, specs_by_forward):
    modname = module.__name__
    objs = {n: o for n, o in vars(module).items()
            if not n.startswith("_") and _defined_here(o, modname)}
    short = modname.rsplit(".", 1)[-1]
    out, used = [], set()
    for name, obj in sorted(objs.items(), key=lambda kv: _line(kv[1])):
        if name in used:
            continue
        if name.endswith("_forward") and name[:-8] + "_backward" in objs:
            base = name[:-8]
            back = objs[base + "_backward"]
            used.update((name, base + "_backward"))
            spec = specs_by_forward.get(id(obj))
            entry = Entry(base, name, short, "op" if spec is not None else "pair", [obj, back], spec)
        else:
            used.add(name)
            entry = Entry(name, name, short, "class" if inspect.isclass(obj) else "function", [obj])
        doc = inspect.getdoc(obj) or ""
        summary = doc.split("\n\n")[0]
        entry.section = entry.spec.section if entry.spec is not None else \
            ", ".join(dict.fromkeys(str(r) for r in parse_refs(summary)))
        entry.refs = parse_refs(entry.section) or parse_refs(summary) or parse_refs(doc)
        out.append(entry)
    return out


def _constants(module):
    objs = ((n, getattr(module, n, None)) for n in getattr(module, "__all__", []))
    return [(n, o) for n, o in objs if o is not None and not inspect.isfunction(o)
            and not inspect.isclass(o) and not isinstance(o, types.ModuleType)]


# ---------------------------------------------------------------------------------------
# The checkout: README, tests, notebooks
# ---------------------------------------------------------------------------------------

def find_source_tree(explicit=None):
    """The checkout that holds README.md, docs/, notebooks/ and tests/: ``explicit``, else
    the folder above the package, else the current directory; None when none has them."""
    import numpytfmr
    if explicit:
        return pathlib.Path(explicit) if (pathlib.Path(explicit) / "README.md").is_file() else None
    for c in (pathlib.Path(numpytfmr.__file__).resolve().parents[1], pathlib.Path.cwd()):
        if (c / "README.md").is_file() and ((c / "tests").is_dir() or (c / "notebooks").is_dir()):
            return c
    return None


def module_table(root):
    """``docs/modules.toml``: module -> (what, notes), in reading order."""
    out = {}
    if root is None or not (pathlib.Path(root) / "docs" / "modules.toml").is_file():
        return out
    for row in load_modules(root):
        for mod in row["files"]:
            out[mod] = (row["what"], row["notes"])
    return out


def errata_table(root):
    """``docs/errata.toml`` as :class:`Erratum` objects, numbered from 1."""
    if root is None or not (pathlib.Path(root) / "docs" / "errata.toml").is_file():
        return []
    return [Erratum(e["where"], e["says"], e["correct"], e["test"], parse_refs(e["where"]), index=i)
            for i, e in enumerate(load_errata(root), 1)]


def _names_in(node):
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and \
                re.fullmatch(r"[A-Za-z_]\w{1,60}", n.value):
            names.add(n.value)
    return names


def index_tests(tests_dir):
    """Every test function of ``tests_dir``: the names it uses (module-level lists named in
    its decorators are expanded), and whether it is parametrised over every registered op."""
    tests, sources = [], {}
    for path in sorted(pathlib.Path(tests_dir).glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        sources[path.name] = text
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        module_level = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and node.value is not None:
                        module_level[t.id] = _names_in(node.value)

        def add(fn, prefix=""):
            deco = set().union(*(_names_in(d) for d in fn.decorator_list))
            lists = [module_level.get(n, set()) for n in deco]
            every = bool({"OPS", "registry"} & deco) or any("registry" in u for u in lists)
            tests.append(TestRef(path.name, prefix + fn.name, fn.lineno,
                                 _names_in(fn).union(*lists), every))

        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                add(node)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                        add(sub, node.name + ".")
    return tests, sources


_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def read_notebooks(nb_dir, execute=False):
    """The notebooks of ``nb_dir``; with ``execute``, each run (see :mod:`.execute`)."""
    out = []
    for path in sorted(pathlib.Path(nb_dir).glob("*.ipynb")):
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        cells, names, refs = [], [], []
        title = path.stem
        for c in nb.get("cells", []):
            src = c.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            kind = c.get("cell_type", "code")
            cells.append((kind, src))
            names.append(set(_IDENT.findall(src)) if kind == "code" else set())
            if kind == "markdown":
                refs += parse_refs(src)
                if title == path.stem:
                    m = re.search(r"^#\s+(.+)$", src, re.M)
                    if m:
                        title = m.group(1).strip()
        out.append(Notebook(path.stem, title, cells, names, refs))
    if execute:
        from .execute import notebook_outputs, package_fingerprint
        package_hash = package_fingerprint()
        for nb, path in zip(out, sorted(pathlib.Path(nb_dir).glob("*.ipynb"))):
            try:
                nb.outputs = notebook_outputs(path, package_hash=package_hash)
            except Exception as exc:       # nbclient's errors, a dead kernel: shown on the page
                nb.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    return out


# ---------------------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------------------

def collect(source=None, execute=False):
    """Gather the :class:`Model` of the site (``source``: the checkout, or None to look;
    ``execute``: run the notebooks for their outputs)."""
    import numpytfmr
    from numpytfmr.registry import registry

    specs_by_forward = {id(s.forward): s for s in registry().values()}
    package_dir = pathlib.Path(numpytfmr.__file__).parent
    root = find_source_tree(source)
    contract_path = (root / "docs" / "contract.md") if root else None
    contract_md = contract_path.read_text(encoding="utf-8") if contract_path and contract_path.is_file() else ""
    table = module_table(root)
    order = list(dict.fromkeys(list(table) + topic_module_names(package_dir)))
    order = [m for m in order if (package_dir / f"{m}.py").is_file()]
    topics = []
    for name in order:
        module = importlib.import_module(f"numpytfmr.{name}")
        entries = _entries(module, specs_by_forward)
        what, notes = table.get(name, ("", ""))
        doc = inspect.getdoc(module) or ""
        refs = parse_refs(notes) + parse_refs(doc)
        for e in entries:
            refs += e.refs
        topics.append(Topic(name, doc, what, entries, _constants(module), refs))
    owner = {}
    for t in topics:
        for e in t.entries:
            for n in e.names:
                owner.setdefault(n, t.module)
    public = []
    for n in sorted(dir(numpytfmr)):
        obj = getattr(numpytfmr, n, None)          # an entry point whose module lacks it: None
        if n.startswith("_") or obj is None or isinstance(obj, types.ModuleType):
            continue
        mod = getattr(obj, "__module__", None) if (inspect.isfunction(obj) or inspect.isclass(obj)) else None
        if mod is None:                          # a constant: the module whose __all__ names it
            mod = next((name for name, m in sorted(sys.modules.items())
                        if name.startswith("numpytfmr.") and m is not None
                        and n in getattr(m, "__all__", ()) and getattr(m, n, None) is obj), "numpytfmr")
        public.append((n, obj, mod))
    tests, test_sources = index_tests(root / "tests") if root and (root / "tests").is_dir() else ([], {})
    notebooks = read_notebooks(root / "notebooks", execute) if root and (root / "notebooks").is_dir() else []
    errata = errata_table(root)
    by_test = {(t.file, t.name): t for t in tests}
    for er in errata:
        t = by_test.get((er.test_file, er.test_name))
        if t is not None:
            counts = Counter(owner[n] for n in t.names if n in owner)
            stem = er.test_file[len("test_"):-len(".py")] if er.test_file.startswith("test_") else ""
            if stem in counts:                 # test_positional.py -> positional
                er.module = stem
            elif counts:
                er.module = counts.most_common(1)[0][0]
    return Model(topics, public, tests, test_sources, notebooks, errata, contract_md)
