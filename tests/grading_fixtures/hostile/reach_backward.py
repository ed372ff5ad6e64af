# Hostile (appended to the correct submission): each backward reaches for the reference or an
# escape hatch by another route (the forwards are right), and returns a right answer if it got
# through. PACKAGE_DIR and ESCAPE_PATH are replaced by the test.
import gc
import os
import sys

_PKG = "PACKAGE_DIR"
_OK = dict(globals())          # the correct functions defined above


def softmax_backward(*args, **kwargs):       # list the package
    os.listdir(_PKG)
    return _OK["softmax_backward"](*args, **kwargs)


def relu_backward(*args, **kwargs):          # write outside the working directory
    with open("ESCAPE_PATH", "w") as f:
        f.write("escaped")
    return _OK["relu_backward"](*args, **kwargs)


def gelu_backward(*args, **kwargs):          # a shell
    if os.system("cat " + _PKG + "/__init__.py > /dev/null") != 0:
        raise RuntimeError("the shell failed")
    return _OK["gelu_backward"](*args, **kwargs)


def log_softmax_backward(*args, **kwargs):   # the grader's own process
    open(f"/proc/{os.getppid()}/cmdline", "rb").read()
    return _OK["log_softmax_backward"](*args, **kwargs)


def layernorm_backward(*args, **kwargs):     # drop the import blocker, put the package on the path
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Blocker"]
    sys.path.insert(0, os.path.dirname(_PKG))
    import importlib
    importlib.import_module("numpytfmr")
    return _OK["layernorm_backward"](*args, **kwargs)


def rmsnorm_backward(*args, **kwargs):       # a symbolic link to the package
    os.symlink(_PKG, "ref")
    open("ref/__init__.py").read()
    return _OK["rmsnorm_backward"](*args, **kwargs)


def linear_backward(*args, **kwargs):        # a relative path from the package's parent
    here = os.getcwd()
    try:
        os.chdir(os.path.dirname(_PKG))
        open(os.path.basename(_PKG) + "/__init__.py").read()
    finally:
        os.chdir(here)
    return _OK["linear_backward"](*args, **kwargs)


def embedding_backward(*args, **kwargs):     # the network
    import socket
    socket.socket().close()
    return _OK["embedding_backward"](*args, **kwargs)


def cross_entropy_backward(*args, **kwargs):  # NumPy reads the file
    np.fromfile(_PKG + "/__init__.py", dtype=np.uint8)
    return _OK["cross_entropy_backward"](*args, **kwargs)


def attention_backward(*args, **kwargs):     # the ctypes NumPy loaded before the submission
    sys.modules["numpy._core._internal"].ctypes.CDLL(None)
    return _OK["attention_backward"](*args, **kwargs)


def lora_linear_backward(*args, **kwargs):   # disarm the audit hook through the garbage collector
    hooks = [o for o in gc.get_objects() if type(o).__name__ == "function" and o.__name__ == "hook"]
    if not hooks:
        raise RuntimeError("no hook found")
    for hook in hooks:
        hook.__defaults__ = tuple(() for _ in hook.__defaults__)
    return _OK["lora_linear_backward"](*args, **kwargs)


def dpo_loss_backward(*args, **kwargs):      # a folder descriptor and a path relative to it
    fd = os.open(os.path.dirname(_PKG), os.O_RDONLY)
    try:
        os.close(os.open(os.path.basename(_PKG) + "/__init__.py", os.O_RDONLY, dir_fd=fd))
    finally:
        os.close(fd)
    return _OK["dpo_loss_backward"](*args, **kwargs)
