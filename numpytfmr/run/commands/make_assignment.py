"""``numpytfmr make-assignment NAMES... -o DIR``: a homework skeleton and its autograder."""


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


def cmd_make_assignment(args):
    from numpytfmr.grading import make_assignment

    names = [n for v in args.names for n in v.replace(",", " ").split() if n]
    paths = make_assignment(names, args.output, name=args.name, seed=args.seed,
                            hidden_seed=args.hidden_seed, weights=_weights(args.weight),
                            timeout=args.timeout, drop=_drops(args.drop), force=args.force,
                            new_seed=args.new_seed)
    print(f"student skeleton:  {paths['skeleton']}\n                   {paths['notebook']}")
    print(f"autograder:        {paths['config']} (keep it from students: it holds the hidden seed)")
    print(f"                   {paths['setup']}, {paths['run']}, and a copy of numpytfmr")
    print("Gradescope: zip the contents of the autograder folder and upload it as the autograder.")
    return 0


def add_command(sub):
    p = sub.add_parser(
        "make-assignment", help="write a homework skeleton, its notebook and a Gradescope autograder",
        description="Make a student skeleton from the reference (signatures, and docstrings that "
                    "say what is required and graded and what is only suggested; bodies replaced "
                    "by raise NotImplementedError), a notebook version, a grading config and "
                    "Gradescope's setup.sh/run_autograder. Refuses an existing, non-empty output "
                    "folder unless --force is given.")
    p.add_argument("names", nargs="+", metavar="NAMES",
                   help="ops (softmax, layernorm, attention, ...) or functions (causal_mask, ...)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--name", default="homework", help="file name of the skeleton (default homework)")
    p.add_argument("--seed", type=int, default=0, help="seed of the visible cases (default 0)")
    p.add_argument("--hidden-seed", type=int, default=None,
                   help="seed of the hidden cases (default: a random one, stored in grading.json; "
                        "with --force, the one of the existing grading.json)")
    p.add_argument("--weight", action="append", metavar="NAME=POINTS",
                   help="points of one name (repeatable; default 10 each)")
    p.add_argument("--drop", action="append", metavar="OP:OPTION[,OPTION...]",
                   help="leave options out of the assignment, e.g. --drop "
                        "lora_linear:dropout,rank_stabilized or --drop attention:bias "
                        "(repeatable): they vanish from the skeleton's signature and docstring, "
                        "the graded cases that use them are skipped, and grading.json records "
                        "the choice. Keyword options with a default and trailing inputs that "
                        "default to None can be dropped; dropping LoRA's dropout drops rng and "
                        "train with it")
    p.add_argument("--force", action="store_true",
                   help="write into an existing, non-empty folder (its skeleton, notebook and "
                        "autograder are replaced; the hidden seed of its grading.json is kept)")
    p.add_argument("--new-seed", action="store_true",
                   help="with --force: draw a new hidden seed instead of keeping the existing one")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    p.set_defaults(func=cmd_make_assignment)
