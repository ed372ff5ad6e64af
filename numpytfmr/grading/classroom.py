"""Grading a whole class: many submissions in parallel, one CSV, a results.json per student.

    numpytfmr grade submissions/ --config grading.json --csv grades.csv [--jobs N]

Every submission is graded as ``numpytfmr grade`` grades one (each in its own isolated, limited
processes), by ``jobs`` worker processes at once. The outcome of each goes into
``<csv name>_results/<student>/results.json`` (Gradescope's format, with the fingerprint of what
was graded in ``extra_data``) and ``report.txt`` (the table and the failure details, to hand back)
as soon as it is known, and the CSV is rewritten (atomically) after every submission: an
interrupted run loses at most the submissions being graded, and the next run skips every
submission whose file and grading settings are unchanged since its results.json was written.

The CSV is this command's own output: a run replaces it (rows sorted by student). A file at that
path that this command did not write (its first line is not the CSV header below) is refused
unless ``force`` is given.
"""
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
import csv
import glob
import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import stat
import statistics
import time

from ..shared.fileio import atomic_write_text, write_json
from .channel import SPENT
from .grader import POINT_DECIMALS, grade
from .notebook import (SubmissionError, candidate_files, choose_submission, import_problems,
                       linked_entries, read_file)
from .sandbox import choose as choose_isolation, claim_user_ids, submission_user

__all__ = ["find_submissions", "grade_class", "ClassResult", "CSV_HEAD", "distribution"]

CSV_HEAD = ["student", "score", "max_score"]       # then COURSE, one column per function, TAIL
CSV_COURSE = ["name", "sid", "email", "graded_score", "late_penalty_percent", "late",
              "submitted_at", "submitted_from", "overrides"]
CSV_TAIL = ["status", "isolation", "seconds", "submission", "message"]
_SUFFIXES = (".py", ".ipynb")


# --- the submissions ----------------------------------------------------------------------

def _has_glob(text):
    return any(c in text for c in "*?[")


def find_submissions(target, *, skip=()):
    """``[(student, path)]`` to grade, sorted by student.

    target: a folder (each .py/.ipynb file in it, and each subfolder, is one student's
    submission; names starting with "." or "_" are left out), a glob pattern (each match that is
    such a file or a folder), or one file. The student is the file name without its suffix (or
    the folder's name); names that collide are told apart by their suffix or folder.
    skip: paths never taken as submissions (the CSV, the results folder, the config).
    """
    target = os.fspath(target)
    skipped = {os.path.realpath(p) for p in skip}
    if _has_glob(target) and not os.path.exists(target):
        found = sorted(glob.glob(target))
    elif os.path.isdir(target):
        found = [os.path.join(target, name) for name in sorted(os.listdir(target))
                 if not name.startswith((".", "_"))]
    else:
        found = [target]
    # A symbolic link is never followed, not even to see what it is: it stays a submission
    # (named after the link), which grading refuses with a message naming it.
    found = [p for p in found if os.path.abspath(p) not in skipped and (
        _is_link_entry(p) or (os.path.realpath(p) not in skipped and _kind(p) in ("dir", "file")))]
    base = os.path.commonpath([os.path.abspath(p) for p in found]) if len(found) > 1 else ""

    def stem(p):
        name = os.path.basename(os.path.normpath(p))
        return name.rsplit(".", 1)[0] if name.endswith(_SUFFIXES) else name

    def long(p):
        rel = os.path.relpath(os.path.abspath(p), base) if base else os.path.basename(p)
        return rel.replace(os.sep, "__")

    counts = {}
    for p in found:
        counts[stem(p)] = counts.get(stem(p), 0) + 1
    out, used = [], set()
    for p in found:
        name = stem(p) if counts[stem(p)] == 1 else long(p)
        name = re.sub(r"[^A-Za-z0-9._@+-]", "_", name).strip(".") or "submission"
        unique, k = name, 1
        while unique in used:
            k += 1
            unique = f"{name}-{k}"
        used.add(unique)
        out.append((unique, p))
    return sorted(out)


def _kind(path):
    """"dir", "file" (a .py/.ipynb regular file), "link" or "" (anything else), by lstat."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) and path.endswith(_SUFFIXES) else ""


def _is_link_entry(path):
    """A symbolic link that would name a submission: a .py/.ipynb name, or no suffix (a folder)."""
    name = os.path.basename(os.path.normpath(path))
    return _kind(path) == "link" and (name.endswith(_SUFFIXES) or "." not in name)


def content_digest(path):
    """A digest of what would be graded at ``path``: the file's bytes, or, for a folder, the
    names and bytes of every .py/.ipynb file in it and its subfolders (so adding a file counts
    as a change)."""
    h = hashlib.sha256()
    try:
        kind = _kind(path)
        if kind == "dir":
            for name in candidate_files(path):
                h.update(name.encode() + b"\0")
                h.update(hashlib.sha256(read_file(os.path.join(path, name), 1 << 30)).digest())
            for name in linked_entries(path):
                h.update(b"link\0" + name.encode() + b"\0")
        elif kind == "link":
            h.update(b"a symbolic link, never followed")
        else:
            h.update(read_file(path, 1 << 30))
    except (OSError, SubmissionError) as exc:
        h.update(f"unreadable: {exc}".encode())
    return h.hexdigest()


# --- one submission (in a worker process) -----------------------------------------------------

_WORKER = {}          # set before the workers start (they are forked): plan and options


def _status(report):
    if report.load_error:
        return "not read" if "could not be read" in report.load_error else "not loaded"
    return "graded"


def _row(student, path, report, seconds):
    functions = {f: s for f, (s, _) in report.function_scores().items()}
    message = (report.load_error or "").splitlines()
    return {"student": student, "score": report.score, "max_score": report.max_score,
            "functions": functions, "status": _status(report), "seconds": round(seconds, 2),
            "isolation": report.isolation, "start_seconds": round(report.start_seconds, 3),
            "submission": os.fspath(path),
            "message": " ".join(m.strip() for m in message[:3])[:300]}


def submission_notes(path, plan):
    """``(file, notes)``: the file to grade at ``path`` under ``plan`` (see
    :func:`.notebook.choose_submission`), and the sentences the feedback carries about it: which
    file was graded and why, and imports the assignment does not allow."""
    cfg = plan.config
    functions = None if plan.items is None else [f for i in plan.items for f in i.functions]
    try:
        chosen, note = choose_submission(path, cfg.get("assignment"), submission=cfg.get("submission"),
                                         functions=functions)
    except SubmissionError:
        return path, []                    # grade() reports why, as it always has
    return chosen, ([note] if note else []) + import_problems(chosen, cfg.get("allow_modules", ()))


def _grade_one(student, path, key, folder):
    """Grade one submission, write its results.json and report.txt; return its CSV row."""
    state = _WORKER
    start, mark = time.monotonic(), cpu_mark()
    try:
        chosen, notes = submission_notes(path, state["plan"])
        with submission_user(state["isolation"]):          # a user ID of its own (as root)
            report = grade(chosen, plan=state["plan"], isolation=state["isolation"])
        report.warnings[:0] = notes
    except Exception as exc:  # noqa: BLE001 -- a grader failure on one submission ends nothing
        return {"student": student, "score": "", "max_score": "", "functions": {},
                "status": "grader error", "seconds": round(time.monotonic() - start, 2),
                "isolation": state["isolation"].mode,
                "submission": os.fspath(path), "message": f"{type(exc).__name__}: {exc}"[:300]}
    seconds = time.monotonic() - start
    row = _row(student, path, report, seconds)
    sandboxed, grading = report.cpu_seconds, grading_cpu(mark)
    row.update(cpu_seconds=round(sandboxed + grading, 3), sandbox_cpu_seconds=round(sandboxed, 3),
               grader_cpu_seconds=round(grading, 3), processes=report.processes)
    results = report.gradescope(per_case=state["plan"].config.get("gradescope_tests") == "case")
    results["extra_data"].update({"student": student, "grading_key": key, "row": row})
    write_json(os.path.join(folder, "results.json"), results)
    atomic_write_text(os.path.join(folder, "report.txt"), report.table() + "\n")
    return row


def children_cpu():
    """CPU seconds (user and system) of this process's finished children (those it, and they,
    waited for)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu():
    """CPU seconds (user and system) of this process, all its threads."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_mark():
    """The CPU seconds spent so far, for :func:`grading_cpu`."""
    return own_cpu(), children_cpu(), SPENT["reaped"]


def grading_cpu(mark):
    """CPU seconds of the grading itself since ``mark`` (:func:`cpu_mark`): this process's (the
    reference's answers, the judging, the finite differences) and its children's other than
    the submission processes (the report's ``cpu_seconds``), such as the user-ID sweeps. A
    worker grades one submission at a time, so the difference across one is that one's."""
    own, children, reaped = cpu_mark()
    return own - mark[0] + children - mark[1] - (reaped - mark[2])


def _reuse(folder, key):
    """The CSV row saved in ``folder``/results.json if it was graded under ``key``, else None."""
    try:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            extra = json.load(f).get("extra_data", {})
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(extra, dict) or extra.get("grading_key") != key:
        return None
    row = extra.get("row")
    return row if isinstance(row, dict) and "score" in row else None


# --- the table ---------------------------------------------------------------------------------

def _fmt(x):
    return "" if x == "" or x is None else f"{x:.{POINT_DECIMALS}f}"


def _csv_text(rows, functions, course_columns=()):
    """The CSV of ``rows``, with the ``course_columns`` (of :data:`CSV_COURSE`, see
    :meth:`.course.Course.apply`) after the totals."""
    from .course import member_rows, safe_cell
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    course_columns = [c for c in CSV_COURSE if c in course_columns]
    w.writerow(CSV_HEAD + course_columns + functions + CSV_TAIL)
    for r in [m for r in sorted(rows, key=lambda r: r["student"]) for m in member_rows(r)]:
        per = r.get("functions") or {}
        graded = r["status"] != "grader error" or bool(r.get("overrides"))
        course = [_fmt(r.get(c, "")) if c == "graded_score" else r.get(c, "") for c in course_columns]
        cells = ([r["student"], _fmt(r["score"]), _fmt(r["max_score"])] + course
                 + [_fmt(per.get(f, 0.0)) if graded else "" for f in functions]
                 + [r["status"], "not isolated" if r.get("isolation") == "none"
                    else r.get("isolation", ""), r["seconds"], r["submission"], r["message"]])
        w.writerow([safe_cell(c) for c in cells])      # names, paths, messages: the students'
    return buf.getvalue()


_COURSE_MARK = "\n\n--- course: submission time, late policy, overrides ---\n"


def _add_feedback(folder, lines):
    """Append the course's lines to ``folder``/report.txt (replacing those of an earlier run)."""
    path = os.path.join(folder, "report.txt")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return
    base = text.split(_COURSE_MARK, 1)[0].rstrip("\n")
    new = base + (_COURSE_MARK + "\n".join(lines) if lines else "") + "\n"
    if new != text:
        atomic_write_text(path, new)


def _written_record(folder):
    return os.path.join(folder, ".written.json")


def written_by_grade(path, folder):
    """Whether the file at ``path`` is absent or holds what this command last wrote there (its
    digest is recorded in ``folder``): an export or report it may replace without --force."""
    if not os.path.exists(path):
        return True
    try:
        with open(_written_record(folder), encoding="utf-8") as f:
            known = json.load(f)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except (OSError, ValueError):
        return False
    return isinstance(known, dict) and known.get(os.path.abspath(path)) == digest


def remember_written(path, folder):
    """Record the digest of the file this command just wrote at ``path``."""
    record = _written_record(folder)
    try:
        with open(record, encoding="utf-8") as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    with open(path, "rb") as f:
        known[os.path.abspath(path)] = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(folder, exist_ok=True)
    write_json(record, known)


def _last_copy(folder):
    return os.path.join(folder, ".grades-as-written.csv")


def check_hand_edits(csv_path, functions, course=None):
    """Refuse to replace a grades CSV whose scores were edited by hand since the grader wrote
    it, unless ``course``'s overrides already carry them: the edits are written, as overrides
    with the fingerprint of the submission graded, to ``<csv name>-edits.csv`` beside it, and a
    FileExistsError says to pass that file with --overrides (or --force to drop the edits)."""
    from .course import csv_edits, edits_as_overrides
    last = _last_copy(results_folder(csv_path))
    try:
        with open(csv_path, encoding="utf-8") as f:
            current = f.read()
        with open(last, encoding="utf-8") as f:
            written = f.read()
    except (OSError, UnicodeDecodeError):
        return
    edits = [e for e in csv_edits(written, current, functions)
             if course is None or not course.covers(e[0], e[1], e[3])]
    if not edits:
        return
    try:
        with open(last + ".json", encoding="utf-8") as f:
            fingerprints = json.load(f)
    except (OSError, ValueError):
        fingerprints = {}
    root, _ = os.path.splitext(csv_path)
    target = root + "-edits.csv"
    k = 1
    while not written_by_grade(target, results_folder(csv_path)):   # reasons filled in: kept
        k += 1
        target = f"{root}-edits-{k}.csv"
    atomic_write_text(target, edits_as_overrides(edits, fingerprints))
    remember_written(target, results_folder(csv_path))
    cells = ", ".join(f"{s} {c} {o or '-'} -> {n or '-'}" for s, c, o, n in edits[:3])
    raise FileExistsError(f"{csv_path} was edited by hand since grade wrote it ({len(edits)} "
                          f"score cell(s): {cells}{', ...' if len(edits) > 3 else ''}); a re-run "
                          f"would revert that. The edits are in {target} as overrides: replace "
                          "'give the reason' with each reason and add the file to the run with "
                          "--overrides (it may be repeated), or give --force to drop them")


def is_grades_csv(path):
    """Whether the file at ``path`` is a CSV this command wrote (its header row)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            head = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return head[:len(CSV_HEAD)] == CSV_HEAD and head[-len(CSV_TAIL):] == CSV_TAIL


def distribution(totals, max_score, bins=10):
    """Mean, median, quartiles, min, max and a histogram of ``totals`` (a dict)."""
    if not totals:
        return {"count": 0}
    data = sorted(totals)
    q1, median, q3 = (statistics.quantiles(data, n=4, method="inclusive") if len(data) > 1
                      else (data[0],) * 3)
    top = max_score if max_score and max_score > 0 else max(data) or 1.0
    edges = [top * k / bins for k in range(bins + 1)]
    counts = [0] * bins
    for x in data:
        k = min(bins - 1, max(0, int(x / top * bins))) if top > 0 else 0
        counts[k] += 1
    r = POINT_DECIMALS
    return {"count": len(data), "mean": round(statistics.fmean(data), r),
            "median": round(median, r), "q1": round(q1, r), "q3": round(q3, r),
            "min": round(data[0], r), "max": round(data[-1], r),
            "histogram": [[round(edges[k], r), round(edges[k + 1], r), counts[k]] for k in range(bins)]}


def distribution_table(dist, max_score):
    """The distribution as a few lines of text."""
    if not dist.get("count"):
        return "no scores"
    lines = [f"score (of {max_score:g}): mean {dist['mean']:g}   median {dist['median']:g}   "
             f"quartiles {dist['q1']:g} / {dist['q3']:g}   min {dist['min']:g}   max {dist['max']:g}"]
    width = max(c for _, _, c in dist["histogram"]) or 1
    last = len(dist["histogram"]) - 1
    for k, (lo, hi, count) in enumerate(dist["histogram"]):
        bar = "#" * max(1 if count else 0, round(40 * count / width))
        close = "]" if k == last else ")"
        lines.append(f"  [{lo:>6g}, {hi:>6g}{close}  {bar:<40}  {count}")
    return "\n".join(lines)


# --- the class -----------------------------------------------------------------------------

@dataclass
class ClassResult:
    """What :func:`grade_class` did."""
    rows: list
    functions: list
    max_score: float
    seconds: float
    graded: int                 # graded by this run
    reused: int                 # unchanged since an earlier run: its results were kept
    csv: str
    results: str
    jobs: int
    distribution: dict = field(default_factory=dict)
    run_cpu_seconds: float = 0.0   # the whole run's: this process, its workers and their children

    @property
    def start_seconds_per_submission(self):
        """Mean seconds spent starting a submission's isolated processes (the sandbox's cost)."""
        spent = [r["start_seconds"] for r in self.rows if "start_seconds" in r]
        return statistics.fmean(spent) if spent else 0.0

    def per_submission(self, key):
        """Mean of the rows' ``key`` (seconds, cpu_seconds) over the submissions graded now."""
        spent = [r[key] for r in self.rows if isinstance(r.get(key), (int, float))]
        return statistics.fmean(spent) if spent else 0.0

    def summary(self):
        """The ``--summary`` JSON content."""
        statuses = {}
        for r in self.rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        return {"seconds": round(self.seconds, 2), "submissions": len(self.rows),
                "graded_now": self.graded, "unchanged": self.reused, "jobs": self.jobs,
                "max_score": self.max_score, "statuses": statuses,
                "distribution": self.distribution, "csv": self.csv, "results": self.results,
                "isolation": sorted({r.get("isolation", "") for r in self.rows}),
                "start_seconds_per_submission": round(self.start_seconds_per_submission, 3),
                "wall_seconds_per_submission": round(self.per_submission("seconds"), 3),
                "cpu_seconds_per_submission": round(self.per_submission("cpu_seconds"), 3),
                "sandbox_cpu_seconds_per_submission":
                    round(self.per_submission("sandbox_cpu_seconds"), 3),
                "grader_cpu_seconds_per_submission":
                    round(self.per_submission("grader_cpu_seconds"), 3),
                "processes_per_submission": round(self.per_submission("processes"), 3),
                "cpu_seconds": round(math.fsum(r.get("cpu_seconds", 0.0) for r in self.rows), 3),
                "run_cpu_seconds": round(self.run_cpu_seconds, 3),
                "functions": self.functions}


def results_folder(csv_path):
    """The folder of the per-student results: ``grades.csv`` -> ``grades_results``."""
    root, _ = os.path.splitext(os.path.abspath(os.fspath(csv_path)))
    return root + "_results"


def grade_class(submissions, csv_path, *, plan, jobs=None, isolation=None, force=False,
                regrade=False, log=None, course=None):
    """Grade ``submissions`` (``[(student, path)]``, see :func:`find_submissions`) under ``plan``
    (which must name its items) with ``jobs`` worker processes; return a :class:`ClassResult`.

    force: replace a file at ``csv_path`` that this command did not write.
    regrade: grade every submission again, even those unchanged since the last run.
    log: a callable taking one line per finished submission, or None.
    course: a :class:`.course.Course` (identities, submission times, late policy, overrides)
    whose columns and adjusted scores go into the CSV and whose lines go into each report.txt.
    """
    if plan.items is None:
        raise ValueError("grading a class needs the functions to grade: give a config (--config) "
                         "or names (--only), so that every student is graded on the same ones")
    csv_path = os.path.abspath(os.fspath(csv_path))
    if os.path.exists(csv_path) and not force and not is_grades_csv(csv_path):
        raise FileExistsError(f"{csv_path} exists and was not written by numpytfmr grade; "
                              "give --force to replace it")
    jobs = max(1, int(jobs or os.cpu_count() or 1))
    start, run_cpu = time.monotonic(), own_cpu() + children_cpu()
    folder = results_folder(csv_path)
    functions = [fn for item in plan.items for fn in item.functions]
    from .course import Course
    course = course or Course()
    if not force:
        check_hand_edits(csv_path, functions, course)
    # what decides a submission's grade besides the plan: the chosen file and allowed modules
    fingerprint = plan.fingerprint() + repr((plan.config.get("submission"),
                                             sorted(plan.config.get("allow_modules", [])),
                                             plan.config.get("gradescope_tests")))
    max_score = round(sum(item.weight for item in plan.items), POINT_DECIMALS)

    rows, todo = {}, []
    for student, path in submissions:
        key = hashlib.sha256(f"{fingerprint}:{content_digest(path)}".encode()).hexdigest()
        where = os.path.join(folder, student)
        row = None if regrade else _reuse(where, key)
        if row is not None:
            row = dict(row, student=student, submission=os.fspath(path))
            rows[student] = row
        else:
            todo.append((student, path, key, where))
    reused = len(rows)
    total = len(submissions)

    def save():
        applied = [course.apply(r) for r in rows.values()]
        text = _csv_text(applied, functions, course.columns())
        os.makedirs(folder, exist_ok=True)
        atomic_write_text(csv_path, text)
        atomic_write_text(_last_copy(folder), text)
        write_json(_last_copy(folder) + ".json", {r["student"]: r.get("fingerprint", "")
                                                  for r in applied})

    def done(row):
        rows[row["student"]] = row
        save()
        if log is not None:
            score = (f"{_fmt(row['score'])} / {_fmt(row['max_score'])}" if row["score"] != ""
                     else "--")
            note = "" if row["status"] == "graded" else f"  ({row['status']}: {row['message'][:80]})"
            log(f"[{len(rows):>{len(str(total))}}/{total}] {row['student']:<24} {score:>17}  "
                f"{row['seconds']:6.1f} s{note}")

    save()
    isolation = isolation or choose_isolation(protect=plan.protect, allow_none=False)
    claim_user_ids()            # before the workers fork: they share the run's user IDs
    if isolation.mode != "bubblewrap":
        os.makedirs(folder, exist_ok=True)       # the results: for the grader's user alone
        os.chmod(folder, 0o700)
    if todo:
        plan.warm()             # the cases and the reference's answers, once for every worker
    _WORKER.update(plan=plan, isolation=isolation)
    if jobs == 1 or len(todo) <= 1:
        for student, path, key, where in todo:
            done(_grade_one(student, path, key, where))
    else:
        # Workers are forked: they inherit the plan (made once, here) instead of rebuilding it.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context) as pool:
            futures = {pool.submit(_grade_one, *job): job for job in todo}
            try:
                for future in as_completed(futures):
                    student, path, _, _ = futures[future]
                    try:
                        row = future.result()
                    except Exception as exc:  # noqa: BLE001 -- e.g. a worker killed
                        row = {"student": student, "score": "", "max_score": "", "functions": {},
                               "status": "grader error", "seconds": 0.0, "isolation": isolation.mode,
                               "submission": os.fspath(path),
                               "message": f"{type(exc).__name__}: {exc}"[:300]}
                    done(row)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    final = {s: course.apply(r) for s, r in rows.items()}
    for student, row in final.items():
        _add_feedback(os.path.join(folder, student), course.feedback(row))
    seconds = time.monotonic() - start
    scored = [r["score"] for r in final.values() if r["score"] != ""]
    return ClassResult(rows=sorted(final.values(), key=lambda r: r["student"]), functions=functions,
                       max_score=max_score, seconds=seconds, graded=len(todo), reused=reused,
                       csv=csv_path, results=folder, jobs=jobs,
                       distribution=distribution(scored, max_score),
                       run_cpu_seconds=own_cpu() + children_cpu() - run_cpu)
