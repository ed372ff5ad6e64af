"""The package's architecture, checked: what may import what, and how the reference reads.

- (a) no module reaches into another module's private ``_x`` names;
- (b) the topic modules (every ``numpytfmr/*.py`` but ``__init__`` and ``__main__``) do not
  import the machinery (``run/``, ``grading/``, ``fast/``, ``registry/``, ``shared/``);
- (c) ``numpytfmr.fast`` imports, and the reference GPT does not use it;
- (d) every registered forward carries a contract, and its backward refuses a cache that
  is not its own forward's;
- (e) no public forward body is longer than 45 code lines, counted as
  ``.ci/reading_figures.py`` counts them (the figures the README reports).

The source checks parse the files with ``ast`` and do not import the package, so they
report even when an import is broken.
"""
import ast
import importlib
import importlib.util
import inspect
import pathlib
import sys
import types

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "numpytfmr"
PKG_DIR = pathlib.Path(importlib.util.find_spec(PACKAGE).submodule_search_locations[0])
MACHINERY = ("run", "grading", "fast", "registry", "shared")
NOT_TOPICS = {"__init__.py", "__main__.py"}
MAX_FORWARD_LINES = 45


def _load_figures():
    path = REPO / ".ci" / "reading_figures.py"
    spec = importlib.util.spec_from_file_location("reading_figures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _load_figures()

TOPICS = sorted(p.name for p in PKG_DIR.glob("*.py") if p.name not in NOT_TOPICS)
ALL_MODULES = sorted(str(p.relative_to(PKG_DIR)) for p in PKG_DIR.rglob("*.py")
                     if "__pycache__" not in p.parts)


def _parse(relpath):
    path = PKG_DIR / relpath
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _dotted(relpath):
    parts = list(pathlib.PurePath(relpath).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE] + parts)


def _imported_modules(relpath):
    """(line, absolute module name) for every package module ``relpath`` imports, wherever
    the import sits (function bodies too), ``from . import x`` resolved to ``numpytfmr.x``,
    and ``importlib.import_module("numpytfmr.x")`` / ``__import__`` with a literal name."""
    importer = _dotted(relpath)
    is_package = relpath.endswith("__init__.py")
    out = []
    for node in ast.walk(_parse(relpath)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = figures.source_module(importer, is_package, node)
            if source is None:
                continue
            out.append((node.lineno, source))
            out += [(node.lineno, f"{source}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if called in ("import_module", "__import__"):
                name = node.args[0].value
                if name.startswith(".") and len(node.args) > 1:  # import_module(".x", "numpytfmr")
                    name = "numpytfmr" + name
                out.append((node.lineno, name))
    return [(line, m) for line, m in out if m == PACKAGE or m.startswith(PACKAGE + ".")]


# ---------------------------------------------------------------------------------------
# (a) private names stay private
# ---------------------------------------------------------------------------------------

def test_no_module_imports_another_modules_private_names():
    found = [p for p in figures.private_imports(str(PKG_DIR)) if p["kind"] == "name"]
    assert not found, "private names imported from another module (make them public names " \
        "of a named module instead):\n" + "\n".join(
            f"  {p['module']} line {p['line']}: from {p['source']} import {', '.join(p['names'])}"
            for p in found)


def _module_aliases(relpath, tree):
    """Local names bound to a package module in ``relpath`` (``from . import attention``,
    ``import numpytfmr.gpt as gpt``, ``import numpytfmr``) -> that module's dotted name."""
    importer = _dotted(relpath)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else PACKAGE
        elif isinstance(node, ast.ImportFrom):
            source = figures.source_module(importer, relpath.endswith("__init__.py"), node)
            for a in node.names:
                if source and figures.module_path(str(PKG_DIR), f"{source}.{a.name}"):
                    aliases[a.asname or a.name] = f"{source}.{a.name}"
    return aliases


def test_no_module_reaches_private_names_through_another_module():
    """``attention._T`` after ``from . import attention`` is the same breach as ``from
    .attention import _T``."""
    found = []
    for relpath in ALL_MODULES:
        tree = _parse(relpath)
        me = _dotted(relpath)
        aliases = _module_aliases(relpath, tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and figures.is_private(node.attr)):
                continue
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                owner = ".".join([aliases[base.id]] + chain)
                if owner != me:
                    found.append(f"  {me} line {node.lineno}: {owner}.{node.attr}")
    assert not found, "private names used through another module:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------
# (b) topics do not depend on the machinery
# ---------------------------------------------------------------------------------------

def test_topic_modules_are_listed():
    # the reference is here: a guard against globbing the wrong directory
    for name in ("linear.py", "norms.py", "attention.py", "gpt.py", "contract.py"):
        assert name in TOPICS, f"{name} not found among the topic modules in {PKG_DIR}"


@pytest.mark.parametrize("module", TOPICS)
def test_topic_module_does_not_import_machinery(module):
    banned = tuple(f"{PACKAGE}.{m}" for m in MACHINERY)
    found = [(line, m) for line, m in _imported_modules(module)
             if any(m == b or m.startswith(b + ".") for b in banned)]
    assert not found, (f"{module} is a topic module (read beside the notes) but imports the "
                       "machinery: " + ", ".join(f"{m} (line {line})" for line, m in found)
                       + "; topic modules may import only other topic modules")


# ---------------------------------------------------------------------------------------
# (c) the fast path exists and the reference does not use it
# ---------------------------------------------------------------------------------------

def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def test_fast_imports_and_reference_gpt_does_not_use_it():
    assert (PKG_DIR / "fast").is_dir(), "numpytfmr/fast/ is missing"
    importlib.import_module(f"{PACKAGE}.fast")
    import numpytfmr

    fn = inspect.unwrap(numpytfmr.gpt_forward)
    tree = ast.parse(_dedent(inspect.getsource(fn)))
    mentions = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "fast":
            mentions.append(f"name 'fast' (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr == "fast":
            mentions.append(f"attribute '.fast' (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and ("fast" in (node.module or "").split(".")
                                                  or any(a.name == "fast" for a in node.names)):
            mentions.append(f"an import from fast (line {node.lineno})")
        elif isinstance(node, ast.Import) and any("fast" in a.name.split(".") for a in node.names):
            mentions.append(f"an import of fast (line {node.lineno})")
    assert not mentions, "the reference gpt_forward refers to the fast path: " + ", ".join(mentions)

    # and no global it calls is a fast kernel under a reference name
    used = set()
    for code in _code_objects(fn.__code__):
        used.update(code.co_names)
    from_fast = sorted(n for n in used if n in fn.__globals__ and
                       str(getattr(fn.__globals__[n], "__module__", "")).startswith(f"{PACKAGE}.fast"))
    assert not from_fast, f"gpt_forward calls fast kernels: {from_fast}"


def _dedent(source):
    lines = source.splitlines()
    indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
    return "\n".join(l[indent:] for l in lines)


# ---------------------------------------------------------------------------------------
# (d) every registered op goes through the contract layer
# ---------------------------------------------------------------------------------------

def _ops():
    from numpytfmr.registry import registry
    return registry() if callable(registry) else registry


def _registered():
    try:
        return list(_ops())
    except Exception:  # a broken import fails the tests below instead of the collection
        return ["<registry could not be loaded>"]


OPS = _registered()


def _first_case(spec):
    from numpytfmr.registry import bind
    cases = spec.make_cases(np.random.default_rng(0), np.float64)
    case = next((c for c in cases if c.check), cases[0])
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    dout = tuple(np.ones_like(o) for o in out) if isinstance(out, tuple) else np.ones_like(np.asarray(out))
    return dout, cache


@pytest.mark.parametrize("name", OPS)
def test_registered_forward_carries_a_contract(name):
    import numpytfmr
    spec = _ops()[name]
    assert hasattr(spec.forward, "__contract__"), \
        f"{name}_forward has no contract (declare it with @op(...) from numpytfmr.contract)"
    assert getattr(numpytfmr, f"{name}_forward", None) is spec.forward, \
        f"the registry's {name}_forward is not numpytfmr.{name}_forward"
    assert getattr(numpytfmr, f"{name}_backward", None) is spec.backward, \
        f"the registry's {name}_backward is not numpytfmr.{name}_backward"


@pytest.mark.parametrize("name", OPS)
def test_registered_backward_checks_its_cache(name):
    ops = _ops()
    spec = ops[name]
    dout, cache = _first_case(spec)
    spec.backward(dout, cache)  # its own forward's cache is accepted

    with pytest.raises(TypeError, match="cache"):
        spec.backward(dout, {})
    with pytest.raises(TypeError, match="cache"):
        spec.backward(dout, dict(cache))  # the right contents, but not tagged by the forward

    names = list(ops)
    other = ops[names[(names.index(name) + 1) % len(names)]]
    _, foreign = _first_case(other)
    with pytest.raises(TypeError, match="cache"):
        spec.backward(dout, foreign)  # another op's cache


# ---------------------------------------------------------------------------------------
# (e) forwards stay short enough to read beside the notes
# ---------------------------------------------------------------------------------------

def test_longest_forward_body_is_at_most_45_code_lines():
    ops = figures.measure_ops(str(PKG_DIR))
    forwards = [o for o in ops if o["kind"] == "forward"]
    assert len(forwards) >= 10, f"only {len(forwards)} forwards found in {PKG_DIR}"
    long = sorted((o for o in forwards if o["lines"] > MAX_FORWARD_LINES), key=lambda o: -o["lines"])
    assert not long, f"forward bodies over {MAX_FORWARD_LINES} code lines: " + ", ".join(
        f"{o['op']} ({o['lines']})" for o in long)


def test_line_counting_counts_code_only():
    """The counter the figures rely on: docstring, comments and blank lines are not code."""
    source = '''
@decorator("x: (..., d)")
def demo_forward(x):
    """Docstring,
    two lines."""
    # a comment
    y = x + 1   # an end-of-line comment

    z = f(y,
          "# not a comment")
    raise ValueError("x")
    return z, {}
'''
    func = ast.parse(source).body[0]
    lines = figures.body_lines(source, func)
    assert [l.strip() for l in lines] == ['y = x + 1   # an end-of-line comment', 'z = f(y,',
                                          '"# not a comment")', 'raise ValueError("x")',
                                          'return z, {}']
    assert [figures.is_plumbing(l) for l in lines] == [False, False, False, True, False]


# ---------------------------------------------------------------------------------------
# (f) ``import numpytfmr`` loads the reference only; the machinery loads when used
# ---------------------------------------------------------------------------------------

def _modules_loaded_by(code):
    """The modules a fresh interpreter has loaded after running ``code``."""
    import json
    import subprocess
    import sys
    script = code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_numpytfmr_loads_the_reference_only():
    loaded = _modules_loaded_by("import numpytfmr")
    ours = {m for m in loaded if m == PACKAGE or m.startswith(PACKAGE + ".")}
    machinery = sorted(m for m in ours if m.split(".")[1:2] and m.split(".")[1] in
                       ("run", "grading", "site", "fast", "registry"))
    assert not machinery, f"import numpytfmr loaded the machinery: {machinery}"
    topics = {f"{PACKAGE}.{t[:-3]}" for t in TOPICS}
    assert topics <= ours, sorted(topics - ours)
    # only the topic modules and the gradient checker's own checks (checking/)
    assert ours <= topics | {PACKAGE} | {m for m in ours if m.startswith(PACKAGE + ".checking")}
    started_with = _modules_loaded_by("pass")      # what the interpreter's own start-up loads
    third_party = sorted({m.split(".")[0] for m in loaded - started_with}
                         - set(sys.stdlib_module_names) - {PACKAGE, "numpy", "__main__"})
    assert not third_party, f"import numpytfmr loaded {third_party}; the runtime is NumPy only"


def test_entry_points_load_their_module_on_first_use():
    import numpytfmr
    for name, module in numpytfmr._ENTRY_POINTS.items():
        if name == "load_run":                       # defined with the checkpoint format
            continue
        loaded = _modules_loaded_by(f"import numpytfmr; numpytfmr.{name}")
        assert module in loaded, (name, module)
        assert getattr(numpytfmr, name) is getattr(importlib.import_module(module), name)
    assert numpytfmr.fast is importlib.import_module(f"{PACKAGE}.fast")
    with pytest.raises(AttributeError, match="no_such_name"):
        numpytfmr.no_such_name


def test_star_import_gives_the_reference_and_the_checker():
    namespace = {}
    exec(f"from {PACKAGE} import *", namespace)
    for name in ("layernorm_forward", "mha_forward", "check_gradients", "gpt_forward", "adamw_step"):
        assert name in namespace, name
    assert not [n for n in namespace if n in ("train_bpe", "get_batch", "load_run")]


# ---------------------------------------------------------------------------------------
# (g) tests findable from their module: numpytfmr/X.py is tested in tests/test_X.py
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", TOPICS)
def test_every_topic_module_has_its_test_file(module):
    test_file = REPO / "tests" / f"test_{module}"
    assert test_file.is_file(), (f"numpytfmr/{module} is a topic module; its tests belong in "
                                 f"tests/test_{module}")
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    stem = module[:-3]
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    exported = set(getattr(importlib.import_module(f"{PACKAGE}.{stem}"), "__all__", []))
    assert f"{PACKAGE}.{stem}" in imports or names & exported, \
        f"tests/test_{module} imports nothing of numpytfmr/{module}"


# --- no import circles ----------------------------------------------------------------------
# Every ``import`` and ``from ... import`` in every module of the package, at module level or
# inside a function, is an edge from that module to the module it names (``from . import x``
# names the submodule ``x`` when there is one). A circle among them is a failure, listed module
# by module: a function-level import that closes a circle only hides it. The files are parsed
# with ``ast``; nothing is imported.

_PKG_DIR = pathlib.Path(importlib.util.find_spec("numpytfmr").submodule_search_locations[0])


def _modules():
    """``{dotted name: (path, is_package)}`` of every module of the package."""
    out = {}
    for path in _PKG_DIR.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(_PKG_DIR.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _absolute(module, is_package, name, level):
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph():
    """``{module: set of the package's modules it imports}``."""
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(module, is_package, node.module or "", node.level)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        edges.add(sub)
                    elif target in modules:
                        edges.add(target)
        graph[module] = edges - {module}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "numpytfmr.run.tokenizers" in graph["numpytfmr.run.data"]      # module level
    assert "numpytfmr.run.pretrain" in graph["numpytfmr.run.commands.pretrain"]  # in a function
    assert "numpytfmr.gpt" in graph["numpytfmr.run.models"]


def test_cycles_finds_a_circle_and_only_that():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_package():
    found = cycles(import_graph())
    assert not found, "modules that import each other in a circle: " + "; ".join(
        " <-> ".join(c) for c in found)


# --- the grader does not import the command line ----------------------------------------------
# What an instructor audits of the grader is grading/ and what it imports: never run/ (the
# commands, training, data). The helpers both need live in shared/, which imports nothing of
# the package. Read statically, with ``ast``: module-level and function-level imports,
# relative or absolute, and import_module("numpytfmr.run...") calls.

GRADING = sorted(m for m in ALL_MODULES if m.startswith("grading/"))
SHARED = sorted(m for m in ALL_MODULES if m.startswith("shared/"))


def test_the_static_import_reader_sees_a_grading_import_of_shared():
    assert GRADING and SHARED
    assert ("numpytfmr.shared.fileio" in
            {m for _, m in _imported_modules("grading/skeleton.py")})


@pytest.mark.parametrize("module", GRADING)
def test_grading_imports_nothing_from_run(module):
    found = [(line, m) for line, m in _imported_modules(module)
             if m == f"{PACKAGE}.run" or m.startswith(f"{PACKAGE}.run.")]
    assert not found, (f"{module} imports the command line: " + ", ".join(
        f"{m} (line {line})" for line, m in found)
        + "; a helper both need belongs in numpytfmr/shared/")


@pytest.mark.parametrize("module", SHARED)
def test_shared_imports_nothing_of_the_package(module):
    found = [(line, m) for line, m in _imported_modules(module)
             if not m.startswith(f"{PACKAGE}.shared")]
    assert not found, f"{module} imports " + ", ".join(f"{m} (line {line})" for line, m in found)


# --- no loop between folders -----------------------------------------------------------------
# The same edges as above (module-level and function-level imports), read one level up: each
# subpackage is one folder (``checking``, ``registry``, ``run``, ...), and each top-level module
# is a node of its own (``numpytfmr.gradcheck``, ``numpytfmr.norms``, ...). A circle among these
# nodes is a loop between folders even when no two modules import each other: ``gradcheck`` ->
# ``checking/`` -> ``registry/`` -> ``gradcheck`` was one.

def folder_of(module):
    """``numpytfmr.run.commands.lora`` -> ``run``; a top-level module is its own node."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (_PKG_DIR / parts[1]).is_dir()) \
        else module


def folder_graph(graph):
    """``{folder: set of the folders its modules import}`` of a module graph."""
    out = {}
    for module, edges in graph.items():
        mine = folder_of(module)
        out.setdefault(mine, set()).update(folder_of(m) for m in edges)
        out[mine].discard(mine)
    return out


def _folder_loops(graph):
    loops = []
    for component in cycles(folder_graph(graph)):
        inside = set(component)
        edges = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                       if folder_of(a) in inside and folder_of(b) in inside
                       and folder_of(a) != folder_of(b))
        loops.append(f"{' <-> '.join(component)} (through {'; '.join(edges)})")
    return loops


def test_folder_graph_groups_modules_by_folder():
    graph = {"numpytfmr.gradcheck": {"numpytfmr.checking.compare"},
             "numpytfmr.checking.recognise": {"numpytfmr.registry"},
             "numpytfmr.checking.compare": set(),
             "numpytfmr.registry": set(),
             "numpytfmr.registry.check": {"numpytfmr.gradcheck"},
             "numpytfmr.norms": set()}
    assert folder_graph(graph) == {"numpytfmr.gradcheck": {"checking"}, "checking": {"registry"},
                                   "registry": {"numpytfmr.gradcheck"}, "numpytfmr.norms": set()}
    # no two modules import each other, and still the three folders go round
    assert cycles(graph) == []
    assert cycles(folder_graph(graph)) == [["checking", "numpytfmr.gradcheck", "registry"]]
    assert "registry.check -> numpytfmr.gradcheck" in _folder_loops(graph)[0]
    del graph["numpytfmr.registry.check"]
    assert _folder_loops(graph) == []


def test_the_folder_graph_sees_function_level_imports():
    # checking/ looks ops up in the registry inside functions only
    assert "registry" in folder_graph(import_graph())["checking"]


def test_no_loop_between_folders():
    found = _folder_loops(import_graph())
    assert not found, "folders that import each other in a loop: " + "; ".join(found)


# --- commands stand alone ----------------------------------------------------------------------
# Each module of numpytfmr/run/commands/ defines one command (its flags and its run) and takes
# what it shares with other commands from the named modules of helpers in run/ (options.py,
# outputs.py, adapters.py, ...), never from another command: read with ``ast``, module-level
# and function-level imports, relative or absolute, and import_module calls with a literal name.

COMMANDS_PACKAGE = f"{PACKAGE}.run.commands"
COMMAND_MODULES = sorted(m for m in ALL_MODULES if m.startswith("run/commands/")
                         and not m.endswith("__init__.py"))


def commands_imported(relpath, imported=None):
    """The other command modules (``numpytfmr.run.commands.x``) that ``relpath`` imports;
    ``imported``: its ``(line, module)`` list (default: read from the file)."""
    me = _dotted(relpath)
    found = set()
    for line, m in (_imported_modules(relpath) if imported is None else imported):
        if m.startswith(COMMANDS_PACKAGE + "."):
            command = ".".join(m.split(".")[:4])        # numpytfmr.run.commands.<module>
            if command != me and figures.module_path(str(PKG_DIR), command):
                found.add((line, command))
    return sorted(found)


def test_the_command_reader_sees_an_import_of_another_command():
    assert len(COMMAND_MODULES) >= 10 and "run/commands/lora.py" in COMMAND_MODULES
    me = "run/commands/dpo.py"
    imports = lambda source: [  # noqa: E731
        (line, m) for line, m in _imports_of_source(me, source)]
    assert commands_imported(me, imports("from numpytfmr.run.commands.lora import x\n")) == \
        [(1, f"{COMMANDS_PACKAGE}.lora")]
    assert commands_imported(me, imports("from . import train\n")) == \
        [(1, f"{COMMANDS_PACKAGE}.train")]
    assert commands_imported(me, imports("from .train import finish\n")) == \
        [(1, f"{COMMANDS_PACKAGE}.train")]
    inside = "def f():\n    from numpytfmr.run.commands import pretrain\n    return pretrain\n"
    assert commands_imported(me, imports(inside)) == [(2, f"{COMMANDS_PACKAGE}.pretrain")]
    assert commands_imported(me, imports("import importlib\n"
                                         "importlib.import_module('numpytfmr.run.commands.lora')\n")) \
        == [(2, f"{COMMANDS_PACKAGE}.lora")]
    # helpers, the command line's types and its own module are allowed
    assert commands_imported(me, imports("from numpytfmr.run.options import add_run_options\n"
                                         "from numpytfmr.run.cli import UsageError\n"
                                         "from numpytfmr.run.commands.dpo import cmd_dpo\n")) == []


def _imports_of_source(relpath, source):
    """``_imported_modules`` of ``source`` as if it were the file ``relpath``."""
    original = _parse
    try:
        globals()["_parse"] = lambda _: ast.parse(source)
        return _imported_modules(relpath)
    finally:
        globals()["_parse"] = original


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_imports_no_other_command(module):
    found = commands_imported(module)
    assert not found, (f"{module} imports another command: " + ", ".join(
        f"{m} (line {line})" for line, m in found)
        + "; what commands share belongs in a module of helpers in numpytfmr/run/ "
        "(options.py for flags, outputs.py for the run folder and the end of a run)")


# The flag groups several commands share (--summary, --force, the run folder, the time
# budget, the adapters, the shape of a transformer) are declared once, in run/options.py,
# and a command's sub-parser (its help and description) by options.command_parser.
SHARED_FLAGS = ("--summary", "--force", "--out", "--resume", "--plot", "--threads", "--quiet",
                "--minutes", "--steps", "--rank", "--alpha", "--targets", "--d-model",
                "--n-layers", "--n-heads", "--n-kv-heads", "--d-ff", "--positional", "--norm",
                "--activation")


def _declared(relpath):
    """``(line, flag)`` of the long flags ``relpath`` declares, and the lines of its
    ``add_parser`` calls."""
    flags, parsers = [], []
    for node in ast.walk(_parse(relpath)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "add_argument":
                flags += [(node.lineno, a.value) for a in node.args
                          if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            elif node.func.attr == "add_parser":
                parsers.append(node.lineno)
    return flags, parsers


def test_the_shared_flags_are_declared_in_options_only():
    options, parsers = _declared("run/options.py")
    assert set(SHARED_FLAGS) <= {flag for _, flag in options} and len(parsers) == 1
    for module in COMMAND_MODULES:
        flags, parsers = _declared(module)
        again = [f"{flag} (line {line})" for line, flag in flags if flag in SHARED_FLAGS]
        assert not again, (f"{module} declares {', '.join(again)}; shared flags come from "
                           "numpytfmr/run/options.py (add_force, add_summary, add_run_options...)")
        assert not parsers, (f"{module} calls add_parser (line {parsers[0]}); a command's "
                             "sub-parser is options.command_parser(sub, name)")
