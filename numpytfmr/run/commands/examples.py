"""``numpytfmr examples [NAME ...] [--list]``: the notes' worked examples, recomputed.

Each example prints a table: the quantity, numpytfmr's value, what the notes print, and a
check column (``ok``; ``WRONG [n]`` where the notes' printed value or formula is wrong,
footnote ``[n]`` saying what is correct and which test shows it; ``-`` where the notes
print nothing to compare). The examples themselves live in ``numpytfmr.run.examples``.
"""
import time

from numpytfmr.run.cli import UsageError
from numpytfmr.run.options import command_parser


def add_command(sub):
    p = command_parser(sub, "examples")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="examples to run (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="list the examples with their sections and exit")
    p.set_defaults(func=cmd_examples)


def cmd_examples(args):
    from numpytfmr.run import examples

    valid = examples.example_names()
    unknown = [n for n in args.names if n.replace("-", "_") not in valid]
    if unknown:
        raise UsageError(f"unknown example {', '.join(map(repr, unknown))}; valid names: "
                         f"{', '.join(valid)}")
    if args.list and args.names:
        raise UsageError("--list lists every example; drop the names, or drop --list to run "
                         f"{', '.join(args.names)}")
    if args.list:
        width = max(len(n) for n in valid)
        for name in valid:
            section, title = examples.example_info(name)
            print(f"{name:<{width}}  {section}: {title}")
        return 0
    names = [n.replace("-", "_") for n in args.names] or valid
    start = time.perf_counter()
    n_rows = n_ok = n_wrong = n_differs = 0
    for name in names:
        ex = examples.run_example(name)
        print(examples.format_example(ex))
        print()
        n_rows += len(ex.rows)
        n_ok += sum(r.status == "ok" for r in ex.rows)
        n_wrong += sum(r.status == "WRONG" for r in ex.rows)
        n_differs += sum(r.status == "differs" for r in ex.rows)
    seconds = time.perf_counter() - start
    summary = (f"{len(names)} example(s), {n_rows} rows: {n_ok} agree with the notes, "
               f"{n_wrong} marked WRONG (a notes erratum)")
    if n_differs:
        summary += f", {n_differs} other disagreement(s) (measured)"
    print(f"{summary} ({seconds:.1f} s). docs/errata.md lists every erratum.")
    return 0
