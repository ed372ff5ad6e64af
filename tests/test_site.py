"""The reader (``numpytfmr docs``): the site it builds, and the math converters it draws with.

The site is built once per module, through the ``docs`` command, into a temporary folder.
Checked: every registered op has an entry with its equations (MathML) and its forward and
backward source; the API reference lists every name ``numpytfmr`` exports; no raw TeX is
left in any page; every link inside the site lands on a page and an id that exist; nothing
is loaded from the network; the copyable ``check_gradients`` calls run and pass; the
command refuses to write into a folder that is not a site. The plain-text math converter is
checked on the notes' equations, the TeX converter on the notebooks' formulas.
"""
import argparse
import ast
import contextlib
import html
import inspect
import io
import json
import pathlib
import re
import time
import types
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("markdown_it", reason="the reader needs the docs extra (pip install \".[docs]\")")

import numpytfmr
from numpytfmr.registry import registry
from numpytfmr.run.commands import docs as docs_command
from numpytfmr.site import SiteExistsError, build_site
from numpytfmr.site import build as site_build
from numpytfmr.site.collect import parse_refs
from numpytfmr.site.markup import highlight_lines, markdown_to_html, slugify
from numpytfmr.site.pages import lhs_symbols, pieces, segments
from numpytfmr.site.plainmath import tex_to_mathml, to_mathml, to_tex
from numpytfmr.site.snippets import check_snippet
from numpytfmr.site.tables import load_errata

REPO = pathlib.Path(__file__).resolve().parents[1]
GREEK_NAMES = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "kappa", "lambda",
               "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "phi", "chi", "psi", "omega")
TEX_COMMANDS = re.compile(r"\$\$|\\(?:frac|tfrac|sqrt|mathbf|mathrm|mathbb|mathcal|operatorname|begin|end|"
                          r"left|right|sum|prod|alpha|beta|gamma|sigma|theta|top|cdot|times|text|hat|"
                          r"tilde|partial|odot|qquad|quad)\b")


def run_docs(argv):
    parser = argparse.ArgumentParser(prog="numpytfmr")
    docs_command.add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["docs", *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = args.func(args)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("reader") / "site"
    cpu = time.process_time()
    status, printed, err = run_docs(["-o", str(out), "--source", str(REPO), "--no-execute"])
    cpu = time.process_time() - cpu
    assert status == 0, err
    pages = {p.name: p.read_text(encoding="utf-8") for p in out.glob("*.html")}
    return types.SimpleNamespace(dir=out, pages=pages, printed=printed, cpu_seconds=cpu)


def _section(page_html, anchor):
    """The HTML of the ``<section class="entry" id=anchor>`` of a page."""
    start = page_html.index(f'<section class="entry" id="{anchor}"')
    end = page_html.index("</section>", start)
    return page_html[start:end]


def _text(fragment, sep=" "):
    """The visible text of an HTML fragment (scripts and styles dropped); ``sep`` stands for
    each tag (use "" inside highlighted code, whose tokens are separate elements)."""
    fragment = re.sub(r"<(script|style)\b.*?</\1>", " ", fragment, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", sep, fragment))


# ---------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------

def test_command_reports_the_pages_and_how_to_open_them(site):
    assert re.search(r"wrote \d+ pages", site.printed)
    assert "index.html" in site.printed
    n = int(re.search(r"wrote (\d+) pages", site.printed).group(1))
    assert n == len(site.pages) >= 30
    for page in ("index.html", "errata.html", "api.html", "contract.html", "norms.html",
                 "attention.html", "01_attention.html", "test_norms.html"):
        assert page in site.pages, page
    assert (site.dir / "assets" / "site.css").is_file() and (site.dir / "assets" / "site.js").is_file()


def test_build_takes_well_under_a_minute(site):
    """The command reports its time; the bound is on this process's CPU seconds, which other
    work on the machine does not stretch as it stretches the wall clock."""
    seconds = float(re.search(r"in ([\d.]+) s", site.printed).group(1))
    assert seconds > 0
    assert site.cpu_seconds < 60, site.cpu_seconds


def test_every_registered_op_has_its_equation_and_code(site):
    for name, spec in registry().items():
        module = spec.forward.__module__.rsplit(".", 1)[-1]
        page = site.pages[f"{module}.html"]
        entry = _section(page, f"{name}_forward")
        math_col = entry[entry.index('class="math-col"'):entry.index('class="code-col"')]
        code_col = entry[entry.index('class="code-col"'):]
        assert "<math" in math_col, f"{name}: no rendered equation"
        code = _text(code_col, "")
        assert f"def {name}_forward" in code and f"def {name}_backward" in code, name
        assert spec.section in _text(entry[:entry.index('class="pair"')]), f"{name}: section not shown"
        for line in spec.forward.__contract__.lines():
            assert line in html.unescape(entry), f"{name}: contract line {line!r} missing"
        assert f'id="{name}_backward"' in entry
        assert f'id="check-{name}"' in entry, f"{name}: no check_gradients call"


def test_every_public_function_of_a_topic_module_has_an_entry(site):
    missing = []
    for path in sorted((REPO / "numpytfmr").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = __import__(f"numpytfmr.{path.stem}", fromlist=["_"])
        page = site.pages.get(f"module-{path.stem}.html") or site.pages.get(f"{path.stem}.html")
        assert page is not None, f"no page for {path.stem}.py"
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ == module.__name__ and f'id="{name}"' not in page:
                missing.append(f"{path.stem}.{name}")
    assert not missing, missing


def _exported():
    """``dir(numpytfmr)``'s public names that resolve (an entry point is loaded on access)."""
    return [n for n in dir(numpytfmr) if not n.startswith("_")
            and getattr(numpytfmr, n, None) is not None]


def test_api_reference_lists_every_exported_name(site):
    api = site.pages["api.html"]
    names = [n for n in _exported() if not isinstance(getattr(numpytfmr, n), types.ModuleType)]
    assert len(names) > 150
    missing = [n for n in names if f'id="api-{n}"' not in api]
    assert not missing, missing
    assert api.count('class="api-item"') == len(names)
    # a signature and a contract: layernorm_forward's shapes from its @op line
    item = api[api.index('id="api-layernorm_forward"'):]
    item = item[:item.index("</div>")]
    assert "layernorm_forward(x, gamma, beta, *, eps=1e-05)" in html.unescape(item)
    assert "gamma: (d,)?" in item and "Layer normalization" in item


def test_no_raw_tex_and_no_network(site):
    for name, page in site.pages.items():
        # the rendered text (source listings apart: a test may hold TeX in a string) ...
        text = _text(re.sub(r"<pre\b.*?</pre>", " ", page, flags=re.S))
        bad = TEX_COMMANDS.search(text)
        assert bad is None, f"{name}: raw TeX {text[max(0, bad.start() - 40):bad.end() + 40]!r}"
        # ... and the HTML itself, listings included
        bad = TEX_COMMANDS.search(page)
        assert bad is None, f"{name}: raw TeX in the HTML {page[max(0, bad.start() - 40):bad.end() + 40]!r}"
        for url in re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=\"([^\"]*)\"", page):
            assert not re.match(r"(https?:)?//", url), f"{name} loads {url}"
    css = (site.dir / "assets" / "site.css").read_text(encoding="utf-8")
    js = (site.dir / "assets" / "site.js").read_text(encoding="utf-8")
    assert "@import" not in css and "url(" not in css
    assert "fetch(" not in js and "XMLHttpRequest" not in js and "http" not in js


def test_every_link_inside_the_site_lands(site):
    ids = {name: set(re.findall(r'\bid="([^"]+)"', page)) for name, page in site.pages.items()}
    broken = []
    for name, page in site.pages.items():
        for href in set(re.findall(r'\bhref="([^"]+)"', page)):
            href = html.unescape(href)
            if re.match(r"(https?:|mailto:|data:)", href):
                continue
            target, _, frag = href.partition("#")
            target = target or name
            if target.startswith("assets/"):
                if not (site.dir / target).is_file():
                    broken.append(f"{name}: {href}")
                continue
            if target not in ids:
                broken.append(f"{name}: {href} (no page)")
            elif frag and frag not in ids[target]:
                broken.append(f"{name}: {href} (no id)")
    assert not broken, "\n".join(sorted(broken)[:30])


def test_index_lists_the_chapters_in_order_with_ops_notebooks_and_errata(site):
    index = site.pages["index.html"]
    positions = [index.index(f'id="note-{n}"') for n in ("000", "001", "002", "003", "004")]
    assert positions == sorted(positions)
    chapter_003 = index[positions[3]:positions[4]]
    # 003's topics follow its sections: cross-entropy (§2-3) before attention (§5) before RoPE (§7)
    order = [chapter_003.index(f'id="note-003-{m}"') for m in ("losses", "attention", "positional")]
    assert order == sorted(order)
    topic = chapter_003[chapter_003.index('id="note-003-attention"'):]
    topic = topic[:topic.index("</li>")]
    assert 'href="attention.html#attention_forward"' in topic
    assert "01_attention.html" in topic or "02_multihead_attention.html" in topic
    assert "errata.html#erratum-" in topic
    errata = site.pages["errata.html"]
    n_errata = errata.count('class="erratum"')
    assert n_errata >= 20
    for k in range(1, n_errata + 1):
        assert f"errata.html#erratum-{k}" in index, f"erratum {k} not reachable from the index"


def test_errata_page_says_what_is_wrong_what_is_right_and_which_test_shows_it(site):
    errata = site.pages["errata.html"]
    tests = [e["test"] for e in load_errata(REPO)]
    assert tests
    for t in tests:
        path, name = t.split("::")
        page = pathlib.Path(path).stem + ".html"
        assert f'href="{page}#{name}"' in errata, t
        assert f'id="{name}"' in site.pages[page]
    first = errata[errata.index('id="erratum-2"'):errata.index('id="erratum-3"')]
    assert "the notes say" in first and "correct" in first and "<math" in first


def test_contract_page_is_docs_contract_md(site):
    page = site.pages["contract.html"]
    md = (REPO / "docs" / "contract.md").read_text(encoding="utf-8")
    for heading in re.findall(r"^## (.+)$", md, re.M):
        assert f'id="{slugify(heading.replace("`", ""))}"' in page, heading
    assert "<table>" in page and "<ol>" in page and 'class="code"' in page


def test_commented_lines_are_paired_with_their_equations(site):
    entry = _section(site.pages["norms.html"], "layernorm_forward")
    rows = re.findall(r'<div class="ln paired"( data-sym="[^"]*")?>(.*?)</span></div>', entry, re.S)
    assert len(rows) >= 4
    mu_row = next(r for r in rows if "x.mean" in _text(r[1], ""))
    assert 'data-sym="mu"' in mu_row[0] and "<math" in mu_row[1] and "μ" in mu_row[1]
    assert 'class="eq" data-sym="mu"' in entry          # the docstring's mu_i = ... line


def test_check_gradients_calls_run_and_pass(site):
    for name, spec in registry().items():
        code = check_snippet(spec)
        page = site.pages[f"{spec.forward.__module__.rsplit('.', 1)[-1]}.html"]
        shown = page[page.index(">", page.index(f'id="check-{name}"')) + 1:]
        shown = _text(shown[:shown.index("</pre>")], "")
        assert shown.strip() == code.strip(), name
        scope = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"<check {name}>", "exec"), scope)
        assert scope["result"].passed, f"{name}\n{scope['result']}"


def test_ops_link_their_tests_and_notebook_cells(site):
    entry = _section(site.pages["norms.html"], "layernorm_forward")
    assert 'href="test_norms.html#test_layernorm_constant_row_is_finite"' in entry
    assert 'test_registry.html#test_backward_matches_finite_differences' in entry
    cell = re.search(r'href="04_layernorm_ffn_residuals\.html#cell-(\d+)"', entry)
    assert cell, "no link to the LayerNorm notebook"
    nb = json.loads((REPO / "notebooks" / "04_layernorm_ffn_residuals.ipynb").read_text(encoding="utf-8"))
    source = "".join(nb["cells"][int(cell.group(1)) - 1]["source"])
    assert "layernorm_forward" in source or "layernorm_backward" in source


def test_search_index_covers_ops_names_symbols_and_sections(site):
    page = site.pages["index.html"]
    data = json.loads(re.search(r'<script type="application/json" id="search-index">(.*?)</script>',
                                page, re.S).group(1))
    by_name = {}
    for item in data:
        by_name.setdefault(item["n"], []).append(item)
    for name in registry():
        assert any(i["k"] == "op" for i in by_name.get(name, [])), name
    layernorm = next(i for i in by_name["layernorm"] if i["k"] == "op")
    assert "004 eq. 27-28" in layernorm["d"]
    assert {"mu", "μ", "sigma", "σ"} <= set(layernorm["s"].split())
    exported = [n for n in _exported()
                if not isinstance(getattr(numpytfmr, n), types.ModuleType)
                and (inspect.isfunction(getattr(numpytfmr, n)) or inspect.isclass(getattr(numpytfmr, n)))]
    assert not [n for n in exported if n not in by_name]


def test_refuses_a_folder_that_is_not_a_site_and_rebuilds_its_own(tmp_path, monkeypatch):
    def tiny(source=None, execute=False):
        return {"index.html": "<!doctype html><title>x</title>", "assets/site.css": "body{}",
                "old-or-new.html": "<p>"}
    monkeypatch.setattr(site_build, "render_site", tiny)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    status, _, err = run_docs(["-o", str(foreign)])
    assert status == 2 and "not empty" in err and "--force" in err
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]
    with pytest.raises(SiteExistsError):
        build_site(foreign)
    status, _, _ = run_docs(["-o", str(foreign), "--force"])
    assert status == 0 and (foreign / "mine.txt").read_text() == "keep me"
    assert (foreign / "index.html").is_file()
    # a site is rebuilt in place, and a page that is no longer produced is removed
    site_dir = tmp_path / "site"
    assert run_docs(["-o", str(site_dir)])[0] == 0
    monkeypatch.setattr(site_build, "render_site",
                        lambda source=None, execute=False: {k: v for k, v in tiny().items() if k != "old-or-new.html"})
    assert run_docs(["-o", str(site_dir)])[0] == 0
    assert not (site_dir / "old-or-new.html").exists() and (site_dir / "index.html").is_file()
    a_file = tmp_path / "file.html"
    a_file.write_text("x")
    assert run_docs(["-o", str(a_file)])[0] == 2


# ---------------------------------------------------------------------------------------
# The docstrings' plain-text math (docs/math.md), spelled in TeX for latex2mathml
# ---------------------------------------------------------------------------------------

def _xml(mathml):
    return ET.fromstring(mathml)


def _shown(mathml):
    return "".join(_xml(mathml).itertext())


def test_layernorm_004_eq_27_28_in_tex():
    assert to_tex("mu_i = (1/d) sum_j x_ij") == r"\mu_{i} = (1/d) \sum _{j} x_{ij}"
    tex = to_tex("sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)       (population variance)")
    assert tex.startswith(r"\sigma_{i} = \sqrt{(1/d) \sum _{j} (x_{ij} - \mu_{i})^{2} + \varepsilon}")
    assert r"\text{ population }" in tex
    m = to_mathml("sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)")
    assert m.count("<msqrt>") == 1 and "σ" in m and "ε" in m and "∑" in m


def test_attention_003_5_1_1_in_tex():
    assert to_tex("A = softmax(Q K^T / sqrt(d_k) + M) V") == \
        r"A = \operatorname{softmax}(Q K^{T} / \sqrt{d_{k}} + M) V"
    assert to_tex("A = softmax(Q K^T * scale + M),   out = A V") == \
        r"A = \operatorname{softmax}(Q K^{T} \cdot \mathit{scale} + M),\quad \text{ out } = A V"


def test_scripts_greek_accents_and_names():
    assert to_tex("m_t = beta1 m_{t-1} + (1 - beta1) g") == r"m_{t} = \beta_{1} m_{t-1} + (1 - \beta_{1}) g"
    assert to_tex("m_hat = m_t / (1 - beta1^t)") == r"\hat{m} = m_{t} / (1 - \beta_{1}^{t})"
    assert to_tex("dx = dxhat / sigma").replace(" ", "") == r"dx=d\hat{x}/\sigma"
    assert r"d\theta" in to_tex("g = dL/dtheta + lambda * theta")
    assert to_tex("sum_{i=2}^n log P(w_i | w_{i-1})") == r"\sum _{i=2}^{n} \log P(w_{i} | w_{i-1})"
    assert to_tex("x~_{i,2k} = x_{i,2k} cos(theta_{i,k})") == r"\tilde{x}_{i,2k} = x_{i,2k} \cos (\theta_{i,k})"
    assert to_tex("dphi_Q_i = S dnum_i") == r"d\phi_{Q,i} = S \mathit{dnum}_{i}"
    assert to_tex("n_kv_heads * d_head") == r"n_{\mathit{kv\_heads}} \cdot d_{\mathit{head}}"
    assert to_tex("grads = clip_grad_norm(g)") == r"\mathit{grads} = \texttt{clip_grad_norm}(g)"
    assert to_tex("x^-1") == "x^{-1}" and to_tex("base^(2i/d)") == r"\mathit{base}^{2i/d}"
    assert "Φ" in to_mathml("gelu(x) = x Phi(x)") and "′" in to_mathml("q'(k) = (1 - eps) [k = y] + eps / K") \
        or "'" in to_mathml("q'(k) = (1 - eps) [k = y] + eps / K")


def test_operators_text_and_references():
    assert to_tex("dV = A^T dout   ->  dA = dout V^T") == \
        r"dV = A^{T} \mathit{dout}\quad \to \quad dA = \mathit{dout} V^{T}"
    assert r"\le" in to_tex("mask[i, j] = j <= (n_k - n_q) + i")
    assert r"\ne" in to_tex("a != b") and r"\leftarrow" in to_tex("theta <- theta - eta * g")
    assert r"\text{ (004 eq. 27) }" in to_tex("mu_i                (004 eq. 27)")
    assert r"\text{ for } \text{ allowed } j" in to_tex("exp(S_ij - m_i)  for allowed j, else 0")
    assert r'\text{ "none" }' in to_tex('approximate="none":  gelu(x) = x Phi(x)')


def _reference_docstrings():
    """``(path, docstrings)`` of every topic module (``numpytfmr/*.py``), parsed, not imported."""
    for path in sorted((REPO / "numpytfmr").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        yield path, [ast.get_docstring(node) for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node)]


def _assert_converts(text, *, display=False):
    """``text`` converts to MathML without an error and keeps every word of it."""
    m = to_mathml(text, display=display)
    assert "<merror" not in m, (text, to_tex(text), m)
    shown = _shown(m)
    for word in re.findall(r"[A-Za-z]{4,}", text):
        if word in ("sqrt", "prod", "tilde") or word.endswith("hat") or \
                any(g in word.lower() for g in GREEK_NAMES) or word in ("tanh", "sinh", "cosh"):
            continue                                    # drawn as a symbol, not spelled out
        assert word in shown, (text, word)


def test_every_equation_and_comment_of_the_reference_converts():
    """Every indented docstring line and end-of-line comment of the topic modules converts,
    without an error, to well-formed MathML that keeps every word of the source."""
    lines = []
    for path, docs in _reference_docstrings():
        for doc in docs:
            lines += [l for l in doc.splitlines() if l.startswith("    ") and l.strip()]
        lines += [c[1:] for c in re.findall(r"(?m)(?<=\S)\s+(#.*)$", path.read_text(encoding="utf-8"))]
    assert len(lines) > 300
    for line in filter(str.strip, lines):
        _assert_converts(line, display=True)


def test_segments_pieces_and_symbols_for_pairing():
    assert segments("S = Q K^T * scale + M,   A = softmax(S) row-wise (masked),   out = A V") == \
        ["S = Q K^T * scale + M,", "A = softmax(S) row-wise (masked),", "out = A V"]
    assert segments("min( D[i-1, j]   + del_cost,   x)") == ["min( D[i-1, j]   + del_cost,   x)"]
    assert pieces("A = softmax(Q K^T / sqrt(d_k + 1)) V  (004 eq. 8)") == \
        ["A", "=", "softmax(Q", "K^T", "/", "sqrt(d_k + 1))", "V", "(004 eq. 8)"]
    assert pieces("theta^(2i / d) x_{i, j}") == ["theta^(2i / d)", "x_{i, j}"]
    assert lhs_symbols("mu_i    = (1/d) sum_j x_ij") == {"mu"}
    assert lhs_symbols("dV = A^T dout,   dA = dout V^T") == {"dV", "dA"}
    refs = parse_refs("(003 §5.1.1-5.1.2, 000 §2.1, 002, 004 eq. 8)")
    assert [str(r) for r in refs] == ["003 §5.1.1-5.1.2", "000 §2.1", "002", "004 eq. 8"]
    assert [str(r) for r in parse_refs("003 eq. 2.2, §3.7; 004 'Multi-Head Attention'")] == \
        ["003 eq. 2.2", "003 §3.7", '004 "Multi-Head Attention"']


# ---------------------------------------------------------------------------------------
# TeX (notebooks), Markdown and Python, by latex2mathml, markdown-it-py and Pygments
# ---------------------------------------------------------------------------------------

def test_every_formula_of_the_notebooks_converts():
    formulas = []
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"])
                formulas += [a or b for a, b in re.findall(r"\$\$(.+?)\$\$|\$([^$]+)\$", src, re.S)]
    assert len(formulas) > 100
    for f in formulas:
        m = tex_to_mathml(f)
        assert "<merror" not in m, f
        assert "\\" not in _shown(m), f
    m = tex_to_mathml(r"\mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right) V", display=True)
    assert "<mfrac>" in m and "<msqrt>" in m and "⊤" in m and 'display="block"' in m


def test_markdown_converter():
    out = markdown_to_html("# The `@op` layer\n\nText with `code`, $x^2$ and a [link](#the-op-layer).\n\n"
                           "| a | b |\n| --- | --- |\n| `x \\| y` | 2 |\n\n1. one\n2. two\n   - nested\n\n"
                           "```python\nx = 1  # one\n```\n")
    assert '<h1 id="the-op-layer">' in out
    assert "<code>code</code>" in out and "<msup>" in out and 'href="#the-op-layer"' in out
    assert "<td><code>x | y</code></td>" in out
    assert re.search(r"<ol>\s*<li>one</li>\s*<li>two\s*<ul>\s*<li>nested</li>\s*</ul>\s*</li>\s*</ol>", out)
    assert '<span class="com"># one</span>' in out
    assert "&lt;script&gt;" in markdown_to_html("<script>alert(1)</script>")
    assert "<a " not in markdown_to_html("[gone](x.md)", link=lambda href: None)
    assert "<img" not in markdown_to_html("![a figure](fig.png)")


def test_python_lines_keep_their_comments_apart():
    lines = highlight_lines('def f(x):\n    """Doc."""\n    # only a comment\n    y = g(x)  # y_i = x_i\n    return y\n',
                            linker=lambda name: "#g" if name == "g" else None)
    assert [l.comment for l in lines] == [None, None, " only a comment", " y_i = x_i", None]
    assert lines[2].full_comment and not lines[3].full_comment
    assert lines[3].text == "    y = g(x)" and '<a class="ref-link" href="#g">' in lines[3].code
    assert '<span class="kw">def</span>' in lines[0].code and 'class="ds"' in lines[1].code


def test_builds_from_the_code_alone_without_a_checkout(tmp_path, monkeypatch):
    """An installed package with no README, notebooks or tests around it still gets the
    topic pages, the API reference and the chapters (from the docstrings' references)."""
    from numpytfmr.site import collect as site_collect
    monkeypatch.setattr(site_collect, "find_source_tree", lambda explicit=None: None)
    result = build_site(tmp_path / "bare")
    pages = {p for p in result.pages}
    assert {"index.html", "api.html", "errata.html", "norms.html", "attention.html"} <= pages
    index = (tmp_path / "bare" / "index.html").read_text(encoding="utf-8")
    assert 'id="note-004"' in index and 'href="norms.html' in index
    assert not any(p.startswith("test_") for p in pages)


def test_prose_math_in_single_backticks_is_drawn(site):
    """docs/math.md: math inside a docstring's sentence is written between single backticks
    and drawn as MathML, not left as text."""
    entry = _section(site.pages["norms.html"], "layernorm_forward")
    prose = entry[entry.index("plain"):]
    prose = prose[:prose.index("</p>")]
    assert prose.count('<span class="inline-math">') == 4 and 'title="LN(x_i)"' in prose
    assert "LN(x_i)" not in _text(prose)            # drawn, not spelled


def _prose_math_spans(doc):
    """The single-backtick spans of a docstring (docs/math.md), without ``code`` and roles."""
    doc = re.sub(r":\w+:`[^`]*`", "", doc)
    doc = re.sub(r"``.+?``", "", doc, flags=re.S)
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", doc)]


def test_every_prose_math_span_of_the_reference_converts():
    """Math inside the sentences of every topic module's docstrings (between single
    backticks) converts, without an error, to MathML that keeps every word of the source."""
    spans = [(path.name, span) for path, docs in _reference_docstrings()
             for doc in docs for span in _prose_math_spans(doc)]
    assert len(spans) > 250 and len({name for name, _ in spans}) > 15
    for name, span in spans:
        _assert_converts(span)


def test_no_prose_math_is_left_undrawn_on_the_topic_pages(site):
    """A single-backtick span that lands where the reader shows text as it is (a shape
    block, a contract line, a reference) would show its backticks: no topic page has one."""
    from numpytfmr.site.pages import Site
    for path in sorted((REPO / "numpytfmr").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        page = site.pages[Site.topic_page(path.stem)]
        page = re.sub(r"<math\b.*?</math>", "", page, flags=re.S)
        page = re.sub(r'<div class="ln\b[^"]*"[^>]*>.*?</div>', "", page, flags=re.S)   # the source
        left = re.findall(r"(?<![`:])`[^`<>]+`(?!`)", page)
        assert not left, (path.name, left)
