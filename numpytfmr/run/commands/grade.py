"""``numpytfmr grade``: grade homework against the reference, one submission or a whole class.

    numpytfmr grade homework.py [--only NAMES] [--timeout S] [--json results.json] [--seed N]
                                [--config grading.json] [--hidden-seed N] [--memory-mb M]
    numpytfmr grade DIR_OR_GLOB --csv grades.csv [--config grading.json | --only NAMES]
                                [--jobs N] [--summary FILE] [--force] [--regrade]
                                [--roster FILE] [--metadata FILE] [--late-from-mtime]
                                [--overrides FILE ...] [--export canvas|moodle FILE]
                                [--similarity FILE] [--allow-module NAME]
    ... [--isolation auto|bubblewrap|user|none | --no-isolation]
    numpytfmr grade --check [--isolation ...] [--config grading.json]

One submission: exit status 0 when every test passes, 1 when any fails. A class (``--csv``):
0 when every submission was graded (whatever the scores), 1 when the grader failed on some.
A usage error (a missing submission or config, bad JSON, a bad flag value) exits 2 with one
line naming the file or the flag.
"""
import argparse
import glob
import json
import os
import sys
import time

from numpytfmr.run.cli import UsageError, nonnegative_int, output_file, positive_float, positive_int
from numpytfmr.run.options import add_force, add_summary, command_parser

MIN_MEMORY_MB = 256


def _names(values):
    out = []
    for group in values or []:
        for v in group:
            out += [n for n in v.replace(",", " ").split() if n]
    return out


def _check_config(path):
    """The config file must exist, be a readable file and hold valid JSON: UsageError otherwise."""
    from numpytfmr.grading.cases import load_config

    if not os.path.exists(path):
        raise UsageError(f"--config {path!r} does not exist; expected a grading.json "
                         "(numpytfmr make-assignment writes one)")
    if os.path.isdir(path):
        raise UsageError(f"--config {path!r} is a directory; expected a grading.json file")
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"--config {path!r} cannot be read: {exc.strerror}") from None
    try:
        json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"--config {path!r} is not UTF-8 text; expected a grading.json") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {path!r} is not valid JSON ({exc.msg}, line {exc.lineno}, "
                         f"column {exc.colno})") from None
    try:
        load_config(path)
    except ValueError as exc:
        raise UsageError(f"--config {path!r}: {exc}") from None


def _plan(args, protect=()):
    from numpytfmr.grading import make_plan
    from numpytfmr.grading.cases import resolve

    only = _names(args.only)
    for name in only:
        try:
            resolve(name)
        except ValueError as exc:
            raise UsageError(f"--only: {exc}") from None
    if args.memory_mb is not None and args.memory_mb < MIN_MEMORY_MB:
        raise UsageError(f"--memory-mb is {args.memory_mb}; expected an integer >= {MIN_MEMORY_MB}")
    if args.config is not None:
        _check_config(args.config)
    try:
        plan = make_plan(only=only or None, config=args.config, seed=args.seed,
                         hidden_seed=args.hidden_seed, timeout=args.timeout,
                         memory_mb=args.memory_mb, protect=protect)
    except ValueError as exc:           # the config's own values (a seed, a weight, a case)
        raise UsageError(f"--config {args.config!r}: {exc}" if args.config else str(exc)) from None
    allowed = _names(args.allow_module)
    for name in allowed:
        if not name.isidentifier():
            raise UsageError(f"--allow-module {name!r}: expected a top-level module name, e.g. scipy")
    if allowed:
        plan.config = dict(plan.config, allow_modules=sorted(set(plan.config.get("allow_modules", []))
                                                             | set(allowed)))
    import importlib.util
    for name in plan.config.get("allow_modules", []):
        if importlib.util.find_spec(name) is None:     # the submissions import from this Python
            where = "--allow-module" if name in allowed else f"--config {args.config!r} allow_modules"
            raise UsageError(f"{where}: module {name!r} is not installed for the Python that runs "
                             f"the grader ({sys.executable}); install it there, or drop it")
    return plan


def _isolation(args, protect, allow_none):
    """The isolation of the run (see numpytfmr/grading/sandbox.py); UsageError (one line: why, and
    what to install) when the one asked for cannot work here, or when "auto" finds no mode that
    keeps ``protect`` from the submissions. ``allow_none``: one submission without a config,
    graded by a user who is not root, may run unisolated (nothing secret to keep)."""
    from numpytfmr.grading.sandbox import SandboxUnavailable, choose

    requested = "none" if args.no_isolation else args.isolation
    try:
        isolation = choose(requested, protect, allow_none=allow_none)
    except SandboxUnavailable as exc:
        flag = "--isolation" if requested != "auto" else "NUMPYTFMR_REQUIRE_SANDBOX"
        if requested == "auto" and os.environ.get("NUMPYTFMR_REQUIRE_SANDBOX", "") in ("", "0"):
            flag = "--csv" if args.csv else "--isolation auto"
        raise UsageError(f"{flag}: {exc}") from None
    if isolation.mode != "bubblewrap" and requested == "auto":
        print(f"numpytfmr grade: warning: {isolation.reason}; isolation: "
              f"{isolation.description}", file=sys.stderr, flush=True)
    return isolation


def _check(args):
    """``grade --check``: start one submission process exactly as grading would."""
    from numpytfmr.grading.channel import check

    plan = _plan(args)
    isolation, problem = check("none" if args.no_isolation else args.isolation, plan.protect)
    if problem or isolation is None or isolation.mode == "none":
        print("numpytfmr grade: submissions cannot be isolated here: "
              + (problem or "mode none was asked for"), file=sys.stderr)
        return 1
    print(f"numpytfmr grade: isolation: {isolation.description}"
          + (f" (bubblewrap: {isolation.reason})" if isolation.reason else ""))
    return 0


def _warn_exposed(isolation, plan):
    """Under isolation by user ID alone, say which protected files every user can read."""
    from numpytfmr.grading.sandbox import readable_by_all

    if isolation.mode != "user":
        return
    for path, why in plan.protect:
        if readable_by_all(path):
            print(f"numpytfmr grade: warning: {path} ({why}) is readable by every user, so by "
                  "the submissions too "
                  f"(isolation by user ID alone); make it unreadable to others (chmod -R o-rwx) "
                  "or install bubblewrap", file=sys.stderr, flush=True)


def _is_pattern(target):
    return any(c in target for c in "*?[")


def _exists(target):
    return os.path.exists(target) or (_is_pattern(target) and bool(glob.glob(target)))


def cmd_grade(args):
    from numpytfmr.shared.fileio import write_json, write_summary

    target = args.submission
    if args.check:
        if target is not None:
            raise UsageError(f"--check takes no SUBMISSION (got {target!r}): it starts a "
                             "process of its own")
        return _check(args)
    if target is None:
        raise UsageError("SUBMISSION is missing: give a .py file, a .ipynb notebook or a folder "
                         "(or --check)")
    if not _exists(target):
        raise UsageError(f"{target!r} does not exist"
                         + (" (nothing matches the pattern)" if _is_pattern(target) else "")
                         + "; expected a .py file, a .ipynb notebook or a folder")
    if os.path.isfile(target) and not os.access(target, os.R_OK):
        raise UsageError(f"{target!r} cannot be read (permission denied)")
    if args.csv:
        return _grade_class(args, target)
    for flag, value in (("--jobs", args.jobs), ("--force", args.force), ("--regrade", args.regrade)):
        if value:
            raise UsageError(f"{flag} applies to a whole class: give --csv FILE too")

    for flag, value in (("--roster", args.roster), ("--overrides", args.overrides),
                        ("--export", args.export), ("--similarity", args.similarity),
                        ("--metadata", args.metadata), ("--late-from-mtime", args.late_from_mtime)):
        if value:
            raise UsageError(f"{flag} applies to a whole class: give --csv FILE too")
    from numpytfmr.grading import grade
    from numpytfmr.grading.classroom import cpu_mark, grading_cpu, submission_notes
    from numpytfmr.grading.sandbox import submission_user

    start = time.monotonic()
    plan = _plan(args)
    isolation = _isolation(args, plan.protect, allow_none=args.config is None)
    mark = cpu_mark()
    _warn_exposed(isolation, plan)
    chosen, notes = submission_notes(target, plan)
    with submission_user(isolation):
        report = grade(chosen, plan=plan, isolation=isolation, log=None)
    report.warnings[:0] = notes
    print(report.table(details=not args.brief))
    if args.json:
        write_json(args.json, report.gradescope(
            per_case=plan.config.get("gradescope_tests") == "case"))
        print(f"results written to {args.json}")
    if args.summary:
        write_summary(args.summary, {"seconds": round(time.monotonic() - start, 2), "submissions": 1,
                                     "score": report.score, "max_score": report.max_score,
                                     "passed": report.passed, "isolation": report.isolation,
                                     "sandbox_start_seconds": round(report.start_seconds, 3),
                                     "cpu_seconds": round(report.cpu_seconds + grading_cpu(mark), 3),
                                     "sandbox_cpu_seconds": round(report.cpu_seconds, 3),
                                     "grader_cpu_seconds": round(grading_cpu(mark), 3),
                                     "processes": report.processes})
    return 0 if report.passed else 1


def _grade_class(args, target):
    from numpytfmr.grading.classroom import (distribution_table, find_submissions, grade_class,
                                             results_folder)
    from numpytfmr.shared.fileio import write_summary

    if args.json:
        raise UsageError("--json writes one submission's results; with --csv each submission's "
                         "results.json goes into the results folder beside the CSV")
    csv_path = os.path.abspath(args.csv)
    folder = results_folder(csv_path)
    skip = [csv_path, folder] + ([args.config, os.path.dirname(os.path.abspath(args.config))]
                                 if args.config else [])
    submissions = find_submissions(target, skip=skip)
    if not submissions:
        raise UsageError(f"no submission in {target!r}: expected .py or .ipynb files, or one "
                         "folder per student")
    # the processes of one student may not read the others' work, nor the grades
    whose = "the submissions of the class"
    protect = ([(target, whose)] if os.path.isdir(target)
               else [(path, whose) for _, path in submissions])
    protect += [(csv_path, "the grades"), (folder, "the grades")]
    plan = _plan(args, protect)
    isolation = _isolation(args, plan.protect, allow_none=False)
    _warn_exposed(isolation, plan)
    if plan.items is None:
        raise UsageError("--csv grades a class on the same functions for every student: give "
                         "--config grading.json or --only NAMES")
    course = _course(args, target, submissions, plan, folder)
    exports = _exports(args, csv_path)
    for line in _course_warnings(course):
        print(f"numpytfmr grade: warning: {line}", file=sys.stderr, flush=True)
    # without bubblewrap the submissions share the filesystem: what the grader writes while
    # they run (the CSV, the results) is for its own user alone
    umask = os.umask(0o077) if isolation.mode != "bubblewrap" else None
    try:
        result = grade_class(submissions, csv_path, plan=plan, jobs=args.jobs, isolation=isolation,
                             force=args.force, regrade=args.regrade,
                             log=lambda line: print(line, flush=True), course=course)
    except FileExistsError as exc:
        raise UsageError(f"--csv: {exc}") from None
    finally:
        if umask is not None:
            os.umask(umask)
    print()
    print(f"{len(result.rows)} submissions in {result.seconds:.1f} s ({result.graded} graded now, "
          f"{result.reused} unchanged since the last run; {result.jobs} jobs)")
    print(f"isolation: {isolation.description}; per submission: "
          f"{result.per_submission('seconds'):.2f} s wall time, of which starting the isolated "
          f"processes took {result.start_seconds_per_submission:.2f} s; "
          f"{result.per_submission('cpu_seconds'):.2f} s CPU time: "
          f"{result.per_submission('sandbox_cpu_seconds'):.2f} s its processes', "
          f"{result.per_submission('grader_cpu_seconds'):.2f} s the grading's")
    print(distribution_table(result.distribution, result.max_score))
    print(f"grades: {result.csv}\nresults: {result.results}{os.sep}<student>{os.sep}results.json "
          "and report.txt")
    _course_outputs(args, result, submissions, plan, course, exports)
    if args.summary:
        write_summary(args.summary, result.summary())
    return 1 if any(r["status"] == "grader error" for r in result.rows) else 0


def _course(args, target, submissions, plan, results):
    """The class's :class:`~numpytfmr.grading.course.Course`; UsageError on a bad file."""
    from numpytfmr.grading.classroom import content_digest
    from numpytfmr.grading.course import build_course

    overrides = args.overrides or []
    for flag, path in ([("--roster", args.roster), ("--metadata", args.metadata)]
                       + [("--overrides", p) for p in overrides]):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{flag} {path!r} does not exist; expected a "
                             + ("metadata file (.yml or .json)" if flag == "--metadata"
                                else "CSV file"))
    functions = [fn for item in plan.items for fn in item.functions]
    folder = target if os.path.isdir(target) else None
    try:
        return build_course(submissions, functions, metadata_dir=folder, metadata=args.metadata,
                            roster=args.roster, late=plan.config.get("late"),
                            overrides=overrides, late_from_mtime=args.late_from_mtime,
                            record=os.path.join(results, ".override-fingerprints.json"),
                            fingerprint=lambda path: content_digest(path)[:12])
    except ValueError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None


def _course_warnings(course):
    """What the instructor must know before trusting the grades: files students put in their
    submissions that were ignored, submissions without a time under a late policy, and
    overrides replaced or not applied."""
    out = []
    if course.ignored:
        names = sorted(course.ignored)
        out.append(f"ignored the metadata file(s) inside {len(names)} submission(s) "
                   f"({', '.join(names[:5])}{' ...' if len(names) > 5 else ''}): a student wrote "
                   "them; identity and submission time come from the export's "
                   "submission_metadata.yml, --metadata or --roster only")
    if course.late is not None:
        missing = sorted(s for s, (when, _) in course.times.items() if when is None)
        if missing:
            out.append(f"no submission time for {len(missing)} submission(s) "
                       f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}): the late "
                       "policy is not applied to them (give --metadata or a roster's "
                       "submitted_at, or --late-from-mtime to use the files' times)")
    return out + course.warnings


def _exports(args, csv_path):
    """[(kind, path)] of --export; UsageError on an unknown kind, a clash of files, or a file
    this command did not write (without --force)."""
    from numpytfmr.grading.classroom import results_folder, written_by_grade
    from numpytfmr.grading.exports import FORMATS

    out = []
    for kind, path in args.export or []:
        if kind not in FORMATS:
            raise UsageError(f"--export {kind!r}: expected one of {', '.join(FORMATS)}, then a file")
        try:
            output_file(path)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--export {kind} {exc}") from None
        if os.path.abspath(path) in (csv_path, *(os.path.abspath(p) for _, p in out)):
            raise UsageError(f"--export {kind} {path!r}: the same file as another output")
        out.append((kind, path))
    folder = results_folder(csv_path)
    for flag, path in [("--export " + kind, path) for kind, path in out] + \
            ([("--similarity", args.similarity)] if args.similarity else []):
        if not args.force and not written_by_grade(path, folder):
            raise UsageError(f"{flag} {path!r} exists and was not written by numpytfmr grade; "
                             "give --force to replace it")
    return out


def _course_outputs(args, result, submissions, plan, course, exports):
    """The gradebook exports and the similarity report, after grading."""
    from numpytfmr.grading.classroom import remember_written
    from numpytfmr.grading.exports import export, exported_rows

    assignment = plan.config.get("assignment") or "numpytfmr homework"
    for kind, path in exports:
        left_out = export(kind, path, result.rows, assignment=assignment,
                          max_score=result.max_score)
        remember_written(path, result.results)
        print(f"{kind} export: {path} ({len(exported_rows(result.rows, kind)[0])} students)"
              + (f"; left out: {'; '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''}"
                 if left_out else ""))
    if args.similarity:
        rep = _similarity(submissions, plan)
        from numpytfmr.grading.similarity import write_report
        write_report(args.similarity, rep)
        remember_written(args.similarity, result.results)
        print(f"similarity: {args.similarity} ({len(rep['pairs'])} pairs and "
              f"{len(rep['reference'])} close to the reference flagged for review; flags are "
              "never penalties)")


def _similarity(submissions, plan):
    """The similarity report of the class: each submission's graded file, against the others
    and the reference functions of the plan, with the skeleton as boilerplate."""
    import inspect

    from numpytfmr.grading.classroom import submission_notes
    from numpytfmr.grading.notebook import SubmissionError, read_submission
    from numpytfmr.grading.similarity import report
    from numpytfmr.grading.skeleton import skeleton_source

    sources = {}
    for student, path in submissions:
        chosen, _ = submission_notes(path, plan)
        try:
            sources[student] = "\n".join(c["source"] for c in read_submission(chosen))
        except SubmissionError:
            continue
    boiler, refs = [], {}
    for item in plan.items:
        boiler += skeleton_source(item)
        fns = ([item.spec.forward, item.spec.backward] if item.kind == "op"
               else [item.spec.reference])
        for fn in fns:
            try:
                refs[f"{fn.__module__}.{fn.__name__}"] = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
    return report(sources, boilerplate_sources=boiler, references=refs)


def add_command(sub):
    p = command_parser(sub, "grade")
    p.add_argument("submission", metavar="SUBMISSION", nargs="?",
                   help="a .py file, a .ipynb notebook, or a folder holding one; with --csv, a "
                        "folder of submissions (files or one folder per student) or a glob "
                        "pattern (quote it)")
    p.add_argument("--only", action="append", nargs="+", metavar="NAMES",
                   help="grade only these ops/functions (e.g. softmax attention, or causal_mask); "
                        "commas or spaces separate names")
    p.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                   help="seconds allowed per case, and for loading the submission (default 10)")
    p.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write a Gradescope results.json here (atomically)")
    p.add_argument("--seed", type=nonnegative_int, default=None, metavar="N",
                   help="seed of the visible cases (default 0)")
    p.add_argument("--hidden-seed", type=nonnegative_int, default=None, metavar="N",
                   help="seed of hidden cases, shown to students after the due date")
    p.add_argument("--config", metavar="FILE", help="a grading.json from make-assignment")
    p.add_argument("--memory-mb", type=positive_int, default=None, metavar="M",
                   help=f"address-space limit of the submission process (default 2048, at least "
                        f"{MIN_MEMORY_MB})")
    p.add_argument("--brief", action="store_true", help="the table only, without failure details")
    p.add_argument("--csv", type=output_file, metavar="FILE",
                   help="grade a whole class: one row per student (total and per-function scores) "
                        "in this CSV, and FILE's name + _results/<student>/results.json and "
                        "report.txt beside it; unchanged submissions are skipped on a later run")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help=f"with --csv: submissions graded at once (default: the number of CPUs, "
                        f"{os.cpu_count() or 1} here)")
    add_summary(p, "write a JSON summary: seconds, submissions, and with --csv the score "
                "distribution")
    add_force(p, "with --csv: replace a file at the CSV's path that grade did not write")
    p.add_argument("--regrade", action="store_true",
                   help="with --csv: grade every submission again, even those unchanged since the "
                        "last run")
    p.add_argument("--allow-module", action="append", nargs="+", metavar="NAME",
                   help="a module submissions may import besides NumPy and the standard library "
                        "(repeatable; added to grading.json's allow_modules)")
    p.add_argument("--roster", metavar="FILE",
                   help="with --csv: a CSV mapping file or folder names to students (columns "
                        "file, name, sid, email, submitted_at; several rows of one file are a "
                        "group); Gradescope's submission_metadata.yml at the folder's root is read "
                        "without it")
    p.add_argument("--overrides", action="append", metavar="FILE",
                   help="with --csv: the staff's overrides, a CSV with columns student, function "
                        "(or total), score, reason and optionally fingerprint; applied after "
                        "grading on every run, any number of lines per student; repeatable (the "
                        "grades-edits.csv grade writes is such a file); an override whose "
                        "submission changed since is listed as stale, not applied")
    p.add_argument("--metadata", metavar="FILE",
                   help="with --csv: the instructor's metadata of the submissions (names, SIDs, "
                        "emails, submission times): Gradescope's submission_metadata.yml layout, "
                        "or JSON {folder: {created_at, users}}; metadata files inside the "
                        "submissions are never read")
    p.add_argument("--late-from-mtime", action="store_true",
                   help="with --csv and a late policy: where the metadata gives no submission "
                        "time, take the newest modification time of the submitted files (which "
                        "a student can set); without it such submissions get no late penalty "
                        "and the CSV says 'no submission time'")
    p.add_argument("--export", nargs=2, action="append", metavar=("KIND", "FILE"),
                   help="with --csv: also write a gradebook import file, KIND canvas or moodle "
                        "(repeatable)")
    p.add_argument("--similarity", type=output_file, metavar="FILE",
                   help="with --csv: a report of submissions whose code is unusually alike, and "
                        "of those close to numpytfmr's reference (text; JSON for a .json name); "
                        "for review, never a penalty")
    p.add_argument("--isolation", choices=("auto", "bubblewrap", "user", "none"), default="auto",
                   help="how each submission process is isolated (docs/instructor.md): bubblewrap "
                        "(namespaces, a read-only filesystem without the reference), user (root "
                        "only: a user ID of its own), none; default auto, the strongest that works")
    p.add_argument("--no-isolation", action="store_true",
                   help="the same as --isolation none: needed to grade a class where neither "
                        "bubblewrap nor root is available (reports then say 'not isolated')")
    p.add_argument("--check", action="store_true",
                   help="grade nothing: start one submission process exactly as grading would, "
                        "and say how it is isolated (exit 1 when it cannot be isolated)")
    p.set_defaults(func=cmd_grade)
    return p
