# Planted bug: a causal mask off by one (each query may not attend to its own position).


def causal_mask(n_q, n_k=None):
    n_k = n_q if n_k is None else n_k
    return np.tril(np.ones((n_q, n_k), dtype=bool), k=n_k - n_q - 1)
