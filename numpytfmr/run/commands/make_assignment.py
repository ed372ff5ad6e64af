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


def cmd_make_assignment(args):
    from numpytfmr.grading import make_assignment

    names = [n for v in args.names for n in v.replace(",", " ").split() if n]
    paths = make_assignment(names, args.output, name=args.name, seed=args.seed,
                            hidden_seed=args.hidden_seed, weights=_weights(args.weight),
                            timeout=args.timeout)
    print(f"student skeleton:  {paths['skeleton']}\n                   {paths['notebook']}")
    print(f"autograder:        {paths['config']} (keep it from students: it holds the hidden seed)")
    print(f"                   {paths['setup']}, {paths['run']}, and a copy of numpytfmr")
    print("Gradescope: zip the contents of the autograder folder and upload it as the autograder.")
    return 0


def add_command(sub):
    p = sub.add_parser(
        "make-assignment", help="write a homework skeleton, its notebook and a Gradescope autograder",
        description="Make a student skeleton from the reference source (signatures and docstrings "
                    "kept, solutions replaced by raise NotImplementedError), a notebook version, a "
                    "grading config and Gradescope's setup.sh/run_autograder.")
    p.add_argument("names", nargs="+", metavar="NAMES",
                   help="ops (softmax, layernorm, attention, ...) or functions (causal_mask, ...)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--name", default="homework", help="file name of the skeleton (default homework)")
    p.add_argument("--seed", type=int, default=0, help="seed of the visible cases (default 0)")
    p.add_argument("--hidden-seed", type=int, default=None,
                   help="seed of the hidden cases (default: a random one, stored in grading.json)")
    p.add_argument("--weight", action="append", metavar="NAME=POINTS",
                   help="points of one name (repeatable; default 10 each)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    p.set_defaults(func=cmd_make_assignment)
