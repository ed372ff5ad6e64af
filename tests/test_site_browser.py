"""The reader in a real browser: every page of the site loaded in headless Chromium.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it); the test skips where
``/usr/bin/chromium`` is missing, unless ``NUMPYTFMR_REQUIRE_BROWSER=1`` (set by CI) makes
that a failure. Chromium is driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: NUL-separated JSON on file descriptors 3 and 4), so nothing
is downloaded and no driver is needed. Checked on every page: no console error and no
uncaught exception, every math element drawn with a non-zero size, no raw TeX in the text,
and no equation wider than its column (a box whose scrollWidth exceeds its clientWidth, or
math reaching past its box) at 1400 px and at 400 px; on every topic page, the math and
code columns side by side at 1400 px and stacked at 400 px; on every notebook page, the
executed outputs and figures; and on one page, the search box, the keyboard navigation and
the theme switch.
"""
import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

pytest.importorskip("markdown_it", reason="the reader needs the docs extra (pip install \".[docs]\")")

REPO = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)),
                None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--disable-dev-shm-usage",
         "--remote-debugging-pipe"]


class Browser:
    """A headless Chromium and one page, driven over the DevTools protocol on a pipe."""

    def __init__(self, executable, timeout=120.0):     # generous: the machine may be busy
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="numpytfmr-chromium-")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Chromium reads commands from fd 3 and writes replies to fd 4: park the child's ends on
        # high close-on-exec descriptors, and let the child put them on 3 and 4 before exec
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200) for fd in (to_chrome_r, from_chrome_w)]
        for fd in (to_chrome_r, from_chrome_w):
            os.close(fd)

        def child_fds():
            os.dup2(hi[0], 3)                  # os.dup2 makes them inheritable
            os.dup2(hi[1], 4)

        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=child_fds)
        for fd in hi:
            os.close(fd)
        self.out = os.fdopen(to_chrome_w, "wb", buffering=0)
        self.inp = os.fdopen(from_chrome_r, "rb", buffering=0)
        self.next_id = 0
        self.replies, self.events = {}, []
        self.lock = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = self.inp.read(65536)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                with self.lock:
                    self.replies[None] = "closed"
                    self.lock.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self.lock:
                    if "id" in msg:
                        self.replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self.lock.notify_all()

    def call(self, method, session=False, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self.lock:
            while self.next_id not in self.replies:
                if None in self.replies:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to {method} in {self.timeout} s")
                self.lock.wait(left)
            reply = self.replies.pop(self.next_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def take_events(self):
        with self.lock:
            events, self.events = self.events, []
        return events

    def wait_event(self, method, since):
        deadline = time.monotonic() + self.timeout
        with self.lock:
            while True:
                for ev in self.events[since:]:
                    if ev.get("method") == method:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} in {self.timeout} s")
                self.lock.wait(left)

    def set_width(self, width, height=900):
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def open(self, url):
        with self.lock:
            since = len(self.events)
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired", since)

    def js(self, expression):
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:60]}...: {res['exceptionDetails']}")
        return res["result"].get("value")

    def key(self, key, code=None, text=None):
        text = key if text is None and len(key) == 1 else text
        for kind in ("keyDown", "keyUp"):
            params = {"type": kind, "key": key, "code": code or (f"Key{key.upper()}" if len(key) == 1 else key)}
            if text and kind == "keyDown":
                params["text"] = text
            self.call("Input.dispatchKeyEvent", session=True, **params)

    def errors(self):
        """Console errors and uncaught exceptions since the last call."""
        out = []
        for ev in self.take_events():
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                  for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + str(d.get("exception", {}).get("description", d.get("text"))))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                out.append(f"log: {e.get('text')} {e.get('url', '')}")
        return out

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self.out, self.inp):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("NUMPYTFMR_REQUIRE_BROWSER") == "1":
            pytest.fail("NUMPYTFMR_REQUIRE_BROWSER=1 but /usr/bin/chromium is missing")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    b = Browser(CHROMIUM)
    yield b
    b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from numpytfmr.site import build_site
    return build_site(tmp_path_factory.mktemp("site") / "site", source=REPO)


RAW_TEX = re.compile(r"\\(?:frac|sqrt|mathrm|mathbf|operatorname|begin|left|right|sum|alpha|beta|"
                     r"sigma|theta|cdot|text|hat|quad)\b|\$\$")
# Everything measured on a page in one evaluation.
MEASURE = """(() => {
  const visible = el => { const s = getComputedStyle(el); return s.display !== 'none' && s.visibility !== 'hidden'
                          && !el.closest('details:not([open])'); };
  const maths = Array.from(document.querySelectorAll('math')).filter(visible);
  const empty = maths.filter(m => { const r = m.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); })
                     .map(m => m.outerHTML.slice(0, 160));
  const pairs = Array.from(document.querySelectorAll('.pair')).map(p => {
    const a = p.querySelector('.math-col').getBoundingClientRect();
    const b = p.querySelector('.code-col').getBoundingClientRect();
    return [a.left, a.right, a.top, a.bottom, b.left, b.right, b.top, b.bottom];
  });
  // equations that do not fit their column: a box that scrolls, or math beyond its box
  const boxes = '.eqs, .eq, .display-math, .math.block, .ann, .inline-math, .what, .doc p, .markdown p, li';
  const overflow = Array.from(document.querySelectorAll(boxes)).filter(visible)
    .filter(el => el.scrollWidth > el.clientWidth + 1 && el.querySelector('math'))
    .map(el => `${el.className || el.tagName} ${el.scrollWidth} > ${el.clientWidth}: ${el.textContent.trim().slice(0, 60)}`);
  for (const m of maths) {
    const box = m.closest('.eqs, .display-math, .math.block, .ann, .markdown, .doc, .cell') || document.body;
    const r = m.getBoundingClientRect(), b = box.getBoundingClientRect();
    if (r.right > b.right + 1 || r.left < b.left - 1)
      overflow.push(`math ${r.left.toFixed(0)}-${r.right.toFixed(0)} beyond ${b.left.toFixed(0)}-${b.right.toFixed(0)}: ${(m.getAttribute('title') || m.textContent).slice(0, 60)}`);
  }
  // TeX left in the rendered text (code listings apart)
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, math').forEach(e => e.remove());
  const text = clone.textContent;
  const figures = Array.from(document.querySelectorAll('.output img')).map(i => [i.naturalWidth, i.naturalHeight]);
  const outputs = document.querySelectorAll('.output').length;
  return {n_math: maths.length, empty, pairs, title: document.title, overflow, text, figures, outputs,
          scroll: document.documentElement.scrollWidth, width: window.innerWidth,
          theme: getComputedStyle(document.body).backgroundColor};
})()"""


def _url(site, page):
    return (site.out_dir / page).resolve().as_uri()


def _topic_pages(site):
    html = {p: (site.out_dir / p).read_text(encoding="utf-8") for p in site.pages}
    return [p for p, text in html.items() if '<div class="pair">' in text]


def _pair_problem(page, width, pairs):
    """Why the math and code columns of a page are not laid out as they should be at
    ``width`` (side by side at 1400 px, stacked at 400 px), or None."""
    for ml, mr, mt, mb, cl, cr, ct, cb in pairs:
        if width >= 1000:
            ok = mr <= cl + 0.5 and abs(mt - ct) < 2 and (mr - ml) > 200 and (cr - cl) > 300
        else:
            ok = ct >= mb - 0.5 and abs(ml - cl) < 2 and cr <= width + 0.5
        if not ok:
            return (f"{page} at {width} px: math {ml:.0f}-{mr:.0f} x {mt:.0f}-{mb:.0f}, "
                    f"code {cl:.0f}-{cr:.0f} x {ct:.0f}-{cb:.0f}")
    return None


def test_every_page_loads_without_errors_draws_its_math_and_sets_code_beside_it(browser, site):
    """At 1400 px: every page, no console error, every math element drawn; on the topic
    pages, every op's code column beside its math column."""
    browser.set_width(1400)
    topics = set(_topic_pages(site))
    assert len(topics) >= 20
    problems = []
    n_math = 0
    for page in site.pages:
        browser.open(_url(site, page))
        m = browser.js(MEASURE)
        n_math += m["n_math"]
        errs = browser.errors()
        if errs:
            problems.append(f"{page}: {errs[:3]}")
        if m["empty"]:
            problems.append(f"{page}: {len(m['empty'])} math elements of size 0, e.g. {m['empty'][0]}")
        if m["overflow"]:
            problems.append(f"{page} at 1400 px: {len(m['overflow'])} equations overflow, e.g. {m['overflow'][:3]}")
        tex = RAW_TEX.search(m["text"])
        if tex:
            problems.append(f"{page}: raw TeX {m['text'][max(0, tex.start() - 30):tex.end() + 30]!r}")
        if "numpytfmr reader" not in m["title"]:
            problems.append(f"{page}: title {m['title']!r}")
        if page in topics:
            if not m["pairs"]:
                problems.append(f"{page}: no math/code pair")
            problems.append(_pair_problem(page, 1400, m["pairs"]))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems[:20])
    assert n_math > 500, f"only {n_math} math elements on {len(site.pages)} pages"


def test_on_a_phone_the_code_goes_below_the_math(browser, site):
    """At 400 px: every page without an overflowing equation; on the topic pages the code
    goes below the math."""
    browser.set_width(400, 900)
    problems = []
    topics = set(_topic_pages(site))
    for page in site.pages:
        browser.open(_url(site, page))
        m = browser.js(MEASURE)
        assert m["width"] == 400
        errs = browser.errors()
        problems.append(errs and f"{page}: {errs[:3]}")
        if m["overflow"]:
            problems.append(f"{page} at 400 px: {len(m['overflow'])} equations overflow, e.g. {m['overflow'][:3]}")
        if page not in topics:
            continue
        problems.append(_pair_problem(page, 400, m["pairs"]) if m["pairs"] else f"{page}: no pair")
        if m["empty"]:
            problems.append(f"{page} at 400 px: {len(m['empty'])} math elements of size 0")
        if m["scroll"] > 401:
            problems.append(f"{page} at 400 px: the page is {m['scroll']} px wide")
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems[:20])


def test_search_keys_and_theme(browser, site):
    browser.set_width(1400)
    browser.call("Emulation.setEmulatedMedia", session=True,
                 features=[{"name": "prefers-color-scheme", "value": "light"}])
    browser.open(_url(site, "norms.html"))
    browser.js("localStorage.clear(); document.documentElement.removeAttribute('data-theme'); 0")
    light = browser.js(MEASURE)["theme"]
    # pointing at an equation lights up the code lines that compute it, and the other way round
    def hover(selector):
        x, y = browser.js(f"(() => {{ const el = document.querySelector('{selector}'); el.scrollIntoView("
                          "{block: 'center'}); const r = el.getBoundingClientRect();"
                          " return [r.left + 5, r.top + r.height / 2]; })()")
        browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)
        return browser.js("Array.from(document.querySelectorAll('#layernorm_forward .hl'))"
                          ".map(e => e.className + ' ' + e.textContent.replace(/\\s+/g, ' ').trim().slice(0, 40))")
    lit = hover('#layernorm_forward .eq[data-sym="mu"]')
    assert any(h.startswith("ln") and "mu = x.mean(" in h for h in lit), lit
    lit = hover('#layernorm_forward .ln[data-sym="sigma"]')
    assert any(h.startswith("eq") for h in lit), lit
    browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=1, y=1)
    browser.js("window.scrollTo(0, 0); 0")
    # j moves to the first entry, j again to the next, k back
    browser.key("j")
    first = browser.js("document.querySelector('[data-nav].current').id")
    browser.key("j")
    second = browser.js("document.querySelector('[data-nav].current').id")
    browser.key("k")
    back = browser.js("document.querySelector('[data-nav].current').id")
    assert (first, back) == ("layernorm_forward", "layernorm_forward") and second == "rmsnorm_forward"
    # / focuses the search box; typing a symbol finds the ops that use it
    browser.key("/", code="Slash")
    assert browser.js("document.activeElement.id") == "search"
    browser.call("Input.insertText", session=True, text="sigma")
    results = browser.js("Array.from(document.querySelectorAll('#search-results a')).map(a => a.textContent)")
    assert any("layernorm" in r for r in results), results
    browser.js("document.getElementById('search').value = ''; document.activeElement.blur(); 0")
    browser.call("Input.insertText", session=True, text="")
    # a section finds its op
    browser.js("const s = document.getElementById('search'); s.value = '004 eq. 27';"
               "s.dispatchEvent(new Event('input')); 0")
    first_hit = browser.js("document.querySelector('#search-results a').getAttribute('href')")
    assert first_hit.endswith("#layernorm_forward"), first_hit
    browser.js("document.getElementById('search').blur(); 0")
    # t switches the theme and the choice survives a reload
    browser.key("t")
    dark = browser.js(MEASURE)["theme"]
    assert browser.js("document.documentElement.getAttribute('data-theme')") == "dark"
    assert dark != light
    browser.open(_url(site, "index.html"))
    assert browser.js("document.documentElement.getAttribute('data-theme')") == "dark"
    browser.js("localStorage.clear(); 0")
    # the system's dark preference is followed without a stored choice
    browser.call("Emulation.setEmulatedMedia", session=True,
                 features=[{"name": "prefers-color-scheme", "value": "dark"}])
    browser.open(_url(site, "index.html"))
    assert browser.js(MEASURE)["theme"] == dark
    browser.call("Emulation.setEmulatedMedia", session=True, features=[])
    assert not browser.errors()


def test_notebook_pages_show_their_outputs_and_figures(browser, site):
    """The notebooks are executed when the site is built: every notebook page shows outputs,
    and the figures (matplotlib's PNGs) are drawn."""
    browser.set_width(1400)
    notebooks = sorted(p for p in site.pages if p[:2].isdigit() and p.endswith(".html"))
    assert len(notebooks) >= 11
    n_figures = 0
    for page in notebooks:
        browser.open(_url(site, page))
        m = browser.js(MEASURE)
        assert m["outputs"] > 0, f"{page} shows no output"
        assert all(w > 0 and h > 0 for w, h in m["figures"]), f"{page}: a figure is not drawn"
        n_figures += len(m["figures"])
        assert not browser.errors()
    assert n_figures >= 11
