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
