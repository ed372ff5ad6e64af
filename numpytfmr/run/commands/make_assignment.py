"""``numpytfmr make-assignment NAMES... -o DIR``: a homework skeleton and its autograder."""
import os

from numpytfmr.run.options import add_force, command_parser


def _weights(values):
    weights = {}
    for v in values or []:
        name, sep, w = v.partition("=")
        try:
            weights[name.strip()] = float(w)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--weight {v!r}: expected NAME=POINTS, e.g. attention=20")
    return weights


def _hidden(values):
    """``--hidden NAME:SPEC`` (repeatable) -> {name: spec}; SPEC is auto, none, all, redraw or
    case indices/labels separated by commas."""
    out = {}
    for v in values or []:
        name, sep, spec = v.partition(":")
        spec = spec.strip()
        if not sep or not name.strip() or not spec:
            raise ValueError(f"--hidden {v!r}: expected NAME:auto|none|all|redraw|CASE[,CASE...], "
                             "e.g. softmax:all or attention:3,5")
        if spec not in ("auto", "none", "all", "redraw"):
            spec = [int(c) if c.strip().isdigit() else c.strip() for c in spec.split(",") if c.strip()]
        out[name.strip()] = spec
    return out


def _drops(values):
    """``--drop OP:OPTION[,OPTION...]`` (repeatable) -> {op: [options]}."""
    drop = {}
    for v in values or []:
        name, sep, options = v.partition(":")
        options = [o.strip() for o in options.split(",") if o.strip()]
        if not sep or not name.strip() or not options:
            raise ValueError(f"--drop {v!r}: expected OP:OPTION[,OPTION...], e.g. "
                             "lora_linear:dropout,rank_stabilized")
        drop.setdefault(name.strip(), []).extend(options)
    return drop


def _late(args):
    """The ``"late"`` entry of grading.json from --due and --late-penalty, or None."""
    if args.late_penalty and not args.due:
        raise ValueError("--late-penalty needs --due (the due date it counts from)")
    if not args.due:
        return None
    late = {"due": args.due, "penalty_percent": 0.0, "per": "day"}
    if args.late_penalty:
        amount, sep, per = args.late_penalty.partition("/")
        try:
            late["penalty_percent"] = float(amount.strip().rstrip("%"))
        except ValueError:
            sep = ""
        if not sep or per.strip() not in ("day", "hour"):
            raise ValueError(f"--late-penalty {args.late_penalty!r}: expected PERCENT/day or "
                             "PERCENT/hour, e.g. 10/day")
        late["per"] = per.strip()
    if args.late_max is not None:
        late["max_percent"] = args.late_max
    if args.grace_minutes is not None:
        late["grace_minutes"] = args.grace_minutes
    return late


def cmd_make_assignment(args):
    from numpytfmr.grading import make_assignment

    names = [n for v in args.names for n in v.replace(",", " ").split() if n]
    paths = make_assignment(names, args.output, name=args.name, seed=args.seed,
                            hidden_seed=args.hidden_seed, weights=_weights(args.weight),
                            timeout=args.timeout, drop=_drops(args.drop), force=args.force,
                            new_seed=args.new_seed, submission=args.submission,
                            allow_modules=[m for v in args.allow_module or [] for m in
                                           v.replace(",", " ").split()],
                            late=_late(args), gradescope_tests=args.gradescope_tests,
                            hidden=_hidden(args.hidden))
    for note in paths["notes"]:
        print(f"note: {note}")
    print(f"for students:      {paths['student']}{os.sep}  (hand out this folder)")
    print(f"                   {os.path.basename(paths['skeleton'])}, "
          f"{os.path.basename(paths['notebook'])}: the skeleton")
    print("                   check.py + judge.py + check_data.*: the self-check on the visible cases "
          f"(python check.py {os.path.basename(paths['skeleton'])}; needs only NumPy)")
    print(f"autograder:        {paths['config']} (keep it from students: it holds the hidden seed)")
    print(f"                   {paths['setup']}, {paths['run']}, and a copy of numpytfmr")
    print(f"Gradescope:        upload {paths['zip']} as the autograder (its total is the sum of "
          "the weights)")
    return 0


def add_command(sub):
    p = command_parser(sub, "make-assignment")
    p.add_argument("names", nargs="+", metavar="NAMES",
                   help="ops (softmax, layernorm, attention, ...) or functions (causal_mask, ...)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--name", default="homework", help="file name of the skeleton (default homework)")
    p.add_argument("--seed", type=int, default=0, help="seed of the visible cases (default 0)")
    p.add_argument("--hidden-seed", type=int, default=None,
                   help="seed of the hidden cases (default: a random one, stored in grading.json; "
                        "with --force, the one of the existing grading.json)")
    for flag, metavar, help in (      # the repeatable choices of what is graded, and how
            ("--weight", "NAME=POINTS",
             "points of one name (repeatable; default 10 each): an op (its forward gets 40%%, "
             "its backward 60%%), one function of a pair (softmax_backward=8), or a helper"),
            ("--hidden", "NAME:SPEC",
             "which cases of NAME are hidden (graded, shown after the due date; repeatable): "
             "auto (default: the last third, the registry's edge cases), none, all, redraw "
             "(every case visible, and each again with other values), or case numbers/labels, "
             "e.g. attention:3,5"),
            ("--drop", "OP:OPTION[,OPTION...]",
             "leave options out of the assignment, e.g. --drop lora_linear:dropout,"
             "rank_stabilized or --drop attention:bias (repeatable): they vanish from the "
             "skeleton's signature and docstring, the graded cases that use them are skipped, "
             "and grading.json records the choice. Keyword options with a default and trailing "
             "inputs that default to None can be dropped; dropping LoRA's dropout drops rng and "
             "train with it")):
        p.add_argument(flag, action="append", metavar=metavar, help=help)
    add_force(p, "write into an existing, non-empty folder (its skeleton, notebook and "
              "autograder are replaced; the hidden seed of its grading.json is kept)")
    p.add_argument("--new-seed", action="store_true",
                   help="with --force: draw a new hidden seed instead of keeping the existing one")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    p.add_argument("--submission", metavar="FILE",
                   help="the file name students hand in (e.g. homework.ipynb), recorded in "
                        "grading.json: when a submission holds several files, this one is graded")
    p.add_argument("--allow-module", action="append", metavar="NAME",
                   help="a module submissions may import besides NumPy and the standard library "
                        "(repeatable, e.g. --allow-module scipy), recorded in grading.json")
    p.add_argument("--due", metavar="TIME",
                   help="the due date, e.g. 2026-12-01T23:59:00+01:00 (UTC without an offset): "
                        "with --late-penalty, the late policy grade DIR --csv applies")
    p.add_argument("--late-penalty", metavar="PERCENT/UNIT",
                   help="percent of the score lost per started day or hour late, e.g. 10/day")
    p.add_argument("--late-max", type=float, default=None, metavar="PERCENT",
                   help="the most a late submission loses (default 100)")
    p.add_argument("--grace-minutes", type=float, default=None, metavar="M",
                   help="minutes after the due date that are not late (default 0)")
    p.add_argument("--gradescope-tests", choices=("function", "case"), default="function",
                   help="Gradescope test boxes: one per function, its cases in the output "
                        "(default), or one per case")
    p.set_defaults(func=cmd_make_assignment)
