"""Grades as files a gradebook imports: Canvas and Moodle (``numpytfmr grade DIR --csv ...
--export canvas FILE --export moodle FILE``).

Both are CSV (UTF-8, comma-separated, a header row), one row per student, with the final score
(after the late penalty and the overrides) in one column named after the assignment.

**Canvas** (Grades > Import): ``Student, ID, SIS User ID, SIS Login ID, Section, <assignment>``
with a second row ``Points Possible`` holding the assignment's maximum, as in Canvas's own
gradebook export. Canvas matches a row to a student by ``ID`` (its user id, left empty here:
the grader does not know it), ``SIS User ID`` (the student's SID) or ``SIS Login ID`` (here
the email; if your institution's login is something else, use a roster with the SID). A new
column name creates a new assignment on import.

**Moodle** (Grades > Import > CSV file): ``First name, Last name, ID number, Email address,
<assignment>, Feedback``. On import, map "Identify user by" to ``Email address`` (or ``ID
number``, the SID) and the assignment column to the grade item; ``Feedback`` (the overrides'
and the late policy's notes) maps to that item's feedback.

Every member of a group submission gets a row of their own. Rows without a score (a grader
error) are left out, and so are the students no identity is known for, as a gradebook could not
match them: :func:`export` returns their names, so the command can say so.

Every cell goes through :func:`.course.safe_cell` (a leading ``=``, ``+``, ``-``, ``@``, tab or
carriage return gets a single quote), so no name, SID or feedback runs as a formula. A row
whose *matching* cell (SID or email) needed that would match nobody once quoted, so it is left
out, and listed, instead. Moodle's importer aborts the whole import on a row whose user it
cannot find, and silently gives a row with an empty identifier the grade of the row before;
so each Moodle row has an email, and the ``ID number`` column is either filled on every row or
empty on all (then map "Identify user by" to the email).
"""
import csv
import io

from ..shared.fileio import atomic_write_text
from .course import member_rows, safe_cell

__all__ = ["FORMATS", "export", "exported_rows", "canvas_text", "moodle_text"]

CANVAS_HEAD = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_HEAD = ["First name", "Last name", "ID number", "Email address"]


def _fmt(x):
    return f"{float(x):.2f}"


def _split_name(name):
    """(first, last) of a full name: the last word is the last name."""
    parts = name.split()
    if len(parts) < 2:
        return name, ""
    return " ".join(parts[:-1]), parts[-1]


def exported_rows(rows, kind):
    """(the rows a ``kind`` export holds, one per person; [student (why left out)])."""
    good, left_out = [], []
    for r in rows:
        if r.get("score") in ("", None):
            left_out.append(f"{r['student']} (no score: {r.get('status', '')})")
            continue
        for m in member_rows(r):
            who = m["student"] + (f" ({m['name'] or m['sid'] or m['email']})"
                                  if m.get("member") is not None else "")
            ids = [v for v in (m.get("sid"), m.get("email")) if v]
            if not (m.get("sid") or m.get("email") or m.get("name")):
                left_out.append(f"{who} (no name, SID or email: give --roster or --metadata)")
            elif any(safe_cell(v) != v for v in ids):
                left_out.append(f"{who} (its SID or email begins with =, +, -, @ or a control "
                                "character, which a gradebook cannot match once made safe)")
            elif kind == "moodle" and not m.get("email"):
                left_out.append(f"{who} (no email: Moodle's import would stop at this row)")
            else:
                good.append(m)
    seen = {}
    for m in good:
        for v in (m.get("sid"), m.get("email")):
            if v:
                seen.setdefault(v.lower(), set()).add(m["student"])
    twice = {v: sorted(s) for v, s in seen.items() if len(s) > 1}
    if twice:
        kept = []
        for m in good:
            clash = [v for v in (m.get("sid"), m.get("email")) if v and v.lower() in twice]
            if clash:
                left_out.append(f"{m['student']} ({clash[0]} is in submissions "
                                f"{', '.join(twice[clash[0].lower()])}: one person, one grade)")
            else:
                kept.append(m)
        good = kept
    return good, left_out


def _writer(buf):
    w = csv.writer(buf, lineterminator="\n")
    return lambda cells: w.writerow([safe_cell(c) for c in cells])


def _order(rows):
    return sorted(rows, key=lambda r: ((r.get("name") or r["student"]).lower(), r["student"]))


def canvas_text(rows, assignment, max_score):
    buf = io.StringIO()
    row = _writer(buf)
    row(CANVAS_HEAD + [assignment])
    row(["Points Possible", "", "", "", "", _fmt(max_score)])
    for r in _order(rows):
        first, last = _split_name(r.get("name") or r["student"])
        student = f"{last}, {first}" if last else first
        row([student, "", r.get("sid", ""), r.get("email", ""), "", _fmt(r["score"])])
    return buf.getvalue()


def moodle_text(rows, assignment, max_score):
    buf = io.StringIO()
    row = _writer(buf)
    row(MOODLE_HEAD + [assignment, "Feedback"])
    every_sid = all(r.get("sid") for r in rows)
    for r in _order(rows):
        first, last = _split_name(r.get("name") or r["student"])
        row([first, last, r.get("sid", "") if every_sid else "", r.get("email", ""),
             _fmt(r["score"]), " ".join(r.get("notes") or [])])
    return buf.getvalue()


FORMATS = {"canvas": canvas_text, "moodle": moodle_text}


def export(kind, path, rows, *, assignment, max_score):
    """Write the ``kind`` ("canvas" or "moodle") export of ``rows`` (the class's CSV rows, with
    ``name``/``sid``/``email``, ``members``, ``score`` and ``notes``) to ``path`` atomically;
    return the students left out, each with the reason."""
    if kind not in FORMATS:
        raise ValueError(f"export format {kind!r}; expected one of {', '.join(FORMATS)}")
    good, left_out = exported_rows(rows, kind)
    atomic_write_text(path, FORMATS[kind](good, assignment, max_score))
    return left_out
