"""The pages of the reader, as HTML strings (docs/reader.md says what each page shows).

Every page shares one frame (:meth:`Site.frame`): a header with the search box and the
theme switch, a side bar, the page, and the search index as JSON.
"""
import ast
import base64
import html
import inspect
import json
import re
import textwrap

from .collect import NOTES
from .markup import highlight_block, highlight_lines
from .markup import inline as md_inline
from .markup import markdown_to_html, slugify
from .plainmath import atoms, symbols, to_mathml
from .snippets import check_snippet

__all__ = ["Site"]


def _e(text):
    return html.escape(str(text), quote=True)


_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?:\+|-|\*|/|@)?=(?!=)")
_EQ_LHS = re.compile(r"(?:^|[,;]\s+|\s{2,})([A-Za-z][A-Za-z0-9]*)(?:_\{[^}]*\}|_[A-Za-z0-9]+)?"
                     r"(?:\[[^\]]*\])?'?\s*(?:=|<-)(?!=)")


def lhs_symbols(line):
    """The symbols an equation line defines: ``"mu_i = ...,   out = A V"`` -> {"mu", "out"}."""
    return {m.group(1) for m in _EQ_LHS.finditer(line.strip())}


def code_targets(text):
    """The names a code line assigns: ``"mu = x.mean(...)"`` -> {"mu"}."""
    m = _ASSIGN.match(text)
    return {n.strip() for n in m.group(1).split(",")} if m else set()


_MATHY = re.compile(r"[=^_/*]|->|<-|\b(?:sqrt|sum|exp|log|softmax|mean|max|min)\(|\b(?:alpha|beta|gamma|"
                    r"delta|eps|theta|mu|sigma|tau|lambda|omega|phi|pi)\b|\b\d{3}\s+(?:eq\.|§)")


def segments(line):
    """A line of math split at its wide gaps (three or more spaces outside brackets), which
    the docstrings use between equations: each part can wrap to a line of its own."""
    parts, depth, cur, k = [], 0, [], 0
    while k < len(line):
        c = line[k]
        depth += c in "([{"
        depth -= c in ")]}" and depth > 0
        if c == " " and depth == 0 and line[k:k + 3] == "   ":
            j = k
            while j < len(line) and line[j] == " ":
                j += 1
            before = "".join(cur).rstrip()[-1:]
            after = line[j:j + 2]
            # mu_i    = ...  and  a   + b  are one equation; a gap before -> starts a new part
            if (after[:1] and after[:1] in "=+-*/<>,|^" and after not in ("->", "<-")) or \
                    (before and before in "=+-*/<>(^"):
                cur.append(line[k:j])
                k = j
                continue
            parts.append("".join(cur))
            cur = []
            k = j
            continue
        cur.append(c)
        k += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


# the pieces of an equation a page may wrap between (browsers do not break MathML)
pieces = atoms


def math_segments(line, *, display=False):
    return "".join('<span class="seg">' + "".join(to_mathml(p, display=display) for p in pieces(s))
                   + "</span>" for s in segments(line))


def _annotation(comment):
    text = comment.strip()
    if not text or re.match(r"(noqa|type:|pragma|pylint|fmt:)", text):
        return ""
    if _MATHY.search(text):
        return math_segments(text)
    return f'<span class="ann-text">{_e(text)}</span>'


_CODE_LINE = re.compile(r"^\s*(?:def |class |for |while |with |import |from |return\b|@|>>>)|\bnp\.\w|"
                        r"\bprint\(", re.M)


def _is_python(block):
    """An indented docstring block that is an example of code, not equations (docs/math.md):
    it parses as Python and has a statement or call no equation has."""
    if block.lstrip().startswith(">>>"):
        return True
    try:
        ast.parse(block)
    except SyntaxError:
        return False
    return bool(_CODE_LINE.search(block))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _outputs_html(outputs):
    """A code cell's outputs: printed text, results, figures (PNG or SVG as data URIs, so
    the site stays one folder with nothing to fetch) and errors."""
    parts = []
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            text = "".join(o.get("text", ""))
            cls = "out err" if o.get("name") == "stderr" else "out"
            parts.append(f'<pre class="{cls}">{_e(_ANSI.sub("", text.rstrip()))}</pre>')
        elif kind in ("execute_result", "display_data"):
            data = o.get("data", {})
            if "image/png" in data:
                png = "".join(data["image/png"]).replace("\n", "")
                alt = _e("".join(data.get("text/plain", "a figure")))
                parts.append(f'<img class="figure" alt="{alt}" src="data:image/png;base64,{png}">')
            elif "image/svg+xml" in data:
                svg = "".join(data["image/svg+xml"])
                parts.append('<img class="figure" alt="a figure" src="data:image/svg+xml;base64,'
                             + base64.b64encode(svg.encode()).decode() + '">')
            elif "text/plain" in data:
                parts.append(f'<pre class="out">{_e("".join(data["text/plain"]).rstrip())}</pre>')
        elif kind == "error":
            trace = _ANSI.sub("", "\n".join(o.get("traceback", [])))
            parts.append(f'<pre class="out err">{_e(trace or o.get("ename", "error"))}</pre>')
    return f'<div class="output">{"".join(parts)}</div>' if parts else ""


_SPECIAL_PAGES = {"index", "errata", "api", "contract"}


class Site:
    """Renders the pages of a :class:`~numpytfmr.site.collect.Model`."""

    def __init__(self, model, version=""):
        self.m = model
        self.version = version
        self.topic_of = {t.module: t for t in model.topics}
        self.urls = {}                     # public or topic name -> url of its entry
        for t in model.topics:
            for n in [n for e in t.entries for n in e.names] + [n for n, _ in t.constants]:
                self.urls.setdefault(n, f"{self.topic_page(t.module)}#{n}")
        for n, _, _ in model.public:
            self.urls.setdefault(n, f"api.html#api-{n}")
        self.tests_by_name = {}
        self.every_op_tests = [t for t in model.tests if t.every_op]
        for t in model.tests:
            for n in t.names:
                self.tests_by_name.setdefault(n, []).append(t)
        self.nb_pages = {nb.stem: f"{nb.stem}.html" for nb in model.notebooks}
        self.test_pages = {f: f"{f[:-3]}.html" for f in model.test_sources}
        self.search = []
        self.contract_anchor = self._contract_anchors()
        self.test_by_key = {(t.file, t.name): t for t in model.tests}
        self.erratum_names = {}
        for er in model.errata:
            t = self.test_by_key.get((er.test_file, er.test_name))
            self.erratum_names[er.index] = t.names if t is not None else set()
        self._trees = {}
        self.linker = self.urls.get
        self.op_names = {e.anchor for t in model.topics for e in t.entries if e.kind == "op"}

    def find(self, name, kind, where, url, syms=""):
        """Add an item to the search index."""
        self.search.append({"n": name, "k": kind, "d": where, "s": syms, "u": url})

    # -- urls -------------------------------------------------------------------------

    @staticmethod
    def topic_page(module):
        return f"{module}.html" if module not in _SPECIAL_PAGES else f"module-{module}.html"

    def test_url(self, t):
        page = self.test_pages.get(t.file)
        return f"{page}#{t.name}" if page else None

    # -- inline text of docstrings --------------------------------------------------------

    _DOC_INLINE = re.compile(r":(?:func|class|mod|meth|data|attr):`~?([\w.]+)`|``(.+?)``|`([^`]+)`|"
                             r"(?<![\w.])(00[0-4](?:\s+(?:§\s*[\d.]+(?:-[\d.]+)?|eqs?\.\s*[\d.]+(?:-[\d.]+)?|"
                             r"ch\.\s*\d+(?:-\d+)?))?)(?![\w.])")

    def doc_inline(self, text):
        out, pos = [], 0
        for m in self._DOC_INLINE.finditer(text):
            out.append(_e(text[pos:m.start()]))
            pos = m.end()
            if m.group(3) is not None:                    # `math` (docs/math.md)
                out.append(self.inline_math(m.group(3)))
                continue
            name = m.group(1) or m.group(2)
            if name is not None:
                out.append(self.code_link(name.split(".")[-1] if m.group(1) else name))
            else:
                out.append(f'<span class="ref">{_e(m.group(4))}</span>')
        out.append(_e(text[pos:]))
        return "".join(out)

    @staticmethod
    def inline_math(text):
        """Plain-text math inside prose, in pieces a line may break between."""
        return f'<span class="inline-math">{" ".join(to_mathml(a) for a in atoms(text))}</span>'

    def code_link(self, text):
        base = re.match(r"[A-Za-z_]\w*", text)
        url = self.urls.get(base.group()) if base and (base.group() == text or
                                                       text.startswith(base.group() + "(")) else None
        code = f"<code>{_e(text)}</code>"
        return f'<a href="{_e(url)}">{code}</a>' if url else code

    # -- docstrings -------------------------------------------------------------------

    def doc_html(self, doc, *, skip_summary=False):
        """A docstring: indented paragraphs are equations (MathML, one line each), lines
        ``name: ...`` a definition list, shape lines code, the rest prose."""
        paras = [p for p in re.split(r"\n[ \t]*\n", doc.strip("\n")) if p.strip()]
        if skip_summary and paras:
            paras = paras[1:]
        out = []
        for p in paras:
            lines = p.split("\n")
            if all(l.startswith("    ") or not l.strip() for l in lines):
                code = textwrap.dedent("\n".join(lines))
                if _is_python(code):
                    out.append(highlight_block(code, linker=self.linker))
                else:
                    out.append(self.equations(lines))
                continue
            # a prose line followed by indented equation lines
            if len(lines) > 1 and not lines[0].startswith(" ") and lines[0].rstrip().endswith(":") and \
                    all(l.startswith("    ") for l in lines[1:]):
                out.append(f"<p>{self.doc_inline(lines[0])}</p>")
                out.append(self.equations(lines[1:]))
                continue
            if self._is_shapes(lines[0]):
                out.append('<p class="shapes"><code>' + _e("\n".join(lines)) + "</code></p>")
                continue
            if self._is_term(lines[0]) or re.match(r"^(?:- |\* |\d+\. )", lines[0]):
                out.append(self.definitions(lines))
                continue
            out.append(f"<p>{self.doc_inline(' '.join(l.strip() for l in lines))}</p>")
        return "\n".join(out)

    @staticmethod
    def _is_term(line):
        """``name: text`` with a code-like name (``eps:``, ``"weights":``, ``cache keys:``)."""
        m = re.match(r"^([\w\"'.\[\], *()=]{1,40}):\s", line)
        return bool(m) and (" " not in m.group(1).strip() or m.group(1)[0].islower()
                            or bool(re.search(r"[\"'_(\[=]", m.group(1))))

    @staticmethod
    def _is_shapes(line):
        return len(re.findall(r"\b\w+: \(", line)) >= 2 or ("->" in line and re.search(r"\b\w+: \(", line))

    def definitions(self, lines):
        items = []
        for l in lines:
            m = re.match(r"^([\w\"'.\[\], *()=]{1,40}):\s+(.*)$", l)
            bullet = re.match(r"^(?:- |\* |\d+\. )(.*)$", l)
            if m and not l.startswith(" ") and self._is_term(l):
                items.append([m.group(1), m.group(2)])
            elif bullet:
                items.append(["", bullet.group(1)])
            elif items:
                items[-1][1] += " " + l.strip()
            else:
                items.append(["", l.strip()])
        parts = []
        for term, body in items:
            if self._is_shapes(f"{term}: {body}"):
                parts.append(f'<div class="def shapes"><code>{_e(term)}: {_e(body)}</code></div>')
            elif term:
                parts.append(f'<div class="def"><code class="term">{_e(term)}</code> '
                             f"<span>{self.doc_inline(body)}</span></div>")
            else:
                parts.append(f'<div class="def"><span>{self.doc_inline(body)}</span></div>')
        return '<div class="defs">' + "".join(parts) + "</div>"

    def equations(self, lines):
        body = [l for l in lines if l.strip()]
        base = min(len(l) - len(l.lstrip()) for l in body)
        rows = []
        for l in body:
            indent = len(l) - len(l.lstrip()) - base
            sym = lhs_symbols(l)
            attr = f' data-sym="{_e(" ".join(sorted(sym)))}"' if sym else ""
            style = f' style="padding-left:{min(indent, 40) * 0.55:.2f}em"' if indent else ""
            rows.append(f'<div class="eq"{attr}{style}>{math_segments(l.strip(), display=True)}</div>')
        return '<div class="eqs">' + "".join(rows) + "</div>"

    # -- source ---------------------------------------------------------------------

    def source_html(self, fn, label):
        target = inspect.unwrap(fn)
        try:
            lines, start = inspect.getsourcelines(target)
            path = inspect.getsourcefile(target) or ""
        except (OSError, TypeError):
            return ""
        src = textwrap.dedent("".join(lines))
        doc_range = (0, -1)
        try:
            node = ast.parse(src).body[0]
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc_range = (body[0].lineno, body[0].end_lineno)
        except SyntaxError:
            pass
        rows = []
        widths = []
        hl = highlight_lines(src, linker=self.linker)
        for i, line in enumerate(hl, 1):
            no = start + i - 1
            if doc_range[0] <= i <= doc_range[1]:
                if i == doc_range[0]:
                    indent = len(line.text) - len(line.text.lstrip())
                    rows.append(f'<div class="ln doc"><span class="no">{no}</span><code>{" " * indent}'
                                f'<span class="ds">"""…"""</span></code>'
                                f'<span class="ann"><span class="ann-text">the docstring, drawn with the '
                                f'math</span></span></div>')
                continue
            if not line.full_comment and line.text.strip():
                widths.append(len(line.text.rstrip()))
            if line.full_comment:
                rows.append(f'<div class="ln full"><span class="no">{no}</span>'
                            f'<code>{line.code}<span class="com">#{_e(line.comment)}</span></code></div>')
                continue
            ann = _annotation(line.comment) if line.comment is not None else ""
            sym = code_targets(line.text)
            attr = f' data-sym="{_e(" ".join(sorted(sym)))}"' if sym else ""
            cls = "ln paired" if ann else "ln"
            rows.append(f'<div class="{cls}"{attr}><span class="no">{no}</span><code>{line.code}</code>'
                        f'<span class="ann">{ann}</span></div>')
        short = path.split("numpytfmr/")[-1] if "numpytfmr/" in path else path.rsplit("/", 1)[-1]
        head = (f'<div class="src-head"><span class="label">{_e(label)}</span> '
                f'<span class="file">numpytfmr/{_e(short)}:{start}</span></div>')
        widths.sort()
        width = widths[int(0.75 * (len(widths) - 1))] if widths else 40     # long lines wrap
        width = max(34, min(width, 64)) + 1
        return (f'<div class="src" style="--code-w:{width}ch">{head}'
                f'<div class="lines">{"".join(rows)}</div></div>')

    # -- one entry ------------------------------------------------------------------

    def entry_html(self, e):
        fwd = e.functions[0]
        docs = [inspect.getdoc(f) or "" for f in e.functions]
        doc = docs[0]
        summary = doc.split("\n\n")[0].strip()
        syms = {s for d in docs for eq in re.findall(r"^    .*$", d, re.M) for s in symbols(eq)}
        kind_label = {"op": "registered op", "pair": "forward / backward", "function": "function",
                      "class": "class"}[e.kind]
        section = e.section or ", ".join(list(dict.fromkeys(str(r) for r in e.refs))[:4])
        head = (f'<header class="entry-head"><h2><a class="self" href="#{_e(e.anchor)}">{_e(e.name)}</a></h2>'
                f'<span class="kind kind-{e.kind}">{kind_label}</span>'
                + (f'<span class="section ref">{_e(section)}</span>' if section else "")
                + "</header>")
        math = [f'<p class="summary">{self.doc_inline(" ".join(summary.split()))}</p>']
        rest = self.doc_html(doc, skip_summary=True)
        math.append(f'<p class="sig"><code>{_e(self.signature(fwd))}</code></p>')
        contract = getattr(fwd, "__contract__", None)
        if contract is not None:
            math.append('<div class="contract"><h4>shapes and options</h4><ul>'
                        + "".join(f"<li><code>{_e(l)}</code></li>" for l in contract.lines())
                        + "</ul></div>")
        math.append(f'<div class="doc">{rest}</div>')
        code = [self.source_html(fwd, "forward" if len(e.functions) > 1 else "source")]
        if len(e.functions) > 1:
            bwd = e.functions[1]
            math.append(f'<div class="backward-doc" id="{_e(bwd.__name__)}"><h4>backward: '
                        f"<code>{_e(self.signature(bwd))}</code></h4>"
                        f"{self.doc_html(docs[1])}</div>")
            code.append(self.source_html(bwd, "backward"))
        extras = self.extras(e)
        page = self.topic_page(e.module)
        self.find(e.name, e.kind, f"{section} · {e.module}.py".strip(" ·"), f"{page}#{e.anchor}",
                  " ".join(sorted(syms)))
        for n in e.names[1:]:
            self.find(n, "backward", f"{e.module}.py", f"{page}#{n}")
        return (f'<section class="entry" id="{_e(e.anchor)}" data-nav tabindex="-1">{head}'
                f'<div class="pair"><div class="math-col">{"".join(math)}</div>'
                f'<div class="code-col">{"".join(code)}</div></div>{extras}</section>')

    @staticmethod
    def signature(fn):
        try:
            return f"{fn.__name__}{inspect.signature(fn)}"
        except (TypeError, ValueError):
            return fn.__name__

    def extras(self, e):
        blocks = []
        if e.spec is not None:
            snippet = check_snippet(e.spec)
            sid = f"check-{e.name}"
            blocks.append(f'<div class="extra check"><h4>check its gradients</h4>'
                          f'<button type="button" class="copy" data-copy="{sid}">copy</button>'
                          f'<div id="{sid}">{highlight_block(snippet, linker=self.linker)}</div></div>')
        tests = self.tests_for(e)
        every = self.every_op_tests if e.spec is not None else []
        if tests or every:
            def item(t, suffix=""):
                url = self.test_url(t)
                label = _e(t.label + suffix)
                return f'<li><a href="{_e(url)}">{label}</a></li>' if url else f"<li>{label}</li>"
            items = "".join(item(t) for t in tests[:12])
            if len(tests) > 12:
                items += f'<li class="more">and {len(tests) - 12} more</li>'
            body = f"<h4>tests</h4><ul>{items}</ul>" if tests else ""
            if every:
                body += ("<h4>tests of every registered op</h4><ul>"
                         + "".join(item(t, f"[{e.name}]") for t in every) + "</ul>")
            blocks.append(f'<div class="extra tests">{body}</div>')
        cells = self.notebook_cells(e.names + ([e.name] if e.kind == "function" else []))
        errata = [er for er in self.m.errata if self.erratum_names[er.index] & set(e.names)]
        if cells or errata:
            items = "".join(f'<li><a href="{_e(self.nb_pages[nb.stem])}#cell-{i}">{_e(nb.stem)}, cell {i}</a>'
                            f' <span class="muted">{_e(nb.title)}</span></li>' for nb, i in cells)
            er_items = "".join(f'<li><a href="errata.html#erratum-{er.index}">erratum {er.index}: '
                               f"{_e(er.where)}</a></li>" for er in errata)
            body = ((f"<h4>in the notebooks</h4><ul>{items}</ul>" if items else "")
                    + (f"<h4>errata</h4><ul>{er_items}</ul>" if er_items else ""))
            blocks.append(f'<div class="extra notebooks">{body}</div>')
        return f'<div class="extras">{"".join(blocks)}</div>' if blocks else ""

    def tests_for(self, e):
        seen, out = set(), []
        for k in e.names + ([e.name] if e.spec is not None else []):
            for t in self.tests_by_name.get(k, []):
                if (t.file, t.name) not in seen and not t.every_op:
                    seen.add((t.file, t.name))
                    out.append(t)
        own = f"test_{e.module}.py"                   # the module's own test file first
        out.sort(key=lambda t: (t.file != own, t.file, t.line))
        return out

    def notebook_cells(self, names):
        """(notebook, 1-based cell number) of the first code cell of each notebook that uses
        one of ``names`` (at most three notebooks)."""
        out = []
        for nb in self.m.notebooks:
            for i, used in enumerate(nb.names, 1):
                if used & set(names):
                    out.append((nb, i))
                    break
        return out[:3]

    # -- the frame --------------------------------------------------------------------

    def frame(self, title, body, *, side="", kind="page", search=None):
        items = search if search is not None else self.search
        if getattr(self, "_index_for", None) is not items:      # one JSON text for every page
            self._index_for = items
            self._index_json = json.dumps(items, ensure_ascii=False,
                                          separators=(",", ":")).replace("</", "<\\/")
        index = self._index_json
        return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)} · numpytfmr reader</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/site.css">
<script>try{{var t=localStorage.getItem("numpytfmr-theme");if(t==="dark"||t==="light")document.documentElement.setAttribute("data-theme",t)}}catch(e){{}}</script>
</head>
<body class="page-{_e(kind)}">
<a class="skip" href="#main">skip to the content</a>
<header class="top">
<a class="brand" href="index.html">numpytfmr <span>reader</span></a>
<nav class="main-nav" aria-label="pages"><a href="index.html">notes</a><a href="api.html">API</a><a href="errata.html">errata</a><a href="contract.html">contract</a></nav>
<div class="search" role="search"><input id="search" type="search" placeholder="search ops, symbols, sections  ( / )" autocomplete="off" spellcheck="false" aria-label="search ops, symbols and sections" aria-controls="search-results"><ol id="search-results" role="listbox" hidden></ol></div>
<button id="theme-toggle" type="button" title="light / dark theme (t)" aria-label="switch between the light and the dark theme"><span class="sun">☀</span><span class="moon">☾</span></button>
</header>
<div class="layout">
<nav class="side" aria-label="contents">{side}</nav>
<main id="main">
{body}
</main>
</div>
<footer><span>keys: <kbd>j</kbd>/<kbd>k</kbd> next / previous entry, <kbd>/</kbd> search, <kbd>t</kbd> theme</span><span>numpytfmr {_e(self.version)} · built offline: the math is MathML, nothing is fetched</span></footer>
<script type="application/json" id="search-index">{index}</script>
<script src="assets/site.js"></script>
</body>
</html>
"""

    def topics_nav(self, current=None):
        items = []
        for t in self.m.topics:
            cls = ' class="current"' if t.module == current else ""
            items.append(f'<li><a{cls} href="{self.topic_page(t.module)}">{_e(t.module)}.py</a></li>')
        return f'<h3>topics</h3><ol class="topic-list">{"".join(items)}</ol>'

    # -- pages --------------------------------------------------------------------------

    def topic_html(self, t):
        side = ('<h3>on this page</h3><ol class="toc">' + "".join(
            f'<li><a href="#{_e(e.anchor)}">{_e(e.name)}</a>'
            + (' <span class="dot" title="registered op">●</span>' if e.kind == "op" else "") + "</li>"
            for e in t.entries) + "</ol>" + self.topics_nav(t.module))
        intro = []
        if t.what:
            intro.append(f'<p class="what">{md_inline(t.what, code=self.code_link)}</p>')
        refs = ", ".join(dict.fromkeys(str(r) for r in t.refs))
        if refs:
            intro.append(f'<p class="refs">notes: <span class="ref">{_e(refs)}</span></p>')
        doc = self.doc_html(t.doc) if t.doc else ""
        entries = "".join(self.entry_html(e) for e in t.entries)
        consts = ""
        if t.constants:
            rows = "".join(f'<div class="const" id="{_e(n)}"><code>{_e(n)} = {_e(_short_repr(v))}</code></div>'
                           for n, v in t.constants)
            consts = f'<section class="constants"><h2>constants</h2>{rows}</section>'
            for n, _ in t.constants:
                self.find(n, "constant", f"{t.module}.py", f"{self.topic_page(t.module)}#{n}")
        self.find(f"{t.module}.py", "topic", _plain(t.what), self.topic_page(t.module))
        body = (f'<h1>{_e(t.module)}.py</h1>{"".join(intro)}<div class="module-doc">{doc}</div>'
                f"{entries}{consts}")
        return side, body

    def index_html(self):
        m = self.m
        chapters = []
        placed = set()
        for note, title in NOTES.items():
            rows = []
            topics = []
            for t in m.topics:
                refs = [r for r in t.refs if r.note == note]
                if refs:
                    topics.append((min(r.key for r in refs), m.topics.index(t), t, refs))
            topics.sort(key=lambda x: (x[0], x[1]))
            for _, _, t, refs in topics:
                placed.add(t.module)
                rows.append(self.index_topic(t, note, refs))
            errata = [er for er in m.errata if any(r.note == note for r in er.refs)]
            er_html = ""
            if errata:
                er_html = ('<p class="chapter-errata">errata in this note: ' + ", ".join(
                    f'<a href="errata.html#erratum-{er.index}">{_e(" ".join(str(r) for r in er.refs if r.note == note))}</a>'
                    for er in errata) + "</p>")
            chapters.append(f'<section class="chapter" id="note-{note}"><h2><span class="note-no">{note}</span> '
                            f'{_e(title)}</h2>{er_html}<ol class="topics">{"".join(rows)}</ol></section>')
            self.find(f"note {note}", "note", title, f"index.html#note-{note}")
        rest = [t for t in m.topics if t.module not in placed]
        if rest:
            rows = "".join(self.index_topic(t, None, []) for t in rest)
            chapters.append(f'<section class="chapter" id="beyond"><h2>Beyond the notes</h2>'
                            f'<p>The tools around the equations: the gradient checker, the contract layer, '
                            f'the optimisers.</p><ol class="topics">{rows}</ol></section>')
        nbs = "".join(f'<li><a href="{self.nb_pages[nb.stem]}">{_e(nb.title)}</a> '
                      f'<span class="muted">{_e(nb.stem)}.ipynb</span></li>' for nb in m.notebooks)
        for nb in m.notebooks:
            self.find(nb.title, "notebook", f"{nb.stem}.ipynb", self.nb_pages[nb.stem],
                      " ".join(dict.fromkeys(str(r) for r in nb.refs)))
        n_ops = sum(1 for t in m.topics for e in t.entries if e.kind == "op")
        intro = (f"<h1>The notes, equation by equation</h1>"
                 f'<p class="lead">numpytfmr writes each equation of the lecture notes as a NumPy '
                 f"function, a forward and its hand-written backward. This reader sets every one beside "
                 f"its math: the notes' chapters in their order, each topic with the ops that implement "
                 f"it ({n_ops} registered, gradient-checked ops in all), the notebook that explores it and "
                 f'the errata that concern it. The notes themselves are not part of the package; the '
                 f'code cites them by note and section.</p>'
                 f'<p class="pages">Also: <a href="api.html">the API reference</a> (every name '
                 f'<code>numpytfmr</code> exports), <a href="contract.html">the API contract</a>, '
                 f'<a href="errata.html">the errata</a> ({len(m.errata)} places where the notes are '
                 f"wrong).</p>")
        side = ('<h3>notes</h3><ol class="toc">' + "".join(
            f'<li><a href="#note-{n}">{n}</a> <span class="muted">{_e(t.split(":")[0].split("(")[0])}</span></li>'
            for n, t in NOTES.items()) + "</ol>" + self.topics_nav())
        body = intro + "".join(chapters) + (f'<section class="chapter" id="notebooks"><h2>Notebooks</h2>'
                                            f'<ol class="nb-list">{nbs}</ol></section>' if nbs else "")
        return side, body

    def index_topic(self, t, note, refs):
        keys = {}
        for r in refs:
            if r.label:
                keys.setdefault(r.label, r.key)
        labels = sorted(keys, key=lambda l: keys[l])
        ops = [e for e in t.entries if note and any(r.note == note for r in e.refs)]
        if not ops:
            ops = [e for e in t.entries if e.kind in ("op", "pair")] or t.entries[:6]
        op_links = ", ".join(f'<a href="{self.topic_page(t.module)}#{_e(e.anchor)}" class="{"op" if e.kind == "op" else ""}">'
                             f"{_e(e.name)}</a>" for e in ops[:14])
        if len(ops) > 14:
            op_links += f', <a href="{self.topic_page(t.module)}">{len(ops) - 14} more</a>'
        nbs = self.topic_notebooks(t, note)
        nb_html = ""
        if nbs:
            nb_html = '<p class="nbs">explored in ' + ", ".join(
                f'<a href="{self.nb_pages[nb.stem]}">{_e(nb.title)}</a>' for nb in nbs) + "</p>"
        errata = [er for er in self.m.errata if er.module == t.module and
                  (note is None or any(r.note == note for r in er.refs))]
        er_html = ""
        if errata:
            er_html = '<p class="errata">errata: ' + "; ".join(
                f'<a href="errata.html#erratum-{er.index}">{_e(er.where)}</a>' for er in errata) + "</p>"
        anchor = f"note-{note}-{t.module}" if note else f"beyond-{t.module}"
        sect = f'<span class="ref">{_e(", ".join(labels))}</span>' if labels else ""
        return (f'<li class="topic" id="{anchor}" data-nav tabindex="-1"><h3><a href="{self.topic_page(t.module)}">'
                f'{_e(t.module)}.py</a> {sect}</h3>'
                + (f'<p class="what">{md_inline(t.what, code=self.code_link)}</p>' if t.what else "")
                + f'<p class="ops">ops: {op_links}</p>{nb_html}{er_html}</li>')

    def topic_notebooks(self, t, note):
        names = {n for e in t.entries for n in e.names}
        scored = []
        for nb in self.m.notebooks:
            uses = sum(len(used & names) for used in nb.names)
            if not uses:
                continue
            cites = note is not None and any(r.note == note for r in nb.refs)
            scored.append((uses + (5 if cites else 0), nb))
        scored.sort(key=lambda x: -x[0])
        return [nb for _, nb in scored[:2]]

    def errata_html(self):
        rows = []
        for er in self.m.errata:
            t = self.test_by_key.get((er.test_file, er.test_name))
            url = self.test_url(t) if t else None
            src = self.test_source(t) if t is not None else ""
            test_link = (f'<a href="{_e(url)}"><code>{_e(er.test)}</code></a>' if url else f"<code>{_e(er.test)}</code>")
            topic = (f' · topic: <a href="{self.topic_page(er.module)}">{_e(er.module)}.py</a>'
                     if er.module else "")
            rows.append(f'<article class="erratum" id="erratum-{er.index}" data-nav tabindex="-1">'
                        f'<h2><span class="no">{er.index}</span> <span class="ref">{_e(er.where)}</span></h2>'
                        f'<div class="says-correct"><div class="says"><h4>the notes say</h4>'
                        f"<p>{self.errata_text(er.says)}</p></div>"
                        f'<div class="correct"><h4>correct</h4><p>{self.errata_text(er.correct)}</p></div></div>'
                        f'<p class="shown-by">shown by {test_link}{topic}</p>{src}</article>')
            self.find(f"erratum {er.index}: {er.where}", "erratum", _plain(er.says)[:80],
                      f"errata.html#erratum-{er.index}")
        side = '<h3>errata</h3><ol class="toc">' + "".join(
            f'<li><a href="#erratum-{er.index}">{er.index}. {_e(er.where[:34])}</a></li>' for er in self.m.errata) + "</ol>"
        body = ("<h1>Errata: where the notes are wrong</h1>"
                "<p class=\"lead\">The code follows the correct math. Each entry says what the notes say, "
                "what is correct, and the test that shows it (its source is below each entry).</p>"
                + "".join(rows))
        return side, body

    def errata_text(self, text):
        """An errata cell: code spans that are formulas are drawn as math."""
        def code(body):
            if re.search(r"\b(?:tests?/|torch\.|np\.)|\.py\b", body) or not re.search(r"[=^/()_*]", body):
                return self.code_link(body)
            return self.inline_math(body)
        return md_inline(text, code=code)

    def test_source(self, t):
        text = self.m.test_sources.get(t.file, "")
        tree = self._tree(t.file)
        if tree is None:
            return ""
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == t.name.split(".")[-1] \
                    and node.lineno == t.line:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                lines = text.splitlines()[start - 1:node.end_lineno]
                code = textwrap.dedent("\n".join(lines))
                return (f'<details class="test-src"><summary>the test, {_e(t.file)} line {start}</summary>'
                        f"{highlight_block(code, linker=self.linker)}</details>")
        return ""

    def api_html(self):
        groups = {}
        for name, obj, mod in self.m.public:
            groups.setdefault(mod, []).append((name, obj))
        order = [f"numpytfmr.{t.module}" for t in self.m.topics]
        mods = sorted(groups, key=lambda m: (order.index(m) if m in order else len(order), m))
        sections = []
        for mod in mods:
            items = [self.api_item(name, obj, mod) for name, obj in groups[mod]]
            short = mod.split(".", 1)[-1]
            link = (f' <a class="to-topic" href="{self.topic_page(short)}">{_e(short)}.py: equations and source</a>'
                    if short in self.topic_of else "")
            sections.append(f'<section class="api-module" id="api-{_e(mod)}"><h2><code>{_e(mod)}</code>{link}</h2>'
                            + "".join(items) + "</section>")
        side = '<h3>modules</h3><ol class="toc">' + "".join(
            f'<li><a href="#api-{_e(m)}">{_e(m.split(".", 1)[-1])}</a> <span class="muted">{len(groups[m])}</span></li>'
            for m in mods) + "</ol>"
        total = len(self.m.public)
        body = (f"<h1>API reference</h1><p class=\"lead\">Every public name of <code>numpytfmr</code> "
                f"({total} names: <code>dir(numpytfmr)</code> without the underscored names and the "
                f"submodules), with its signature and its contract: the first paragraph of its docstring "
                f"and, for an op, the shapes and options its contract declares. The rules they all follow "
                f'are in <a href="contract.html">the API contract</a>.</p>' + "".join(sections))
        return side, body

    def api_item(self, name, obj, mod):
        if inspect.isfunction(obj) or inspect.isclass(obj):
            sig = self.signature(obj)
            kind = "class" if inspect.isclass(obj) else "function"
        else:
            sig = f"{name} = {_short_repr(obj)}"
            kind = "constant"
        doc = inspect.getdoc(obj) if kind != "constant" else ""
        first = (doc or "").split("\n\n")[0].strip()
        contract = getattr(obj, "__contract__", None)
        lines = contract.lines() if contract is not None else []
        forward = getattr(obj, "forward", None)
        if not lines and callable(forward) and getattr(forward, "__contract__", None) is not None:
            lines = [f"backward of {forward.__name__}: (dout, cache) -> one gradient per input"]
        links = []
        topic_url = self.urls.get(name)
        if topic_url and not topic_url.startswith("api.html"):
            links.append(f'<a href="{_e(topic_url)}">equations and source</a>')
        anchor = self.contract_anchor.get(name)
        if anchor:
            links.append(f'<a href="contract.html#{_e(anchor)}">in the contract</a>')
        if kind != "constant":
            self.find(name, kind if name not in self.op_names else "op", mod.split(".", 1)[-1],
                      f"api.html#api-{name}")
        contract_html = ("<ul class=\"contract\">" + "".join(f"<li><code>{_e(l)}</code></li>" for l in lines)
                         + "</ul>") if lines else ""
        return (f'<div class="api-item" id="api-{_e(name)}" data-nav tabindex="-1">'
                f'<h3><code class="sig">{_e(sig)}</code> <span class="kind">{kind}</span></h3>'
                + (f'<p>{self.doc_inline(" ".join(first.split()))}</p>' if first else "")
                + contract_html
                + (f'<p class="links">{" · ".join(links)}</p>' if links else "") + "</div>")

    def _contract_anchors(self):
        """public name -> the id of the contract.md section that first mentions it."""
        out, ids, heading = {}, {}, None
        for line in self.m.contract_md.splitlines():
            h = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if h:
                base = slugify(h.group(2).replace("`", ""))
                n = ids.get(base, 0)
                ids[base] = n + 1
                heading = base if n == 0 else f"{base}-{n}"
                continue
            if heading:
                for name in re.findall(r"`([A-Za-z_]\w*)", line):
                    out.setdefault(name, heading)
        return out

    def contract_html(self):
        def link(href):
            if href.startswith("#") or href.startswith("http"):
                return href
            m = re.search(r"numpytfmr/(\w+)\.py$", href)
            if m and m.group(1) in self.topic_of:
                return self.topic_page(m.group(1))
            if href.endswith("README.md"):
                return "index.html"
            return None
        body = markdown_to_html(self.m.contract_md, link=link, code=self.code_link)
        heads = re.findall(r'<h2 id="([^"]+)">(.*?)<a class="anchor"', body)
        side = '<h3>sections</h3><ol class="toc">' + "".join(
            f'<li><a href="#{i}">{re.sub(r"<[^>]+>", "", t)}</a></li>' for i, t in heads) + "</ol>"
        self.find("API contract", "page", "docs/contract.md", "contract.html")
        for i, t in heads:
            self.find(re.sub(r"<[^>]+>", "", html.unescape(t)), "contract", "docs/contract.md",
                      f"contract.html#{i}")
        return side, f'<article class="markdown">{body}</article>'

    def notebook_html(self, nb):
        cells = []
        n_code = 0
        for i, ((kind, src), _) in enumerate(zip(nb.cells, nb.names), 1):
            if kind == "markdown":
                inner = markdown_to_html(src, link=self._nb_link, code=self.code_link)
                cells.append(f'<div class="cell md" id="cell-{i}" data-nav tabindex="-1">'
                             f'<a class="cell-no" href="#cell-{i}">{i}</a>{inner}</div>')
            elif kind == "code":
                n_code += 1
                outputs = nb.outputs[i - 1] if nb.outputs is not None and i <= len(nb.outputs) else []
                cells.append(f'<div class="cell code-cell" id="cell-{i}" data-nav tabindex="-1">'
                             f'<a class="cell-no" href="#cell-{i}">{i}</a>'
                             f"{highlight_block(src, linker=self.linker)}{_outputs_html(outputs)}</div>")
            else:
                cells.append(f'<div class="cell raw" id="cell-{i}"><pre class="code">{_e(src)}</pre></div>')
        side = (f'<h3>notebook</h3><p class="muted">{_e(nb.stem)}.ipynb, {len(nb.cells)} cells '
                f"({n_code} code)</p>" + '<h3>notebooks</h3><ol class="toc">' + "".join(
                    f'<li><a href="{self.nb_pages[o.stem]}">{_e(o.stem)}</a></li>' for o in self.m.notebooks) + "</ol>")
        run = ("executed when the site was built" if nb.outputs is not None else
               f"not executed ({_e(nb.error)})" if nb.error else
               "not executed (build with the docs extra installed to see the outputs)")
        body = (f'<p class="nb-file">notebooks/{_e(nb.stem)}.ipynb, read-only, {run}; run it '
                f"with Jupyter: docs/notebooks.md says how</p>" + "".join(cells))
        return side, body

    def _nb_link(self, href):
        if href.startswith(("#", "http")):
            return href
        m = re.search(r"([\w-]+)\.ipynb", href)
        if m and m.group(1) in self.nb_pages:
            return self.nb_pages[m.group(1)]
        return None

    def _tree(self, file):
        """A test file parsed (once), or None when it does not parse."""
        if file not in self._trees:
            try:
                self._trees[file] = ast.parse(self.m.test_sources.get(file, ""))
            except SyntaxError:
                self._trees[file] = None
        return self._trees[file]

    def test_file_html(self, name, text):
        defs = {}
        for node in getattr(self._tree(name), "body", []):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[node.lineno] = node.name
            for sub in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defs[sub.lineno] = f"{node.name}.{sub.name}"
        lines = highlight_lines(text, linker=self.linker)
        rows = []
        for no, line in enumerate(lines, 1):
            code = line.code + ("" if line.comment is None else
                                ("" if line.full_comment else "  ") + f'<span class="com">#{_e(line.comment)}</span>')
            anchor = defs.get(no)
            attrs = f' id="{_e(anchor)}" data-nav tabindex="-1"' if anchor and anchor.split(".")[-1].startswith("test") else (
                f' id="{_e(anchor)}"' if anchor else "")
            rows.append(f'<span class="fl"{attrs}><span class="no">{no}</span>{code}</span>')
        side = '<h3>tests</h3><ol class="toc">' + "".join(
            f'<li><a href="#{_e(n)}">{_e(n)}</a></li>' for n in defs.values() if n.split(".")[-1].startswith("test")
        ) + "</ol>"
        body = (f"<h1><code>tests/{_e(name)}</code></h1>"
                f'<pre class="code file"><code>{chr(10).join(rows)}</code></pre>')
        return side, body


def _short_repr(v, limit=160):
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 1] + "…"


def _plain(md):
    return re.sub(r"[`*_]", "", md or "")
