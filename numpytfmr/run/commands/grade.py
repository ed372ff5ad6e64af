"""``numpytfmr grade SUBMISSION``: grade homework against the reference.

    numpytfmr grade homework.py [--only NAMES] [--timeout S] [--json results.json] [--seed N]
                                [--config grading.json] [--hidden-seed N] [--memory-mb M]

Exit status: 0 when every test passes, 1 when any fails, 2 for a usage error.
"""


def _names(values):
    out = []
    for group in values or []:
        for v in group:
            out += [n for n in v.replace(",", " ").split() if n]
    return out


def cmd_grade(args):
    from numpytfmr.run.fileio import write_json
    from numpytfmr.grading import grade

    only = _names(args.only)
    report = grade(args.submission, only=only or None, config=args.config, seed=args.seed,
                   hidden_seed=args.hidden_seed, timeout=args.timeout, memory_mb=args.memory_mb,
                   log=None)
    print(report.table(details=not args.brief))
    if args.json:
        write_json(args.json, report.gradescope())
        print(f"results written to {args.json}")
    return 0 if report.passed else 1


def add_command(sub):
    p = sub.add_parser(
        "grade", help="grade a homework submission (.py or .ipynb) against the reference",
        description="Run the functions a submission defines in a separate, limited process and "
                    "compare them with the reference on the op registry's cases: forward outputs, "
                    "every gradient, and the backward against finite differences of the "
                    "submission's own forward.")
    p.add_argument("submission", help="a .py file, a .ipynb notebook, or a folder holding one")
    p.add_argument("--only", action="append", nargs="+", metavar="NAMES",
                   help="grade only these ops/functions (e.g. softmax attention, or causal_mask); "
                        "commas or spaces separate names")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds allowed per case, and for loading the submission (default 10)")
    p.add_argument("--json", metavar="FILE", help="also write a Gradescope results.json here (atomically)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="seed of the visible cases (default 0)")
    p.add_argument("--hidden-seed", type=int, default=None, metavar="N",
                   help="seed of hidden cases, shown to students after the due date")
    p.add_argument("--config", metavar="FILE", help="a grading.json from make-assignment")
    p.add_argument("--memory-mb", type=int, default=None, metavar="M",
                   help="address-space limit of the submission process (default 2048)")
    p.add_argument("--brief", action="store_true", help="the table only, without failure details")
    p.set_defaults(func=cmd_grade)
