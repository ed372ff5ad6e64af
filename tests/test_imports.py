"""The import graph of numpytfmr has no circle.

Every ``import`` and ``from ... import`` in every module of the package, at module level
or inside a function, is an edge from that module to the module it names (``from . import
x`` names the submodule ``x`` when there is one). A circle among them is a failure, listed
module by module: a function-level import that closes a circle only hides it.
The files are parsed with ``ast``; nothing is imported.
"""
import ast
import importlib.util
import pathlib

PACKAGE = "numpytfmr"
PKG_DIR = pathlib.Path(importlib.util.find_spec(PACKAGE).submodule_search_locations[0])


def _modules():
    """``{dotted name: (path, is_package)}`` of every module of the package."""
    out = {}
    for path in PKG_DIR.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(PKG_DIR.parent).with_suffix("").parts)
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
