# Hostile (appended to the correct submission): each forward reaches for the reference, the
# grading config or an escape hatch by another route, and returns a right answer if it got
# through. PACKAGE_DIR and CONFIG_PATH are replaced by the test.
import builtins
import importlib
import importlib.util
import io
import os
import sys

_PKG = "PACKAGE_DIR"
_OK = dict(globals())          # the correct functions defined above


def softmax_forward(*args, **kwargs):        # load the installed package under another name
    spec = importlib.util.spec_from_file_location("x", _PKG + "/__init__.py",
                                                  submodule_search_locations=[_PKG])
    ref = importlib.util.module_from_spec(spec)
    sys.modules["x"] = ref
    spec.loader.exec_module(ref)
    return ref.softmax_forward(*args, **kwargs)


def relu_forward(*args, **kwargs):           # open() a file of the package
    open(_PKG + "/activations.py").read()
    return _OK["relu_forward"](*args, **kwargs)


def gelu_forward(*args, **kwargs):           # os.open
    os.close(os.open(_PKG + "/__init__.py", os.O_RDONLY))
    return _OK["gelu_forward"](*args, **kwargs)


def log_softmax_forward(*args, **kwargs):    # io.FileIO
    io.FileIO(_PKG + "/__init__.py").read()
    return _OK["log_softmax_forward"](*args, **kwargs)


def layernorm_forward(*args, **kwargs):      # the grading config (the hidden seed)
    open("CONFIG_PATH").read()
    return _OK["layernorm_forward"](*args, **kwargs)


def rmsnorm_forward(*args, **kwargs):        # compile the package's source
    exec(compile(open(_PKG + "/norms.py").read(), "norms", "exec"), {})
    return _OK["rmsnorm_forward"](*args, **kwargs)


def linear_forward(*args, **kwargs):         # ctypes
    import ctypes
    ctypes.CDLL(None)
    return _OK["linear_forward"](*args, **kwargs)


def embedding_forward(*args, **kwargs):      # torch by name
    import torch  # noqa: F401
    return _OK["embedding_forward"](*args, **kwargs)


def cross_entropy_forward(*args, **kwargs):  # jax by name
    import jax  # noqa: F401
    return _OK["cross_entropy_forward"](*args, **kwargs)


def attention_forward(*args, **kwargs):      # __import__ through builtins
    ref = builtins.__import__("numpytfmr")
    return ref.attention_forward(*args, **kwargs)


def lora_linear_forward(*args, **kwargs):    # importlib.import_module
    ref = importlib.import_module("numpytfmr.lora")
    return ref.lora_linear_forward(*args, **kwargs)


def dpo_loss_forward(*args, **kwargs):       # another program reads it
    import subprocess
    subprocess.run(["cat", _PKG + "/__init__.py"], check=True, capture_output=True)
    return _OK["dpo_loss_forward"](*args, **kwargs)
