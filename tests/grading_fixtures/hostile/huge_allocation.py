# Hostile (appended to the correct submission): allocations far beyond the memory limit.


def softmax_forward(x, *, axis=-1):
    big = np.ones((200_000, 100_000))          # 160 GB
    return big[: x.shape[0]], {}


def relu_forward(x):
    chunks = [np.empty(1 << 27) for _ in range(64)]     # 64 GiB, a GiB at a time
    return x, {"chunks": chunks}
