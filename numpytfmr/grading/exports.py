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

Rows without a score (a grader error) are left out, and so are the students no identity is known
for, as a gradebook could not match them: :func:`export` returns their names, so the command
can say so.
"""
import csv
import io

from ..shared.fileio import atomic_write_text

__all__ = ["FORMATS", "export", "canvas_text", "moodle_text"]

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


def _usable(rows):
    good, left_out = [], []
    for r in rows:
        if r.get("score") in ("", None):
            left_out.append(f"{r['student']} (no score: {r.get('status', '')})")
        elif not (r.get("sid") or r.get("email") or r.get("name")):
            left_out.append(f"{r['student']} (no name, SID or email: give --roster or metadata)")
        else:
            good.append(r)
    return good, left_out


def canvas_text(rows, assignment, max_score):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CANVAS_HEAD + [assignment])
    w.writerow(["Points Possible", "", "", "", "", _fmt(max_score)])
    for r in sorted(rows, key=lambda r: (r.get("name") or r["student"]).lower()):
        first, last = _split_name(r.get("name") or r["student"])
        student = f"{last}, {first}" if last else first
        w.writerow([student, "", r.get("sid", ""), r.get("email", ""), "", _fmt(r["score"])])
    return buf.getvalue()


def moodle_text(rows, assignment, max_score):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(MOODLE_HEAD + [assignment, "Feedback"])
    for r in sorted(rows, key=lambda r: (r.get("name") or r["student"]).lower()):
        first, last = _split_name(r.get("name") or r["student"])
        w.writerow([first, last, r.get("sid", ""), r.get("email", ""), _fmt(r["score"]),
                    " ".join(r.get("notes") or [])])
    return buf.getvalue()


FORMATS = {"canvas": canvas_text, "moodle": moodle_text}


def export(kind, path, rows, *, assignment, max_score):
    """Write the ``kind`` ("canvas" or "moodle") export of ``rows`` (the class's CSV rows, with
    ``name``/``sid``/``email``, ``score`` and ``notes``) to ``path`` atomically; return the
    students left out, each with the reason."""
    if kind not in FORMATS:
        raise ValueError(f"export format {kind!r}; expected one of {', '.join(FORMATS)}")
    good, left_out = _usable(rows)
    atomic_write_text(path, FORMATS[kind](good, assignment, max_score))
    return left_out
