"""Where the errors are: rows of repeated ids, entries picked by targets, positions a mask
hides, and a rotation by the wrong angle (docs/gradcheck.md, "Diagnoses")."""
import numpy as np

from .evidence import Diagnosis

__all__ = ["id_diagnoses", "mask_diagnoses", "rotation_diagnoses"]


def _list(values, limit=6):
    values = [int(v) for v in values]
    text = ", ".join(str(v) for v in values[:limit])
    return text + (", ..." if len(values) > limit else "")


def id_diagnoses(ev):
    """Wrong rows that are exactly rows of repeated ids (``dtable[ids] += dout`` keeps one
    occurrence per id), or wrong entries that are exactly those the targets pick (the
    one-hot term)."""
    case = ev.case
    if case is None or ev.a.ndim < 1 or not ev.fail.any():
        return []
    out = []
    for q, ids in case.ints():
        name = case.names[q]
        n_rows = ev.shape[0]
        valid = (ids >= 0) & (ids < n_rows)
        # ids index the rows of this input: out = table[ids], of shape ids.shape + table.shape[1:]
        lookup = case.out.shape == ids.shape + ev.shape[1:]
        if lookup and ids.size >= 2 and valid.any():
            counts = np.bincount(ids[valid].reshape(-1), minlength=n_rows)
            repeated = np.flatnonzero(counts >= 2)
            wrong = np.flatnonzero(ev.fail.reshape(n_rows, -1).any(axis=1))     # rows with errors
            if repeated.size and wrong.size and set(wrong) <= set(repeated):
                out.append(Diagnosis(
                    f"the error is confined to the rows of ids that occur more than once in {name} "
                    f"(rows {_list(wrong)}): repeated ids must accumulate -- use np.add.at(d, {name}, "
                    f"dout); `d[{name}] += dout` keeps only one occurrence of each id", "repeated_ids"))
                continue
        # targets pick one entry per row: logits[..., targets]
        if ev.a.ndim >= 1 and ids.shape == ev.shape[:-1] and ev.shape[-1] >= 2:
            picked = ids[..., None] == np.arange(ev.shape[-1])      # out-of-range ids pick none
            if picked.any() and not (ev.fail & ~picked).any():
                out.append(Diagnosis(
                    f"only the entries picked by {name} are wrong (one per row, at the target class): "
                    f"the one-hot term is missing or wrong there -- for cross-entropy dlogits = "
                    f"(softmax(logits) - onehot({name})) * dout / N", "picked_entries"))
    return out


def mask_diagnoses(ev):
    """Errors on exactly the rows a mask touches: keys hidden from some query (for an input
    whose rows are keys), queries with hidden keys (for an input whose rows are queries),
    found by probing which output rows depend on which input rows."""
    case = ev.case
    if case is None or ev.a.ndim < 2 or case.out.ndim < 2 or not ev.fail.any():
        return []
    hidden = _hidden_pairs(case)
    if hidden is None or case.p not in hidden["role"]:
        return []
    role = hidden["role"][case.p]
    touched = hidden["keys"] if role == "key" else hidden["queries"]
    what = "keys hidden from some query" if role == "key" else "queries with hidden keys"
    wrong = ev.fail.any(axis=-1)                  # (..., rows) of this input
    size = ev.shape[-2]
    if touched.shape[-1] != size:
        return []
    try:
        shape = np.broadcast_shapes(touched.shape, wrong.shape)
        touched_b, wrong_b = np.broadcast_to(touched, shape), np.broadcast_to(wrong, shape)
    except ValueError:
        touched_b = touched.reshape(-1, size).any(axis=0)
        wrong_b = wrong.reshape(-1, size).any(axis=0)
    if touched_b.all() or not touched_b.any() or not np.array_equal(wrong_b, touched_b):
        return []                    # the mask touches every row or none, or other rows are wrong
    positions = _list(np.flatnonzero(wrong_b.reshape(-1, size).any(axis=0)))
    return [Diagnosis(
        f"the error is confined to positions a mask touches: the wrong rows of {case.name} "
        f"({positions}) are exactly the {what}, and every row the mask leaves alone is right -- "
        "masked positions contribute in the backward: apply the mask to the weights (or scores) "
        "recomputed in the backward too, so that a masked entry has weight 0 and gradient 0",
        "mask")]


def _hidden_pairs(case):
    """Which output row depends on which input row (axis -2), found by moving one row at a
    time. Returns {"keys": (..., n_k) hidden from some query, "queries": (..., n_q) with
    hidden keys, "role": position -> "key" | "query"}, or None. Keys: the union over the
    inputs with n_k rows (a query with one allowed key ignores that key, not its value);
    a query input is one whose every output row depends on its own row only."""
    def probe():
        out = case.out
        finite = np.isfinite(out)
        base = np.where(finite, out, 0.0)
        size = float(np.max(np.abs(base))) if base.size else 0.0
        rng = np.random.default_rng(7)
        deps, groups = {}, {}
        for q, F in enumerate(case.inputs):
            if not (isinstance(F, np.ndarray) and F.dtype.kind == "f" and F.ndim >= 2):
                continue
            n_k = F.shape[-2]
            if n_k < 2 or n_k > 64:
                continue
            depends = []
            for j in range(n_k):
                moved = F.copy()
                moved[..., j, :] += (0.5 * (np.std(F) + 1e-3)
                                     * rng.standard_normal(moved[..., j, :].shape))
                y = case.run(**{str(q): moved})
                if y is None:
                    return None
                changed = np.abs(np.where(finite, y, 0.0) - base) > 1e-12 * (size + 1e-300)
                depends.append(changed.any(axis=-1))      # (..., n_q): out row i depends on row j
            dep = np.stack(depends, axis=-1)              # (..., n_q, n_k)
            deps[q] = dep
            if np.all(dep.sum(axis=-1) <= 1):
                continue                                  # row-wise (a query input): no mask here
            try:
                groups[n_k] = groups[n_k] | dep if n_k in groups else dep
            except ValueError:
                continue
        for n_k, dep in groups.items():
            if dep.all():
                continue                                  # no mask
            sees = dep.any(axis=-1, keepdims=True)        # query rows that see some key
            keys = (~dep & sees).any(axis=-2)
            queries = (~dep & sees).any(axis=-1)
            if not keys.any():
                continue
            n_q = dep.shape[-2]
            role = {}
            for q, d in deps.items():
                if d.shape[-1] == n_k and not np.all(d.sum(axis=-1) <= 1):
                    role[q] = "key"
                elif d.shape[-1] == n_q and np.all(d.sum(axis=-1) <= 1):
                    role[q] = "query"
            return {"keys": keys, "queries": queries, "role": role}
        return None
    return case.memo(("hidden",), probe)


def rotation_diagnoses(ev):
    """The analytic gradient is the numeric one rotated within each pair of features
    (``(2k, 2k+1)`` or ``(k, k + d/2)``): dout rotated by ``+theta`` instead of ``-theta``."""
    if ev.a.ndim < 2 or ev.shape[-1] < 4 or ev.shape[-1] % 2 or not ev.fail.any():
        return []                                 # (..., positions, features), at least two pairs
    d = ev.shape[-1]
    for layout, first, second in (("interleaved pairs (2k, 2k+1)", slice(0, d, 2), slice(1, d, 2)),
                                  ("half-split pairs (k, k + d/2)", slice(0, d // 2), slice(d // 2, d))):
        na = np.hypot(ev.a[..., first], ev.a[..., second])
        nn = np.hypot(ev.n[..., first], ev.n[..., second])
        if not ev.close(na, nn) or float(np.std(nn)) <= 1e-3 * float(np.mean(nn)):
            continue                              # lengths differ, or all equal (proves nothing)
        # not merely equal or negated pairs (a sign is reported as a factor)
        if ev.close(ev.a, -ev.n):
            return []
        text = (f"in every pair of features ({layout}) your gradient has the right length but "
                "points in another direction: it is rotated -- a rotation in the wrong direction: "
                "the backward of out = R(theta) x is dx = R(theta)^T dout = R(-theta) dout "
                "(rotate by -theta: negate the sines)")
        if ev.a.ndim >= 2 and ev.shape[-2] >= 2:
            err = np.abs(ev.r).max(axis=tuple(i for i in range(ev.a.ndim) if i != ev.a.ndim - 2))
            if err[0] <= ev.tol and np.all(err[1:] > ev.tol):
                text += ("; the error vanishes at position 0 (theta = 0) and appears at every "
                         "later position")
        return [Diagnosis(text, "rotation")]
    return []
