"""The copyable ``check_gradients`` call of a registered op, on the registry's own case."""
import inspect
import numbers

import numpy as np

__all__ = ["check_snippet"]


def _shape(a):
    if a is None:
        return "None"
    if isinstance(a, np.ndarray):
        kind = {"i": "int ", "u": "int ", "b": "bool "}.get(a.dtype.kind, "")
        return f"{kind}{a.shape}"
    return type(a).__name__


def _literal(v):
    if isinstance(v, (bool, np.bool_, str)) or v is None:
        return repr(v if not isinstance(v, np.bool_) else bool(v))
    if isinstance(v, numbers.Integral):
        return repr(int(v))
    if isinstance(v, numbers.Real):
        return repr(float(v))
    return None


def check_snippet(spec, *, seed=0):
    """Python source that gradient-checks ``spec``'s first checkable case, as the registry
    makes it (``make_cases(np.random.default_rng(seed), np.float64)``)."""
    cases = spec.make_cases(np.random.default_rng(seed), np.float64)
    index, case = next(((k, c) for k, c in enumerate(cases) if c.check), (0, cases[0]))
    fwd, bwd = spec.forward.__name__, spec.backward.__name__
    params = [p.name for p in inspect.signature(spec.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(case.args)]
    lines = ["import numpy as np"]
    kw = case.kwargs
    literal = {k: _literal(v) for k, v in kw.items()}
    uses_bind = "rng" in kw
    uses_partial = bool(kw) and not uses_bind
    if uses_partial:
        lines.append("from functools import partial")
    lines.append(f"from numpytfmr import check_gradients, {fwd}, {bwd}")
    lines.append("from numpytfmr.registry import " + ("bind, get" if uses_bind else "get"))
    lines.append("")
    label = f": {case.label}" if case.label else ""
    lines.append(f"# the registry's example case {index}{label}")
    lines.append(f'case = get("{spec.name}").make_cases(np.random.default_rng({seed}), np.float64)[{index}]')
    row = []
    for n, a in zip(params, case.args):
        item = f"{n} {_shape(a)}"
        if row and len("#  " + "   ".join(row + [item])) > 88:
            lines.append("# " + "   ".join(row))
            row = []
        row.append(item)
    if row:
        lines.append("# " + "   ".join(row))
    if uses_bind:
        lines.append(f"forward = bind({fwd}, case.kwargs)  # an int rng becomes a fresh Generator per call")
    elif uses_partial:
        args = ", ".join(f"{k}={literal[k]}" if literal[k] is not None else f'{k}=case.kwargs["{k}"]'
                         for k in kw)
        lines.append(f"forward = partial({fwd}, {args})")
    else:
        lines.append(f"forward = {fwd}")
    names = "(" + ", ".join(f'"{n}"' for n in params) + ("," if len(params) == 1 else "") + ")"
    call = f'result = check_gradients(forward, {bwd}, case.args, names={names}, mode="{spec.mode}")'
    if len(call) > 92:
        call = (f"result = check_gradients(forward, {bwd}, case.args,\n"
                f'                         names={names},\n                         mode="{spec.mode}")')
    lines.append(call)
    lines.append("print(result)")
    return "\n".join(lines) + "\n"
