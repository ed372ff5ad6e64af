"""``numpytfmr check``: gradient-check every registered op against finite differences.

:func:`check_op` is the driver, shared by the command and tests/test_registry.py. It lives
above both the checker and the registry: the checker recognises ops through the registry,
so a driver inside ``registry/`` would close a loop between the folders.
"""
import time

from numpytfmr.run.cli import UsageError, nonnegative_int, one_line
from numpytfmr.run.options import command_parser

__all__ = ["add_command", "check_op", "cmd_check"]


def check_op(spec, *, seed=0, mode=None):
    """``[(case, result)]``: every case of one registered op (an :class:`OpSpec`) checked;
    cases marked ``check=False`` (forward-only edge cases such as logits of 1e4) skipped."""
    import numpy as np

    from numpytfmr.gradcheck import check_gradients
    from numpytfmr.registry import bind, input_names

    names = input_names(spec.forward)
    cases = spec.make_cases(np.random.default_rng(seed), np.float64)
    out = []
    for i, case in enumerate(cases):
        if not case.check:
            continue
        result = check_gradients(bind(spec.forward, case.kwargs), spec.backward, case.args,
                                 seed=seed + i, mode=mode or spec.mode,
                                 names=names[:len(case.args)])
        out.append((case, result))
    return out


def add_command(sub):
    p = command_parser(sub, "check")
    p.add_argument("--op", action="append", metavar="NAME",
                   help="check only this op (repeatable); default: every registered op")
    p.add_argument("--mode", choices=("full", "directional"), default=None,
                   help="compare every element, or directional derivatives (default: the op's own)")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of the random inputs and upstream gradients (default 0)")
    p.set_defaults(func=cmd_check)


def cmd_check(args):
    from numpytfmr.checking.report import format_rel_error
    from numpytfmr.registry import get, registry

    try:
        specs = [get(name) for name in args.op] if args.op else list(registry().values())
    except (KeyError, ValueError) as exc:
        raise UsageError(f"--op: {one_line(exc.args[0] if exc.args else exc)}") from None
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
            err = max((r.max_rel_error for r in rows if r.max_rel_error is not None), default=None)
            verdicts = {r.verdict for r in rows}
            verdict = next((v for v in ("FAIL", "INCONCLUSIVE", "PASS") if v in verdicts),
                           rows[0].verdict)
            if verdict not in ("NO GRADIENT", "NOT FLOAT"):
                table.append((spec.name, name, len(rows), err, verdict))
        table += [(spec.name, f"[{check}]", 1, None, "FAIL")
                  for _, res in results for check, ok, _ in res.structural if not ok]
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
