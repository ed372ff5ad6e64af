"""The class grader's cost: ``numpytfmr bench --grading-class N``.

Builds a class as an instructor meets one (``make-assignment`` with the ten pairs of
:data:`OPS`; N submissions written from the reference's own code by
:func:`reference_homework`, every ``buggy_every``-th with a :func:`planted_bug`) and grades it
with ``numpytfmr grade ... --summary FILE`` in a process of its own; the figures are that
command's own summary, with the CPU time of the grade process tree beside them as a
cross-check. docs/performance.md, "Grading a class", says what is measured and why.
"""
import ast
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
import types

OPS = ("linear", "relu", "gelu", "softmax", "log_softmax", "cross_entropy", "layernorm",
       "rmsnorm", "embedding", "attention")
BUGS = ("forward scaled", "backward sign", "backward halved", "forward fails")
TARGET_WALL_SECONDS = 200.0          # for a class of 200 on an idle 2-core machine (issue #35)
TARGET_CPU_PER_SUBMISSION = 1.7
TARGET_CLASS = 200


# --- the submissions -------------------------------------------------------------------------

def _plain(fn):
    """The function under its decorators (the contract layer's wrappers)."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _names_used(code):
    """Global names a code object (and the functions defined inside it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _source(fn):
    """The source of ``fn`` without decorators."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    node.decorator_list = []
    return ast.unparse(node)


def reference_homework(ops=OPS):
    """A submission that implements the forward and backward of each op in ``ops`` with the
    reference's own code, as one NumPy-only source file: each function without its contract
    decorators, and every module-level function, constant and import it needs."""
    from ..grading.cases import resolve
    imports, constants, defined, order = set(), {}, {}, []

    def need(name, value, where):
        if isinstance(value, types.ModuleType):
            top = value.__name__
            if top.partition(".")[0] not in ("numpy", "math"):
                raise ValueError(f"{where} uses the module {top}, which a submission may not import")
            imports.add(f"import {top}" + (f" as {name}" if name != top else ""))
        elif isinstance(value, types.FunctionType) and value.__module__.startswith("numpytfmr"):
            add(value, name)
        elif callable(value) and getattr(value, "__module__", "") and \
                value.__module__.partition(".")[0] in ("numpy", "math"):
            mod = "math" if value.__module__ == "math" else "numpy"
            imports.add(f"from {mod} import {value.__name__}"
                        + (f" as {name}" if name != value.__name__ else ""))
        elif isinstance(value, (int, float, str, tuple, frozenset, bool)) or value is None:
            if constants.get(name, value) != value:
                raise ValueError(f"two different constants named {name}")
            constants[name] = value
        else:
            raise ValueError(f"{where} uses {name} ({type(value).__name__}), which cannot be "
                             "written into a submission")

    def add(fn, name=None):
        fn = _plain(fn)
        name = name or fn.__name__
        key = (fn.__module__, fn.__qualname__)
        if name in defined:
            if defined[name] != key:
                raise ValueError(f"two different functions named {name}")
            return
        defined[name] = key
        for used in sorted(_names_used(fn.__code__)):
            if used in fn.__globals__:
                need(used, fn.__globals__[used], fn.__qualname__)
        text = _source(fn)
        if name != fn.__name__:
            text = text.replace(f"def {fn.__name__}(", f"def {name}(", 1)
        order.append(text)

    for op in ops:
        spec = resolve(op).spec
        add(spec.forward)
        add(spec.backward)
    head = ['"""A correct homework, written from the reference\'s own code (numpytfmr bench '
            '--grading-class)."""'] + sorted(imports)
    consts = [f"{k} = {v!r}" for k, v in sorted(constants.items())]
    return "\n".join(head + [""] + consts + [""] + ["\n\n" + t for t in order]) + "\n"


def _around(name, args, body):
    """Source that renames ``name`` to ``_right_<name>`` and defines ``name(args)`` as
    ``body`` (which calls the right one)."""
    return (f"\n_right_{name} = {name}\n\n\ndef {name}({args}):\n"
            + textwrap.indent(textwrap.dedent(body).lstrip("\n"), "    "))


def planted_bug(k, ops=OPS):
    """``(description, source)``: the ``k``-th planted bug, appended to a correct homework; the
    op and the kind of bug vary with ``k`` (:data:`BUGS`)."""
    from ..grading.cases import resolve
    kind = BUGS[k % len(BUGS)]
    fwd, bwd = resolve(ops[(k // len(BUGS) + 3 * k) % len(ops)]).functions
    if kind == "forward scaled":
        return f"{fwd} returns 1.5 times the output", _around(fwd, "*args, **kwargs", f"""
            out, cache = _right_{fwd}(*args, **kwargs)
            return out * 1.5, cache
            """)
    if kind == "forward fails":
        return f"{fwd} raises on inputs of an odd total size", _around(fwd, "*args, **kwargs", f"""
            if sum(getattr(a, "size", 1) for a in args) % 2:
                raise ValueError("a planted bug")
            return _right_{fwd}(*args, **kwargs)
            """)
    factor = -1.0 if kind == "backward sign" else 0.5
    return f"{bwd} returns the gradients times {factor:g}", _around(bwd, "dout, cache", f"""
        grads = _right_{bwd}(dout, cache)
        if isinstance(grads, tuple):
            return tuple(None if g is None else g * {factor} for g in grads)
        return grads * {factor}
        """)


def build_class(folder, n, *, buggy_every=4, ops=OPS, env=None):
    """Write the assignment (``folder``/assignment, by ``numpytfmr make-assignment``) and ``n``
    submissions (``folder``/class/student-NNN.py); return ``(config path, class folder,
    {student: planted bug or ""})``."""
    assignment = os.path.join(folder, "assignment")
    subprocess.run([sys.executable, "-m", "numpytfmr", "make-assignment", *ops, "-o", assignment],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    correct = reference_homework(ops)
    subs = os.path.join(folder, "class")
    os.makedirs(subs, exist_ok=True)
    planted = {}
    for i in range(n):
        student = f"student-{i + 1:03d}"
        bug, extra = ("", "")
        if buggy_every and i % buggy_every == buggy_every - 1:
            bug, extra = planted_bug(i // buggy_every, ops)
        with open(os.path.join(subs, student + ".py"), "w", encoding="utf-8") as f:
            f.write(correct + extra)
        planted[student] = bug
    return os.path.join(assignment, "autograder", "grading.json"), subs, planted


# --- grading it ---------------------------------------------------------------------------------

def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def package_env():
    """The environment for the subprocesses: this copy of numpytfmr first on the path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return env


def run_grading_class(n=TARGET_CLASS, *, jobs=2, isolation="bubblewrap", on_line=None):
    """Build a class of ``n`` (:func:`build_class`), grade it with ``numpytfmr grade`` as a
    subprocess, and return the figures (a dict; ``grade_summary`` is the command's own).

    isolation: the ``--isolation`` of the grade command (bubblewrap, as on Gradescope)
    on_line: a callable taking each line the grade command prints, or None
    """
    if n < 1:
        raise ValueError(f"the class has {n} submissions; expected at least 1")
    env = package_env()
    with tempfile.TemporaryDirectory(prefix="numpytfmr-bench-class-") as folder:
        t0 = time.monotonic()
        config, subs, planted = build_class(folder, n, env=env)
        build_seconds = time.monotonic() - t0
        summary_path = os.path.join(folder, "summary.json")
        argv = [sys.executable, "-m", "numpytfmr", "grade", subs, "--config", config, "--csv",
                os.path.join(folder, "grades.csv"), "--jobs", str(jobs), "--isolation",
                isolation, "--summary", summary_path]
        cpu0, t0 = _children_cpu(), time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        tail = []
        for line in proc.stdout:
            tail = (tail + [line.rstrip("\n")])[-20:]
            if on_line is not None:
                on_line(line.rstrip("\n"))
        rc = proc.wait()
        wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
        if rc not in (0, 1) or not os.path.exists(summary_path):
            raise RuntimeError(f"numpytfmr grade exited with status {rc}: " + " | ".join(tail[-5:]))
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
        scores = _scores(os.path.join(folder, "grades.csv"))
    return figures(summary, planted=planted, scores=scores, process_cpu=cpu,
                   process_wall=wall, build_seconds=build_seconds, argv=argv)


def _scores(csv_path):
    import csv
    with open(csv_path, encoding="utf-8", newline="") as f:
        return {r["student"]: (r["score"], r["max_score"], r["status"]) for r in csv.DictReader(f)}


def figures(summary, *, planted, scores, process_cpu, process_wall, build_seconds=0.0, argv=()):
    """The benchmark's figures from the grade command's ``summary`` and what the run saw."""
    n = summary["submissions"]
    points = {s: float(scores[s][0]) for s in planted if s in scores and scores[s][0] != ""}
    correct = sorted(points[s] for s, bug in planted.items() if not bug and s in points)
    caught = [s for s, bug in planted.items() if bug and s in points and correct
              and points[s] < correct[0]]
    per = summary["cpu_seconds"] / n if n else 0.0
    scale = TARGET_CLASS / n if n else 0.0
    return {
        "submissions": n, "jobs": summary["jobs"], "isolation": summary["isolation"],
        "buggy": sum(bool(b) for b in planted.values()),
        "graded": summary["statuses"].get("graded", 0),
        "correct_scores": [correct[0], correct[-1]] if correct else None,
        "buggy_below_correct": len(caught),
        "wall_seconds": summary["seconds"],
        "cpu_seconds": summary["cpu_seconds"],
        "cpu_seconds_per_submission": round(per, 3),
        **{k: summary[k] for k in ("start_seconds_per_submission", "wall_seconds_per_submission")},
        **{k: summary.get(k) for k in ("sandbox_cpu_seconds_per_submission",
                                      "grader_cpu_seconds_per_submission",
                                      "processes_per_submission")},
        "run_cpu_seconds": round(process_cpu, 3),
        "run_wall_seconds": round(process_wall, 2),
        "build_seconds": round(build_seconds, 2),
        "wall_seconds_at_200_from_cpu": round(scale * summary["cpu_seconds"]
                                              / max(min(summary["jobs"], os.cpu_count() or 1), 1), 1),
        "targets": {"wall_seconds": TARGET_WALL_SECONDS, "class": TARGET_CLASS,
                    "cpu_seconds_per_submission": TARGET_CPU_PER_SUBMISSION},
        "command": " ".join(argv), "grade_summary": summary,
    }


def report_lines(f):
    """The figures as readable lines."""
    t = f["targets"]
    n = f["submissions"]
    lines = [f"class of {n} ten-pair submissions ({f['buggy']} with a planted bug), "
             f"{', '.join(f['isolation'])}, --jobs {f['jobs']}: numpytfmr grade's own --summary",
             f"  wall time            {f['wall_seconds']:9.1f} s   ({f['wall_seconds_per_submission']:.2f} s "
             "a submission, per worker)",
             f"  CPU time             {f['cpu_seconds']:9.1f} s   ({f['cpu_seconds_per_submission']:.2f} s "
             "a submission)"]
    if f.get("sandbox_cpu_seconds_per_submission") is not None:
        lines.append(f"    of which            submission processes {f['sandbox_cpu_seconds_per_submission']:.2f} s, "
                     f"grading (the reference, the judging) {f['grader_cpu_seconds_per_submission']:.2f} s")
    lines += [f"  sandbox start-up     {f['start_seconds_per_submission']:9.3f} s a submission"
              + (f"   ({f['processes_per_submission']:.2f} processes a submission)"
                 if f.get("processes_per_submission") is not None else ""),
              f"  the grade command as the operating system counts its children: "
              f"{f['run_cpu_seconds']:.1f} s CPU, {f['run_wall_seconds']:.1f} s wall (without the "
              "sandboxed Pythons: their PID namespace reaps them, so no parent's count holds them)",
              f"  scores: correct submissions {_span(f['correct_scores'])}; planted bugs scoring below "
              f"every correct one: {f['buggy_below_correct']} of {f['buggy']}"]
    ok_cpu = f["cpu_seconds_per_submission"] <= t["cpu_seconds_per_submission"]
    lines.append(f"  target: <= {t['cpu_seconds_per_submission']} CPU-s a submission: "
                 f"{'met' if ok_cpu else 'NOT met'}")
    if n == t["class"]:
        ok = f["wall_seconds"] <= t["wall_seconds"]
        lines.append(f"  target: <= {t['wall_seconds']:g} s for {t['class']} on an idle 2-core "
                     f"machine: {'met' if ok else 'NOT met'}")
    else:
        lines.append(f"  a class of {t['class']} needs at least {f['wall_seconds_at_200_from_cpu']:.0f} s "
                     f"of wall time at this CPU time on {f['jobs']} busy cores (target "
                     f"{t['wall_seconds']:g} s: measured with a class of {t['class']} on an idle machine)")
    lines.append(f"command: {f['command']}")
    return lines


def _span(pair):
    if not pair:
        return "-"
    return f"{pair[0]:g}" if pair[0] == pair[1] else f"{pair[0]:g} to {pair[1]:g}"
