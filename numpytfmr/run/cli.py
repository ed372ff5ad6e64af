"""The ``numpytfmr`` command (``python -m numpytfmr`` is the same program).

Each sub-command is one small function ``cmd_<name>(args) -> exit status``; argparse
does the parsing. Heavy modules are imported inside the commands that need them, so
``numpytfmr --help`` stays instant.
"""
import argparse
import importlib
import importlib.util
import sys
import time


def _row_verdict(rows):
    verdicts = {r.verdict for r in rows}
    for v in ("FAIL", "INCONCLUSIVE", "PASS"):
        if v in verdicts:
            return v
    return rows[0].verdict


def cmd_check(args):
    from numpytfmr.checking.report import format_rel_error
    from numpytfmr.registry import get, registry
    from numpytfmr.registry.check import check_op

    specs = [get(name) for name in args.op] if args.op else list(registry().values())
    start = time.perf_counter()
    table, failures = [], []
    for spec in specs:
        results = check_op(spec, seed=args.seed, mode=args.mode)
        per_input = {}
        for case, res in results:
            for row in res.rows:
                per_input.setdefault((row.position, row.name), []).append(row)
            if not res.passed:
                failures.append((spec.name, case, res))
        for (_, name), rows in sorted(per_input.items()):
            errs = [r.max_rel_error for r in rows if r.max_rel_error is not None]
            err = max(errs) if errs else None
            verdict = _row_verdict(rows)
            if verdict in ("NO GRADIENT", "NOT FLOAT"):
                continue
            table.append((spec.name, name, len(rows), err, verdict))
        for case, res in results:
            for check, ok, message in res.structural:
                if not ok:
                    table.append((spec.name, f"[{check}]", 1, None, "FAIL"))
    width_op = max([len("op")] + [len(r[0]) for r in table])
    width_in = max([len("input")] + [len(r[1]) for r in table])
    print(f"{'op':<{width_op}}  {'input':<{width_in}}  cases  max rel error  verdict")
    for op, name, n, err, verdict in table:
        e = format_rel_error(err)
        print(f"{op:<{width_op}}  {name:<{width_in}}  {n:>5}  {e:>13}  {verdict}")
    for op, case, res in failures:
        print(f"\n--- {op}: case {case.label or '(unnamed)'} failed ---\n{res}")
    if any(err == 0.0 for *_, err, _ in table):
        print("(< noise: every difference is within the rounding error of the finite differences)")
    seconds = time.perf_counter() - start
    n_ops = len(specs)
    if failures:
        print(f"\n{len(failures)} failing case(s) in {n_ops} ops ({seconds:.1f} s, seed {args.seed})")
        return 1
    print(f"\nall {n_ops} ops pass ({seconds:.1f} s, mode {args.mode or 'per op'}, seed {args.seed})")
    return 0


# Modules of numpytfmr/run/commands/, in the order ``--help`` lists them. Each defines
# ``add_command(sub)``, which adds its sub-parser and sets ``func`` (a function of the
# parsed arguments returning the exit status). They import heavy modules lazily.
COMMANDS = ("train", "generate", "train_seq2seq", "lora", "dpo", "examples", "grade",
            "make_assignment", "bench")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="numpytfmr",
        description="The transformer and its training math in plain NumPy.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("check", help="gradient-check every registered op against finite differences")
    p.add_argument("--op", action="append", metavar="NAME",
                   help="check only this op (repeatable); default: every registered op")
    p.add_argument("--mode", choices=("full", "directional"), default=None,
                   help="compare every element, or directional derivatives (default: the op's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and upstream gradients")
    p.set_defaults(func=cmd_check)

    for name in COMMANDS:
        module = f"numpytfmr.run.commands.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module).add_command(sub)
    return parser


def _version():
    from numpytfmr import __version__
    return f"numpytfmr {__version__}"


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ValueError as exc:  # bad arguments that argparse cannot see (unknown op, ...)
        print(f"numpytfmr {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
