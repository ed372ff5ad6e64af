"""The reader's style sheet and script, written into ``assets/`` of every site.

They live here as strings (not as package data files) so that an installed package builds
the same site as a checkout. No font, script or style is fetched from anywhere: the math is
MathML, drawn by the browser with its own math font.
"""

__all__ = ["CSS", "JS"]

CSS = r"""
:root {
  --bg: #fdfdfb; --fg: #1d232b; --muted: #5f6b76; --faint: #eef0ee; --border: #d9ddd8;
  --accent: #1f5fa8; --accent-bg: #e6eef8; --code-bg: #f5f6f2; --code-fg: #1d232b;
  --kw: #8a2f9e; --str: #2e7d32; --num: #b35900; --com: #6a737d; --fn: #1f5fa8; --dec: #a0522d;
  --bi: #00737a; --doc: #6a8a4f; --hl: #fff1b8; --hl-border: #e0b400; --ann-bg: #f8f6ee;
  --ref-bg: #eef3ec; --ref-fg: #385a2e; --op: #4a5560; --shadow: 0 2px 10px rgba(0,0,0,.08);
  color-scheme: light;
}
:root[data-theme="dark"] {
  --bg: #14171b; --fg: #dfe3e8; --muted: #98a3ae; --faint: #1d2228; --border: #2f363e;
  --accent: #7fb2ee; --accent-bg: #1d2a3a; --code-bg: #1a1e23; --code-fg: #dfe3e8;
  --kw: #d69ce8; --str: #98c98a; --num: #f0a35e; --com: #8b949e; --fn: #7fb2ee; --dec: #e0a070;
  --bi: #6cc7c7; --doc: #9dbb7e; --hl: #3d3517; --hl-border: #b8941f; --ann-bg: #1c2026;
  --ref-bg: #1e2a1f; --ref-fg: #a5d096; --op: #b3bcc5; --shadow: 0 2px 12px rgba(0,0,0,.5);
  color-scheme: dark;
}
@media (prefers-color-scheme: dark) {
  :root:not([data-theme="light"]) {
    --bg: #14171b; --fg: #dfe3e8; --muted: #98a3ae; --faint: #1d2228; --border: #2f363e;
    --accent: #7fb2ee; --accent-bg: #1d2a3a; --code-bg: #1a1e23; --code-fg: #dfe3e8;
    --kw: #d69ce8; --str: #98c98a; --num: #f0a35e; --com: #8b949e; --fn: #7fb2ee; --dec: #e0a070;
    --bi: #6cc7c7; --doc: #9dbb7e; --hl: #3d3517; --hl-border: #b8941f; --ann-bg: #1c2026;
    --ref-bg: #1e2a1f; --ref-fg: #a5d096; --op: #b3bcc5; --shadow: 0 2px 12px rgba(0,0,0,.5);
    color-scheme: dark;
  }
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; scroll-padding-top: 4.2rem; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code, pre, kbd { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: .86em; }
:not(pre) > code { background: var(--code-bg); padding: .05em .3em; border-radius: 3px; }
kbd { border: 1px solid var(--border); border-bottom-width: 2px; border-radius: 4px; padding: 0 .35em;
  background: var(--faint); }
math { font-family: "STIX Two Math", "Latin Modern Math", "Cambria Math", "DejaVu Math TeX Gyre", math;
  font-size: 1.08em; }
math mtext.code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .85em; }
math mtext.ref { font-family: system-ui, sans-serif; font-size: .72em; color: var(--ref-fg); }
.skip { position: absolute; left: -999px; }
.skip:focus { left: 1rem; top: .5rem; z-index: 20; background: var(--bg); padding: .3rem .6rem; }
.muted { color: var(--muted); font-size: .9em; }

/* header */
header.top { position: sticky; top: 0; z-index: 10; display: flex; align-items: center; gap: 1rem;
  padding: .55rem 1.2rem; background: var(--bg); border-bottom: 1px solid var(--border); }
.brand { font-weight: 700; color: var(--fg); white-space: nowrap; }
.brand span { font-weight: 400; color: var(--muted); }
.main-nav { display: flex; gap: .9rem; }
.main-nav a { color: var(--muted); }
.main-nav a:hover { color: var(--accent); }
.search { position: relative; flex: 1; max-width: 30rem; margin-left: auto; }
#search { width: 100%; padding: .4rem .7rem; border: 1px solid var(--border); border-radius: 6px;
  background: var(--faint); color: var(--fg); font: inherit; font-size: .92rem; }
#search:focus { outline: 2px solid var(--accent); background: var(--bg); }
#search-results { position: absolute; right: 0; left: 0; top: 2.4rem; margin: 0; padding: .3rem 0;
  list-style: none; background: var(--bg); border: 1px solid var(--border); border-radius: 6px;
  box-shadow: var(--shadow); max-height: 70vh; overflow: auto; }
#search-results li a { display: block; padding: .3rem .7rem; color: var(--fg); }
#search-results li a .k { float: right; color: var(--muted); font-size: .8em; margin-left: .6rem; }
#search-results li a .d { display: block; color: var(--muted); font-size: .8em; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
#search-results li.active a, #search-results li a:hover { background: var(--accent-bg); text-decoration: none; }
#search-results li.none { padding: .3rem .7rem; color: var(--muted); }
#theme-toggle { border: 1px solid var(--border); background: var(--faint); color: var(--fg);
  border-radius: 6px; padding: .25rem .55rem; cursor: pointer; font-size: 1rem; line-height: 1.2; }
#theme-toggle .moon { display: none; }
:root[data-theme="dark"] #theme-toggle .moon { display: inline; }
:root[data-theme="dark"] #theme-toggle .sun { display: none; }
@media (prefers-color-scheme: dark) {
  :root:not([data-theme="light"]) #theme-toggle .moon { display: inline; }
  :root:not([data-theme="light"]) #theme-toggle .sun { display: none; }
}

/* layout */
.layout { display: grid; grid-template-columns: 13rem minmax(0, 1fr); }
nav.side { position: sticky; top: 3.1rem; align-self: start; max-height: calc(100vh - 3.1rem);
  overflow: auto; padding: 1rem .8rem 2rem 1.2rem; border-right: 1px solid var(--border); font-size: .88rem; }
nav.side h3 { font-size: .75rem; text-transform: uppercase; letter-spacing: .06em; color: var(--muted);
  margin: 1rem 0 .3rem; }
nav.side ol { list-style: none; margin: 0; padding: 0; }
nav.side li { padding: .08rem 0; }
nav.side a.current { font-weight: 700; }
nav.side .dot { color: var(--accent); font-size: .6em; vertical-align: middle; }
main { min-width: 0; padding: 1rem 1.6rem 4rem; }
footer { display: flex; flex-wrap: wrap; justify-content: space-between; gap: .5rem;
  padding: .8rem 1.2rem; border-top: 1px solid var(--border); color: var(--muted); font-size: .82rem; }
h1 { font-size: 1.75rem; margin: .6rem 0 .4rem; }
h2 { font-size: 1.3rem; }
h4 { font-size: .78rem; text-transform: uppercase; letter-spacing: .05em; color: var(--muted);
  margin: .9rem 0 .35rem; }
.lead { font-size: 1.05rem; max-width: 60rem; }
.ref { display: inline-block; background: var(--ref-bg); color: var(--ref-fg); border-radius: 3px;
  padding: 0 .35em; font-size: .82em; white-space: nowrap; }
.what { color: var(--muted); margin: .2rem 0; }
.refs .ref, .entry-head .ref, .topic h3 .ref, .erratum h2 .ref { white-space: normal; }
.anchor { margin-left: .4rem; color: var(--border); font-weight: 400; }
h1:hover .anchor, h2:hover .anchor, h3:hover .anchor { color: var(--muted); }

/* an entry: math beside code */
.entry { border-top: 1px solid var(--border); padding: 1rem 0 1.4rem; margin-top: 1rem; outline: none; }
.api-item.current, .erratum.current, .topic.current, .cell.current, .fl.current {
  box-shadow: inset 3px 0 0 var(--accent); }
.entry.current, .entry:target { box-shadow: -.7rem 0 0 -.4rem var(--accent); }
.entry-head { display: flex; flex-wrap: wrap; align-items: baseline; gap: .5rem .8rem; }
.entry-head h2 { margin: 0; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 1.25rem; }
.entry-head h2 a { color: var(--fg); }
.kind { font-size: .75rem; color: var(--muted); border: 1px solid var(--border); border-radius: 10px;
  padding: 0 .5rem; }
.kind-op { color: var(--accent); border-color: var(--accent); }
.pair { display: grid; grid-template-columns: minmax(0, 3.5fr) minmax(0, 6.5fr); gap: 1.2rem; margin-top: .6rem;
  align-items: start; }
.math-col { min-width: 0; }
.code-col { min-width: 0; display: flex; flex-direction: column; gap: .9rem; }
.summary { font-size: 1.02rem; margin: .2rem 0 .6rem; }
.sig code { font-size: .8rem; color: var(--muted); background: none; padding: 0; white-space: pre-wrap;
  word-break: break-word; }
.eqs { margin: .5rem 0 .8rem; padding: .45rem .8rem; background: var(--ann-bg); border-radius: 6px;
  overflow-x: auto; border-left: 3px solid var(--border); }
.eq { padding: .18rem .1rem; border-radius: 4px; display: flex; flex-wrap: wrap; align-items: baseline;
  column-gap: 2.2em; row-gap: .2rem; }
.eq .seg { display: inline-flex; flex-wrap: wrap; align-items: baseline; column-gap: .35em; max-width: 100%; }
.eq math[display="block"] { display: block math; width: fit-content; margin: 0; }
.ann { display: flex; flex-wrap: wrap; align-items: baseline; column-gap: 1.2em; }
.eq.hl, .ln.hl { background: var(--hl); box-shadow: inset 3px 0 0 var(--hl-border); }
.contract ul, ul.contract { margin: .2rem 0 .5rem; padding-left: 1.1rem; }
.contract li { font-size: .95em; }
.doc p { margin: .45rem 0; }
.defs { margin: .5rem 0; }
.def { margin: .25rem 0; padding-left: 1.2rem; text-indent: -1.2rem; }
.def * { text-indent: 0; }
.def .term { font-weight: 600; }
.shapes code { white-space: pre-wrap; display: block; background: var(--code-bg); padding: .35rem .6rem;
  border-radius: 4px; text-indent: 0; }
.backward-doc { margin-top: 1rem; border-top: 1px dashed var(--border); }
.backward-doc h4 code { text-transform: none; letter-spacing: 0; }

/* source with its annotation column */
.src { border: 1px solid var(--border); border-radius: 6px; background: var(--code-bg); overflow-x: auto; }
.src-head { display: flex; justify-content: space-between; gap: 1rem; padding: .25rem .7rem;
  border-bottom: 1px solid var(--border); font-size: .78rem; color: var(--muted); position: sticky; left: 0; }
.src-head .label { text-transform: uppercase; letter-spacing: .05em; font-weight: 600; }
.lines { padding: .3rem 0; }
.ln { display: grid; grid-template-columns: 2.8rem minmax(0, var(--code-w, 60ch)) minmax(12rem, 1fr);
  align-items: center; min-height: 1.45rem; }
.ln .no, .fl .no { color: var(--muted); opacity: .6; text-align: right; padding-right: .6rem;
  font: .75rem ui-monospace, Menlo, Consolas, monospace; user-select: none; }
.ln code { white-space: pre-wrap; overflow-wrap: anywhere; color: var(--code-fg); font-size: .8rem;
  background: none; padding: 0 0 0 4ch; text-indent: -4ch; }
.ln .ann { padding: .05rem .6rem; border-left: 2px solid transparent; min-height: 1.3rem; font-size: .92rem; }
.ln.paired .ann { border-left-color: var(--accent); background: var(--ann-bg); }
.ln.paired:hover, .ln.paired.hl { background: var(--hl); }
.ln.full code { grid-column: 2 / 4; white-space: pre-wrap; }
.ann-text { color: var(--muted); font-size: .85rem; font-style: italic; }
.ann math { font-size: 1em; }
.kw { color: var(--kw); } .str { color: var(--str); } .num { color: var(--num); }
.com { color: var(--com); font-style: italic; } .fn { color: var(--fn); font-weight: 600; }
.dec { color: var(--dec); } .bi { color: var(--bi); } .ds { color: var(--doc); } .op { color: var(--op); }
.sf { color: var(--kw); font-style: italic; }
a.ref-link { color: inherit; border-bottom: 1px dotted var(--accent); }
a.ref-link:hover { text-decoration: none; color: var(--accent); }
pre.code { background: var(--code-bg); border: 1px solid var(--border); border-radius: 6px; padding: .6rem .8rem;
  overflow-x: auto; line-height: 1.45; margin: .4rem 0; }
pre.code code { font-size: .82rem; }

/* extras: check call, tests, notebooks */
.extras { display: grid; grid-template-columns: minmax(0, 7fr) minmax(0, 5fr); gap: 0 1.4rem; margin-top: .6rem; }
.extras .check { grid-row: span 2; position: relative; }
.extras ul { margin: .2rem 0; padding-left: 1.1rem; font-size: .86rem; }
.extras li { overflow-wrap: anywhere; }
.copy { position: absolute; right: .5rem; top: 2.2rem; z-index: 1; font-size: .75rem; padding: .1rem .5rem;
  border: 1px solid var(--border); border-radius: 4px; background: var(--bg); color: var(--fg); cursor: pointer; }
.copy.done { color: var(--str); border-color: var(--str); }

/* index */
.chapter { margin-top: 2rem; }
.chapter > h2 { border-bottom: 2px solid var(--border); padding-bottom: .3rem; }
.note-no { display: inline-block; background: var(--accent); color: var(--bg); border-radius: 4px;
  padding: 0 .45rem; margin-right: .3rem; font-family: ui-monospace, Menlo, monospace; }
ol.topics { list-style: none; padding: 0; margin: 0; display: grid;
  grid-template-columns: repeat(auto-fill, minmax(22rem, 1fr)); gap: .8rem; }
.topic { border: 1px solid var(--border); border-radius: 8px; padding: .6rem .9rem; outline: none; }
.topic h3 { margin: 0 0 .2rem; font-size: 1.02rem; }
.topic p { margin: .25rem 0; font-size: .9rem; }
.topic .ops a.op { font-weight: 600; }
.chapter-errata { font-size: .9rem; }

/* errata */
.erratum { border-top: 1px solid var(--border); padding: .8rem 0 1rem; outline: none; }
.erratum h2 { margin: 0 0 .4rem; font-size: 1.05rem; }
.erratum h2 .no { color: var(--muted); margin-right: .3rem; }
.says-correct { display: grid; grid-template-columns: 1fr 1fr; gap: 1.2rem; }
.says { border-left: 3px solid #c0392b; padding-left: .8rem; }
.correct { border-left: 3px solid #2e7d32; padding-left: .8rem; }
.says p, .correct p { margin: .2rem 0; }
.shown-by { font-size: .9rem; }
.inline-math { padding: 0 .1em; }
details.test-src summary { cursor: pointer; color: var(--muted); font-size: .88rem; }

/* api */
.api-module h2 { border-bottom: 1px solid var(--border); padding-bottom: .3rem; margin-top: 2rem; }
.api-module h2 .to-topic { font-size: .8rem; font-weight: 400; margin-left: .6rem; }
.api-item { padding: .45rem 0 .55rem .6rem; border-bottom: 1px dashed var(--border); outline: none; }
.api-item h3 { font-size: .95rem; margin: 0; font-weight: 400; }
.api-item code.sig { white-space: pre-wrap; word-break: break-word; background: none; padding: 0; font-weight: 600; }
.api-item p { margin: .2rem 0; font-size: .92rem; }
.api-item .links { font-size: .84rem; }

/* markdown, notebooks, test files */
.markdown { max-width: 60rem; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid var(--border); padding: .3rem .55rem; vertical-align: top; text-align: left; }
th { background: var(--faint); }
.cell { position: relative; padding: .2rem 0 .2rem 3rem; outline: none; }
.cell-no { position: absolute; left: 0; top: .6rem; width: 2.4rem; text-align: right; color: var(--muted);
  font: .75rem ui-monospace, Menlo, monospace; }
.cell.md { max-width: 60rem; }
.display-math { overflow-x: auto; margin: .5rem 0; }
.output { margin: .2rem 0 .6rem; padding-left: .6rem; border-left: 3px solid var(--border); }
.output pre.out { margin: .3rem 0; font-size: .78rem; white-space: pre-wrap; overflow-wrap: anywhere;
  background: none; border: 0; padding: 0; }
.output pre.err { color: var(--muted); }
.output img.figure { display: block; max-width: 100%; height: auto; margin: .4rem 0;
  background: #fff; border-radius: 4px; }
.math.block { display: flex; flex-wrap: wrap; justify-content: center; align-items: baseline;
  column-gap: .3em; row-gap: .35rem; margin: .6rem 0; }
pre.file { padding: .5rem 0; }
pre.file .fl { display: block; padding-right: 1rem; outline: none; }
pre.file .fl:target, .cell:target, .api-item:target, .topic:target { background: var(--accent-bg); }
.erratum:target { box-shadow: inset 3px 0 0 var(--accent); }
.fl .no { display: inline-block; width: 3.6rem; }
.nb-file { color: var(--muted); font-size: .9rem; }

/* narrow screens: the code goes below the math */
@media (max-width: 1100px) {
  .extras { grid-template-columns: minmax(0, 1fr); }
  .extras .check { grid-row: auto; }
}
@media (max-width: 900px) {
  .layout { grid-template-columns: minmax(0, 1fr); }
  nav.side { display: none; }
  .pair { grid-template-columns: minmax(0, 1fr); }
  main { padding: .8rem .9rem 3rem; }
  header.top { flex-wrap: wrap; gap: .4rem .8rem; padding: .5rem .8rem; }
  .search { order: 3; flex-basis: 100%; max-width: none; }
  .says-correct { grid-template-columns: 1fr; }
  ol.topics { grid-template-columns: minmax(0, 1fr); }
  .cell { padding-left: 0; }
  .cell-no { position: static; display: block; text-align: left; }
  html { scroll-padding-top: 6.5rem; }
}
@media (max-width: 700px) {
  /* a phone: each comment's math goes under its line, and long lines scroll */
  .lines { min-width: max-content; }
  .ln { grid-template-columns: 2.4rem max-content; }
  .ln code { white-space: pre; overflow-wrap: normal; padding-left: 0; text-indent: 0; }
  .ln .ann { grid-column: 2; justify-self: start; margin: 0 0 .2rem 1.5rem; }
  .ln .ann:empty, .ln.doc .ann { display: none; }
  .ln.full code { grid-column: 2; white-space: pre; }
}
@media print {
  header.top, nav.side, footer, .copy { display: none; }
  .layout { grid-template-columns: 1fr; }
}
"""

JS = r"""
(function () {
  "use strict";
  var root = document.documentElement;

  // ---- theme: the system's by default, a choice kept in localStorage ----
  function effectiveTheme() {
    var t = root.getAttribute("data-theme");
    if (t) return t;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }
  function toggleTheme() {
    var next = effectiveTheme() === "dark" ? "light" : "dark";
    root.setAttribute("data-theme", next);
    try { localStorage.setItem("numpytfmr-theme", next); } catch (e) { /* storage may be off */ }
  }
  var toggle = document.getElementById("theme-toggle");
  if (toggle) toggle.addEventListener("click", toggleTheme);

  // ---- search over the embedded index ----
  var data = [];
  var holder = document.getElementById("search-index");
  if (holder) { try { data = JSON.parse(holder.textContent); } catch (e) { data = []; } }
  var input = document.getElementById("search");
  var list = document.getElementById("search-results");
  var active = -1, shown = [];
  var kindRank = { op: 0, pair: 1, "function": 2, "class": 3, backward: 4, topic: 5, note: 6,
                   erratum: 7, notebook: 8, constant: 9, contract: 10, page: 11 };
  function score(item, terms, q) {
    var name = item.n.toLowerCase();
    var hay = (item.n + " " + item.d + " " + item.s).toLowerCase();
    for (var i = 0; i < terms.length; i++) { if (hay.indexOf(terms[i]) < 0) return -1; }
    var s = 0;
    if (name === q) s += 100;
    else if (name.indexOf(q) === 0) s += 60;
    else if (name.indexOf(q) >= 0) s += 30;
    if ((" " + item.s.toLowerCase() + " ").indexOf(" " + q + " ") >= 0) s += 25;
    if (item.d.toLowerCase().indexOf(q) >= 0) s += 10;
    return s + 10 - Math.min(10, kindRank[item.k] === undefined ? 10 : kindRank[item.k]);
  }
  function render() {
    list.innerHTML = "";
    if (!shown.length) {
      var li = document.createElement("li"); li.className = "none"; li.textContent = "nothing found";
      list.appendChild(li); return;
    }
    shown.forEach(function (item, i) {
      var li = document.createElement("li");
      li.setAttribute("role", "option");
      if (i === active) li.className = "active";
      var a = document.createElement("a"); a.href = item.u;
      var k = document.createElement("span"); k.className = "k"; k.textContent = item.k;
      a.appendChild(k); a.appendChild(document.createTextNode(item.n));
      if (item.d) { var d = document.createElement("span"); d.className = "d"; d.textContent = item.d; a.appendChild(d); }
      li.appendChild(a); list.appendChild(li);
    });
  }
  function runSearch() {
    var q = input.value.trim().toLowerCase();
    if (!q) { list.hidden = true; shown = []; return; }
    var terms = q.split(/\s+/);
    var scored = [];
    data.forEach(function (item) { var s = score(item, terms, q); if (s >= 0) scored.push([s, item]); });
    scored.sort(function (a, b) { return b[0] - a[0] || a[1].n.length - b[1].n.length; });
    shown = scored.slice(0, 15).map(function (x) { return x[1]; });
    active = shown.length ? 0 : -1;
    list.hidden = false;
    render();
  }
  if (input && list) {
    input.addEventListener("input", runSearch);
    input.addEventListener("focus", function () { if (input.value.trim()) runSearch(); });
    input.addEventListener("keydown", function (ev) {
      if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
        if (!shown.length) return;
        ev.preventDefault();
        active = (active + (ev.key === "ArrowDown" ? 1 : -1) + shown.length) % shown.length;
        render();
      } else if (ev.key === "Enter") {
        if (active >= 0 && shown[active]) { ev.preventDefault(); window.location.href = shown[active].u; list.hidden = true; }
      } else if (ev.key === "Escape") {
        input.value = ""; list.hidden = true; input.blur();
      }
    });
    document.addEventListener("click", function (ev) {
      if (!list.contains(ev.target) && ev.target !== input) list.hidden = true;
    });
  }

  // ---- keyboard: j / k between entries, / to search, t for the theme ----
  function items() { return Array.prototype.slice.call(document.querySelectorAll("[data-nav]")); }
  function currentIndex(all) {
    var cur = document.querySelector("[data-nav].current");
    if (cur) return all.indexOf(cur);
    var y = 80, best = -1;
    for (var i = 0; i < all.length; i++) { if (all[i].getBoundingClientRect().top <= y) best = i; }
    return best;
  }
  function go(step) {
    var all = items();
    if (!all.length) return;
    var i = currentIndex(all) + step;
    if (i < 0) i = 0;
    if (i >= all.length) i = all.length - 1;
    all.forEach(function (el) { el.classList.remove("current"); });
    var el = all[i];
    el.classList.add("current");
    el.focus({ preventScroll: true });
    el.scrollIntoView({ block: "start" });
    if (el.id && window.history && history.replaceState) {
      try { history.replaceState(null, "", "#" + el.id); } catch (e) { /* file: URLs may refuse */ }
    }
  }
  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    var t = ev.target;
    var typing = t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable);
    if (typing) return;
    if (ev.key === "j" || ev.key === "n") { ev.preventDefault(); go(1); }
    else if (ev.key === "k" || ev.key === "p") { ev.preventDefault(); go(-1); }
    else if (ev.key === "/" || ev.key === "s") { if (input) { ev.preventDefault(); input.focus(); input.select(); } }
    else if (ev.key === "t") { toggleTheme(); }
  });

  // ---- an equation and the code lines that compute it light up together ----
  function symbolsOf(el) { return (el.getAttribute("data-sym") || "").split(" ").filter(Boolean); }
  function highlight(el, on) {
    var entry = el.closest(".entry");
    if (!entry) return;
    var mine = symbolsOf(el);
    entry.querySelectorAll("[data-sym]").forEach(function (other) {
      var theirs = symbolsOf(other);
      var shared = mine.some(function (s) { return theirs.indexOf(s) >= 0; });
      other.classList.toggle("hl", on && shared);
    });
  }
  document.querySelectorAll(".entry [data-sym]").forEach(function (el) {
    el.addEventListener("mouseenter", function () { highlight(el, true); });
    el.addEventListener("mouseleave", function () { highlight(el, false); });
  });

  // ---- copy buttons ----
  document.querySelectorAll("button.copy").forEach(function (b) {
    b.addEventListener("click", function () {
      var src = document.getElementById(b.getAttribute("data-copy"));
      if (!src) return;
      var text = src.innerText;
      function done() { b.classList.add("done"); b.textContent = "copied"; setTimeout(function () {
        b.classList.remove("done"); b.textContent = "copy"; }, 1500); }
      function fallback() {
        var ta = document.createElement("textarea");
        ta.value = text; ta.style.position = "fixed"; ta.style.opacity = "0";
        document.body.appendChild(ta); ta.select();
        try { document.execCommand("copy"); done(); } catch (e) { /* nothing to do */ }
        document.body.removeChild(ta);
      }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, fallback);
      } else { fallback(); }
    });
  });
})();
"""
