"""The process that runs a submission: loads it, calls its functions on request, answers.

The grader starts this file's source as ``python -I -S -c SOURCE REQUEST_FD ANSWER_FD SETUP``
(see sandbox.py for where: a bubblewrap sandbox, a user ID of its own, or neither). SETUP is
JSON: the folders to put on ``sys.path`` (NumPy's) and, as root inside the sandbox, the user ID
to drop to before anything is imported. The first request is the job: the code to run, in
chunks (one for a .py file, one per code cell of a notebook), and the paths to protect. This
file imports only the standard library and NumPy, never numpytfmr. Before the submission
loads, it installs an audit hook (below) as defence in depth: the isolation that holds is the
operating system's.

Messages in both directions are frames (:func:`frame`): two little-endian 8-byte lengths, a
JSON header (``meta`` and, per array, its key, dtype and shape), then the arrays' raw bytes.
The grader checks the declared shapes and dtypes against its size cap before it allocates
anything, and judges everything itself: this process only runs student code and reports what
came back (or what went wrong).

Student code can replace attributes of NumPy or ``builtins``; the values this script needs
are saved before the submission is loaded and put back after each call, so a monkeypatch
cannot break the answer channel (it still affects the student's own results).
"""
import builtins
import inspect
import io
import json
import linecache
import os
import struct
import sys
import time
import traceback
import types

if __name__ == "__main__":           # started by the grader: its set-up comes first
    _SETUP = json.loads(sys.argv[-1])
    sys.path[:0] = _SETUP["path"]
    if _SETUP["drop"]:               # root inside the sandbox: this submission's own user ID
        os.setgroups([])
        os.setgid(_SETUP["drop"][1])
        os.setuid(_SETUP["drop"][0])

import numpy as np

_BaseException = BaseException
_NotImplementedError = NotImplementedError
_MemoryError = MemoryError
_isinstance, _type, _len, _str = isinstance, type, len, str
_ndarray, _generic, _matrix = np.ndarray, np.generic, np.matrix

# Packages a submission may not import: the reference itself, the automatic-differentiation
# libraries a backward could be delegated to, and modules that reach around Python's checks.
REFERENCE = ("numpytfmr",)
AUTODIFF = ("torch", "functorch", "jax", "jaxlib", "flax", "autograd", "tensorflow", "keras",
            "mxnet", "paddle", "chainer", "theano", "aesara", "pytensor", "tinygrad", "mlx",
            "mygrad", "micrograd")
ESCAPES = ("ctypes", "_ctypes", "cffi", "_cffi_backend", "_xxsubinterpreters", "_xxinterpchannels",
           "_posixsubprocess")
BLOCKED = REFERENCE + AUTODIFF + ESCAPES
FOREIGN = ("ctypes", "_ctypes", "cffi", "_cffi_backend")   # what compiled libraries load with


def blocked_for(allowed):
    """The blocked packages when the instructor allows ``allowed`` (beyond NumPy): those minus
    the allowed, and minus ctypes and cffi, which compiled libraries such as SciPy load with
    (the operating system's sandbox, not this process, is what contains them)."""
    extra = set(allowed) - {"numpy"}
    return tuple(b for b in BLOCKED if b not in extra and not (extra and b in FOREIGN))
MAX_MESSAGE = 64 << 20           # bytes of arrays in one message; larger answers are refused
MAX_HEADER = 1 << 20             # bytes of one message's JSON header
MAX_ARRAYS = 4096                # arrays in one message
DTYPES = frozenset(np.dtype(c).str for c in "?bhilqBHILQefd")
MAX_ELEMENTS = 4_000_000         # elements of one returned array
STUDENT_MODULE = "submission"


def _why_blocked(root):
    if root in REFERENCE:
        return f"{root} is the reference implementation; write the function with NumPy only"
    if root in AUTODIFF:
        return (f"{root} is an automatic-differentiation library; write the function (and its "
                "backward) with NumPy only")
    return f"{root} reaches around the grader's limits; NumPy and the standard library suffice"


class _Blocker:
    """A meta-path finder, first in ``sys.meta_path``, that refuses the blocked packages."""

    def __init__(self, blocked):
        self.blocked = blocked

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root in self.blocked:
            raise ImportError(f"import of {fullname!r} is not allowed in a graded submission: "
                              f"{_why_blocked(root)}", name=fullname)
        return None


def _install_blocker(blocked):
    import _posixsubprocess          # before the blocker: see below
    sys.meta_path.insert(0, _Blocker(blocked))
    # Drop finders that serve the reference from an editable install, so removing the
    # blocker from sys.meta_path is not enough to reach it.
    def serves_reference(finder):
        names = (getattr(finder, "__module__", ""), _type(finder).__module__,
                 getattr(finder, "__name__", ""), _type(finder).__name__)
        return any("numpytfmr" in str(n) for n in names)
    sys.meta_path[:] = [f for f in sys.meta_path if not serves_reference(f)]
    # Loaded blocked modules (NumPy imports ctypes) are forgotten, so that importing one
    # goes through the import system, and the audit hook, again. _posixsubprocess stays,
    # loaded, for the subprocess module (numpy.testing imports it) -- with its fork_exec,
    # the one way to start a program that raises no audit event, replaced by a refusal.
    def fork_exec(*args, **kwargs):
        raise PermissionError(f"starting another program (subprocess) {_NOT_ALLOWED}")
    _posixsubprocess.fork_exec = fork_exec
    for name in list(sys.modules):
        if name.partition(".")[0] in blocked and name != "_posixsubprocess":
            del sys.modules[name]


# --- the sandbox: an audit hook ----------------------------------------------------------
#
# ``sys.addaudithook`` installs a function that CPython calls on every audited event (opening a
# file, importing, compiling, starting a process, ctypes, ...); it cannot be removed, and an
# exception it raises aborts the event. The hook below refuses:
#   - reading, listing or compiling anything under a protected path: the reference package, the
#     grading configuration's folder, other submissions (``protect`` in the job), and
#     the installed automatic-differentiation libraries; opening a folder that holds one;
#   - importing the blocked packages by name (by any route that imports by name);
#   - writing, renaming, removing or linking files outside the working directory;
#   - ctypes, starting processes, sockets, sub-interpreters, raising resource limits,
#     signalling other processes, and reading other processes' (or its own) memory;
#   - replacing the code or defaults of a function (the hook's own state lives there).
# The hook reads nothing but its parameters: every value and function it needs is a default
# argument (a tuple, immutable), so a submission that rebinds names in this module, in ``os``
# or in ``builtins`` changes nothing it sees.

_WATCHED = frozenset((
    "open", "import", "compile", "os.listdir", "os.scandir", "os.remove", "os.rename",
    "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime", "os.setxattr",
    "os.removexattr", "os.chflags", "os.lchflags", "os.symlink", "os.link",
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__",
    "resource.setrlimit", "resource.prlimit", "cpython.PyInterpreterState_New",
    "object.__setattr__"))
_MUTATING = frozenset(("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                       "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "os.chflags",
                       "os.lchflags"))
_SPAWNING = {"subprocess.Popen": "starting another program", "os.system": "starting another program",
             "os.exec": "starting another program", "os.posix_spawn": "starting another program",
             "os.spawn": "starting another program", "os.fork": "starting another process",
             "os.forkpty": "starting another process", "os.kill": "sending signals",
             "os.killpg": "sending signals", "signal.pthread_kill": "sending signals",
             "socket.__new__": "opening a network connection",
             "resource.setrlimit": "changing the resource limits",
             "resource.prlimit": "changing the resource limits",
             "cpython.PyInterpreterState_New": "starting a sub-interpreter"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NOT_ALLOWED = "is not allowed in a graded submission"


def _resolve(path, dir_fd=-1, cwd=None, _lstat=os.lstat, _readlink=os.readlink,
             _getcwd=os.getcwd, _type=type, _str=str, _int=int, _bytes=bytes, _decode=bytes.decode,
             _OSError=OSError, _list=list, _reversed=reversed):
    """The absolute path ``path`` names, every symbolic link followed; None if it cannot be told.

    ``path`` is a str, bytes or a file descriptor (its file, from /proc/self/fd); a relative
    path is taken from ``dir_fd``'s folder, else the working directory.
    """
    t = _type(path)
    try:
        if t is _int:
            path = _readlink("/proc/self/fd/" + _str(path))
            if not path.startswith("/"):
                return path                      # a pipe or socket: "pipe:[1234]"
        elif t is _bytes:
            path = _decode(path, "utf-8", "surrogateescape")
        elif t is not _str:
            return None
        if not path.startswith("/"):
            if _type(dir_fd) is _int and dir_fd >= 0:
                base = _readlink("/proc/self/fd/" + _str(dir_fd))
            else:
                base = _getcwd() if cwd is None else cwd
            path = base + "/" + path
    except _OSError:
        return None
    pending = _list(_reversed(path.split("/")))
    done = ""
    hops = 0
    while pending:
        name = pending.pop()
        if name == "" or name == ".":
            continue
        if name == "..":
            done = done.rpartition("/")[0]
            continue
        candidate = done + "/" + name
        try:
            mode = _lstat(candidate).st_mode
        except _OSError:
            done = candidate                     # does not exist (yet): taken as written
            continue
        if mode & 0o170000 != 0o120000:
            done = candidate
            continue
        hops += 1
        if hops > 64:
            return None
        try:
            target = _readlink(candidate)
        except _OSError:
            return None
        if target.startswith("/"):
            done = ""
        elif not target or target.startswith(("pipe:", "socket:", "anon_inode:")):
            return target
        pending.extend(_reversed(target.split("/")))
    return done or "/"


def _within(where, roots, _len=len):
    """The (root, why) of ``roots`` that holds ``where`` (or is it), else None."""
    for root, why in roots:
        if where == root or (where.startswith(root) and where[_len(root)] == "/"):
            return root, why
    return None


def _holds(where, roots):
    """The (root, why) of ``roots`` that lies inside the folder ``where``, else None."""
    prefix = where if where.endswith("/") else where + "/"
    for root, why in roots:
        if root.startswith(prefix):
            return root, why
    return None


def _proc_refusal(where, pid):
    """Why reading ``where`` under /proc or /dev is refused, or None."""
    if where in ("/dev/mem", "/dev/kmem", "/dev/port"):
        return "reading memory"
    if not where.startswith("/proc/"):
        return None
    parts = where.split("/")
    if parts[2].isdigit() and parts[2] != pid:
        return "reading another process's files"
    if "mem" in parts[3:]:
        return "reading the memory of a process"
    return None


def install_sandbox(protected, workdir, blocked=BLOCKED):
    """Install the audit hook (see above). ``protected``: (path, why) pairs; ``workdir``: the
    only folder the submission may write to; ``blocked``: the packages not to import."""
    roots = tuple((_resolve(p) or p, why) for p, why in protected)
    own = (_resolve(workdir) or workdir, "the working directory")
    writable = (own, ("/dev/null", "the null device"))
    function_type = types.FunctionType

    def hook(event, args, _watched=_WATCHED, _mutating=_MUTATING, _spawning=_SPAWNING,
             _roots=roots, _writable=writable, _blocked=blocked, _why=_why_blocked,
             _ctypes="ctypes" in blocked, _own=globals(),
             _resolve=_resolve, _within=_within, _holds=_holds, _proc=_proc_refusal,
             _pid=str(os.getpid()), _write_flags=_WRITE_FLAGS, _no=_NOT_ALLOWED,
             _PermissionError=PermissionError, _ImportError=ImportError, _type=type,
             _str=str, _int=int, _bytes=bytes, _function=function_type, _len=len,
             _lstat=os.lstat, _OSError=OSError):
        if event not in _watched:
            if _ctypes and event.startswith("ctypes."):
                raise _PermissionError(f"ctypes ({event}) {_no}: it reaches around the grader's "
                                       "limits; NumPy and the standard library suffice")
            return
        if event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if _type(path) is _int and mode is not None:
                return                               # open(fd): an already open file
            where = _resolve(path)
            if where is None:
                raise _PermissionError(f"opening {path!r} {_no}: name files by a plain str path")
            hit = _within(where, _roots)
            if hit is not None:
                raise _PermissionError(f"opening {where} {_no}: it belongs to {hit[1]}")
            if mode is None and _type(path) is not _int:
                # os.open may be given dir_fd, which the event does not show: a folder that
                # holds a protected path is never opened, so no dir_fd can lead into one
                hit = _holds(where, _roots)
                if hit is not None:
                    raise _PermissionError(f"opening the folder {where} {_no}: it holds {hit[1]}")
            why = _proc(where, _pid)
            if why is not None:
                raise _PermissionError(f"opening {where} {_no} ({why})")
            if _type(flags) is _int and flags & _write_flags and _within(where, _writable) is None:
                raise _PermissionError(f"writing {where} {_no}: a submission may write only in "
                                       "its working directory")
            return
        if event == "import":
            name = args[0]
            root = name.partition(".")[0] if _type(name) is _str else ""
            if root in _blocked:
                raise _ImportError(f"import of {name!r} {_no}: {_why(root)}")
            filename = args[1] if _len(args) > 1 else None
            if _type(filename) is _str:
                where = _resolve(filename)
                hit = None if where is None else _within(where, _roots)
                if hit is not None:
                    raise _ImportError(f"import of {name!r} from {where} {_no}: it belongs to "
                                       f"{hit[1]}")
            return
        if event == "compile":
            filename = args[1] if _len(args) > 1 else None
            if _type(filename) is _str and filename.startswith("/"):
                where = _resolve(filename)
                hit = None if where is None else _within(where, _roots)
                if hit is not None:
                    raise _PermissionError(f"compiling {where} {_no}: it belongs to {hit[1]}")
            return
        if event == "os.listdir" or event == "os.scandir":
            path = args[0] if args else None
            where = _resolve("." if path is None else path)
            if where is not None:
                hit = _within(where, _roots)
                if hit is not None:
                    raise _PermissionError(f"listing {where} {_no}: it belongs to {hit[1]}")
            return
        if event in _mutating:
            if event == "os.rename":
                targets = ((args[0], args[2]), (args[1], args[3]))
            else:
                dir_fd = args[-1] if event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod",
                                               "os.chown", "os.utime") else -1
                targets = ((args[0], dir_fd),)
            for path, dir_fd in targets:
                if _type(path) is _int:
                    raise _PermissionError(f"{event} on a file descriptor {_no}")
                where = _resolve(path, dir_fd)
                if where is None or _within(where, _writable) is None:
                    raise _PermissionError(f"{event} of {where or path!r} {_no}: a submission may "
                                           "change files only in its working directory")
            return
        if event == "os.symlink" or event == "os.link":
            raise _PermissionError(f"making links ({event}) {_no}")
        if event == "object.__setattr__":
            # the hook's own functions and state (the grader's code, not a library's)
            if _type(args[0]) is _function and args[1] in ("__code__", "__defaults__",
                                                           "__kwdefaults__") \
                    and args[0].__globals__ is _own:
                raise _PermissionError(f"replacing a function's {args[1]} {_no}")
            return
        raise _PermissionError(f"{_spawning.get(event, event)} ({event}) {_no}")

    sys.addaudithook(hook)


# --- the answer channel, protected from monkeypatching ---------------------------------

_SAVED = []


def _save_modules():
    for m in (builtins, np, io, json, os, struct, time, traceback, linecache, types, inspect):
        _SAVED.append((m, dict(vars(m))))


def _restore():
    for m, saved in _SAVED:
        vars(m).update(saved)


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            raise EOFError("the grader closed the request channel")
        chunks.append(b)
        got += _len(b)
    return b"".join(chunks)


def _write_all(fd, data):
    view = memoryview(data)
    while _len(view):
        n = os.write(fd, view)
        view = view[n:]


def frame(meta, arrays=None):
    """One message: lengths, the JSON header (``meta`` and each array's key, dtype, shape),
    then the arrays' bytes in C order."""
    specs, blobs = [], []
    for key, a in (arrays or {}).items():
        a = np.array(a, order="C")     # a copy (ascontiguousarray would make a 0-d array 1-d)
        specs.append([key, a.dtype.str, list(a.shape)])
        blobs.append(a.tobytes())
    header = json.dumps({"meta": meta, "arrays": specs}).encode("utf-8")
    body = b"".join(blobs)
    return struct.pack("<QQ", _len(header), _len(body)) + header + body


def parse_header(raw, n_body):
    """(meta, [(key, dtype, shape, n_bytes)]) from a frame's header, checked before anything
    is allocated: the declared arrays must be of plain numeric dtypes and fill the body's
    ``n_body`` bytes exactly. ValueError otherwise."""
    head = json.loads(raw.decode("utf-8"))
    if _type(head) is not dict or _type(head.get("meta")) is not dict \
            or _type(head.get("arrays")) is not list or _len(head["arrays"]) > MAX_ARRAYS:
        raise ValueError("malformed header")
    specs, total = [], 0
    for spec in head["arrays"]:
        if _type(spec) is not list or _len(spec) != 3:
            raise ValueError("malformed array entry")
        key, dtype, shape = spec
        if _type(key) is not str or dtype not in DTYPES or _type(shape) is not list \
                or _len(shape) > 32 or any(_type(d) is not int or d < 0 for d in shape):
            raise ValueError(f"array entry {str(spec)[:80]} is not a plain numeric array")
        n = np.dtype(dtype).itemsize
        for d in shape:
            n *= d
        total += n
        if total > n_body:
            raise ValueError("the arrays declared are larger than the message")
        specs.append((key, dtype, tuple(shape), n))
    if total != n_body:
        raise ValueError("the arrays declared do not fill the message")
    return head["meta"], specs


def split_body(body, specs):
    """The arrays of a frame's body (a bytearray: the arrays are writable views of it)."""
    arrays, at = {}, 0
    for key, dtype, shape, n in specs:
        arrays[key] = (np.frombuffer(body, dtype=dtype, count=n // np.dtype(dtype).itemsize,
                                     offset=at).reshape(shape) if n else np.zeros(shape, dtype))
        at += n
    return arrays


def _recv(fd):
    n_head, n_body = struct.unpack("<QQ", _read_exact(fd, 16))
    if n_head > MAX_HEADER or n_body > MAX_MESSAGE:
        raise ValueError("request too large")
    meta, specs = parse_header(_read_exact(fd, n_head), n_body)
    return meta, split_body(bytearray(_read_exact(fd, n_body)), specs)


def _send(fd, meta, arrays=None):
    data = frame(meta, arrays)
    if _len(data) > MAX_MESSAGE:
        data = frame({"ok": False, "error": {"kind": "too_large",
                                             "message": f"the answer is {_len(data)} bytes; at "
                                                        f"most {MAX_MESSAGE} are accepted"}})
    _write_all(fd, data)


# --- values in and out ------------------------------------------------------------------

def _decode(enc, arrays):
    """Rebuild a value encoded by the grader: arrays by key, plain data from JSON."""
    t = enc["t"]
    if t == "none":
        return None
    if t in ("bool", "int", "float", "str"):
        return enc["v"]
    if t == "array":
        a = arrays[enc["k"]]
        return a[()] if enc.get("scalar") else a.copy()
    if t == "list":
        return [_decode(e, arrays) for e in enc["v"]]
    if t == "tuple":
        return tuple(_decode(e, arrays) for e in enc["v"])
    if t == "dict":
        return {k: _decode(e, arrays) for k, e in enc["v"].items()}
    raise ValueError(f"unknown encoding {t!r}")


def _fresh_kwargs(kwargs):
    """Options for one call: an int ``rng`` is a seed, made a new Generator every time."""
    kw = dict(kwargs)
    rng = kw.get("rng")
    if _type(rng) is int:
        kw["rng"] = np.random.default_rng(rng)
    return kw


def _type_name(v):
    t = _type(v)
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod in ("builtins", STUDENT_MODULE) else f"{mod}.{t.__qualname__}"


def _describe_value(v, out, prefix, depth=0):
    """A JSON description of a returned value; accepted arrays go into ``out``.

    Only plain ``np.ndarray`` (numeric or bool), NumPy scalars, exact Python numbers,
    None and tuples/lists of those are accepted; anything else is reported by type.
    """
    t = _type(v)
    if v is None:
        return {"kind": "none"}
    if t is _ndarray:
        if v.dtype.kind not in "biuf":
            return {"kind": "refused", "type": "numpy.ndarray", "dtype": _str(v.dtype),
                    "why": f"returned an array of dtype {v.dtype}; expected a numeric array"}
        if v.size > MAX_ELEMENTS:
            return {"kind": "refused", "type": "numpy.ndarray", "shape": list(v.shape),
                    "why": f"returned an array of shape {v.shape} ({v.size} elements); far more "
                           "than expected"}
        key = f"{prefix}"
        out[key] = np.array(v, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        return {"kind": "array", "key": key}
    if _isinstance(v, _matrix):
        return {"kind": "refused", "type": "numpy.matrix",
                "why": "returned np.matrix; expected np.ndarray (np.matrix changes what * and "
                       "indexing mean: use plain arrays and @)"}
    if _isinstance(v, _ndarray):
        return {"kind": "refused", "type": _type_name(v),
                "why": f"returned an object of type {_type_name(v)} (a subclass of np.ndarray); "
                       "expected a plain np.ndarray"}
    if _isinstance(v, _generic) and t.__module__ == "numpy":
        if np.dtype(t).kind not in "biuf":
            return {"kind": "refused", "type": _type_name(v),
                    "why": f"returned a NumPy scalar of type {_type_name(v)}; expected a number"}
        out[prefix] = np.asarray(v)
        return {"kind": "scalar", "key": prefix, "type": _type_name(v)}
    if t in (float, int, bool):
        out[prefix] = np.asarray(v)
        return {"kind": "pyscalar", "key": prefix, "type": t.__name__}
    if t in (tuple, list) and depth < 2:
        if _len(v) > 64:
            return {"kind": "refused", "type": t.__name__,
                    "why": f"returned a {t.__name__} of {_len(v)} items"}
        items = [_describe_value(item, out, f"{prefix}_{i}", depth + 1) for i, item in enumerate(v)]
        return {"kind": t.__name__, "items": items}
    return {"kind": "refused", "type": _type_name(v),
            "why": f"returned an object of type {_type_name(v)}; expected np.ndarray"}


def _copy(obj, depth=0):
    """Copy arrays inside dict/list/tuple containers (other objects are shared)."""
    if depth > 6:
        return obj
    t = _type(obj)
    if _isinstance(obj, _ndarray):
        return obj.copy()
    if t is dict:
        return {k: _copy(v, depth + 1) for k, v in obj.items()}
    if t is list:
        return [_copy(v, depth + 1) for v in obj]
    if t is tuple:
        return tuple(_copy(v, depth + 1) for v in obj)
    return obj


def _same(a, b, depth=0):
    """Whether ``b`` still equals the copy ``a`` (arrays bitwise; others by identity)."""
    if depth > 6:
        return True
    if _isinstance(a, _ndarray):
        return (_isinstance(b, _ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and a.tobytes() == b.tobytes())
    t = _type(a)
    if t is dict:
        return _type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if t in (list, tuple):
        return _type(b) is t and _len(a) == _len(b) and all(
            _same(u, v, depth + 1) for u, v in zip(a, b))
    return a is b


def _error(exc, filenames, elapsed=None):
    """A JSON report of an exception: its type, message and the submission's own frames."""
    try:
        message = _str(exc)
    except _BaseException:
        message = "(the exception's message could not be turned into text)"
    if _len(message) > 2000:
        message = message[:2000] + " ..."
    frames = []
    try:
        for f in traceback.extract_tb(exc.__traceback__):
            if f.filename in filenames:
                frames.append([f.filename, f.lineno, f.name, (f.line or "").strip()[:200]])
    except _BaseException:
        pass
    t = _type(exc)
    if _isinstance(exc, _NotImplementedError):
        kind = "not_implemented"
    elif _isinstance(exc, _MemoryError):
        kind = "memory"
    else:
        kind = "exception"
    report = {"kind": kind, "type": getattr(t, "__name__", "?"), "message": message,
              "frames": frames[-12:], "base": not _isinstance(exc, Exception)}
    if elapsed is not None:
        report["elapsed"] = elapsed
    return report


# --- the submission -----------------------------------------------------------------------

def _load(chunks):
    """Execute the submission's chunks in a fresh module; return (module, error, warnings).

    A .py file is one chunk: an exception there is a load error. A notebook has one chunk per
    code cell: a failing cell is a warning and the next cells still run, as in a notebook.
    """
    module = types.ModuleType(STUDENT_MODULE)
    module.__file__ = chunks[0]["filename"] if chunks else STUDENT_MODULE
    sys.modules[STUDENT_MODULE] = module
    filenames = {c["filename"] for c in chunks}
    warnings = []
    for chunk in chunks:
        source, filename = chunk["source"], chunk["filename"]
        linecache.cache[filename] = (_len(source), None, source.splitlines(True), filename)
        try:
            code = compile(source, filename, "exec")
            exec(code, module.__dict__)
        except _BaseException as exc:  # SystemExit and KeyboardInterrupt included
            _restore()
            report = _error(exc, filenames)
            if _isinstance(exc, SyntaxError):
                report["frames"] = [[filename, exc.lineno, "<module>", (exc.text or "").strip()]]
            if not chunk.get("continue_on_error"):
                return module, report, warnings
            report["where"] = filename
            warnings.append(report)
        _restore()
    return module, None, warnings


def _defined(module):
    names = []
    for name, obj in list(module.__dict__.items()):
        if _type(name) is str and not name.startswith("_") and callable(obj):
            names.append(name)
    return sorted(names)[:2000]


def _arg_names(fn, n):
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except _BaseException:
        params = []
    return [params[i] if i < _len(params) else f"input {i}" for i in range(n)]


class Server:
    """Answers the grader's requests against the loaded submission."""

    def __init__(self, module, filenames, fd_in, fd_out):
        self.module, self.filenames = module, filenames
        self.fd_in, self.fd_out = fd_in, fd_out
        self.caches = {}           # id -> pristine copy of a cache returned by a forward
        self.next_id = 1

    def function(self, name):
        fn = self.module.__dict__.get(name)
        if fn is None or not callable(fn):
            return None
        return fn

    def run(self):
        while True:
            try:
                meta, arrays = _recv(self.fd_in)
            except EOFError:
                return
            handler = {"call": self.call, "backward": self.backward, "sweep": self.sweep,
                       "reset": self.reset}.get(meta.get("op"))
            if handler is None:
                _send(self.fd_out, {"ok": False, "error": {"kind": "protocol",
                                                            "message": f"unknown op {meta.get('op')!r}"}})
                continue
            answer, out = handler(meta, arrays)
            _restore()
            _send(self.fd_out, answer, out)

    def reset(self, meta, arrays):
        self.caches.clear()
        return {"ok": True}, {}

    def _missing(self, name):
        return {"ok": False, "error": {"kind": "not_defined", "message": f"{name} is not defined"}}, {}

    def call(self, meta, arrays):
        """Call a function; a forward's (out, cache) keeps the cache here under an id."""
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        args = [_decode(e, arrays) for e in meta["args"]]
        kwargs = _fresh_kwargs({k: _decode(e, arrays) for k, e in meta["kwargs"].items()})
        before = [_copy(a) for a in args]
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except _BaseException as exc:
            _restore()
            return {"ok": False, "error": _error(exc, self.filenames, time.perf_counter() - start)}, {}
        elapsed = time.perf_counter() - start
        _restore()
        names = _arg_names(fn, _len(args))
        changed = [names[i] for i, (a, b) in enumerate(zip(before, args)) if not _same(a, b)]
        out = {}
        answer = {"ok": True, "elapsed": elapsed, "changed": changed}   # the grader words them
        if meta.get("pair"):
            if _type(result) not in (tuple, list) or _len(result) != 2:
                answer["value"] = _describe_value(result, out, "r")
                answer["not_pair"] = True
                return answer, out
            value, cache = result
            answer["value"] = _describe_value(value, out, "r")
            if meta.get("keep"):
                cache_id = self.next_id
                self.next_id += 1
                self.caches[cache_id] = _copy(cache)
                while _len(self.caches) > 8:
                    del self.caches[min(self.caches)]
                answer["cache_id"] = cache_id
            answer["cache_type"] = _type_name(cache)
        else:
            answer["value"] = _describe_value(result, out, "r")
        return answer, out

    def backward(self, meta, arrays):
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        if meta.get("empty_cache"):       # to tell "not implemented" from "needs a cache"
            self.caches[0] = {}
        pristine = self.caches.get(meta["cache_id"])
        if pristine is None and meta["cache_id"] not in self.caches:
            return {"ok": False, "error": {"kind": "protocol", "message": "unknown cache id"}}, {}
        cache = _copy(pristine)
        dout = arrays["dout"]
        dout_given = dout.copy()
        forward_calls = [0]
        filenames = self.filenames

        def count(frame, event, arg):       # calls of the submission's forwards, for the review
            if event == "call" and frame.f_code.co_name.endswith("_forward") \
                    and frame.f_code.co_filename in filenames:
                forward_calls[0] += 1
        start = time.perf_counter()
        sys.setprofile(count)
        try:
            result = fn(dout, cache)
        except _BaseException as exc:
            sys.setprofile(None)
            _restore()
            return {"ok": False, "error": _error(exc, self.filenames, time.perf_counter() - start)}, {}
        sys.setprofile(None)
        elapsed = time.perf_counter() - start
        _restore()
        out = {}
        answer = {"ok": True, "elapsed": elapsed, "changed_cache": not _same(pristine, cache),
                  "changed_dout": not _same(dout_given, dout), "forward_calls": forward_calls[0],
                  "value": _describe_value(result, out, "g")}
        return answer, out

    def sweep(self, meta, arrays):
        """Forward outputs at many points that differ from the base inputs in one entry.

        ``values`` (n_coords, n_steps) holds the new value of entry ``coords[i]`` of input
        ``input``; the outputs come back as float64, shape (n_done, *out_shape), in row-major
        order of (coord, step). Stops at the first call that fails or after ``budget`` seconds.
        """
        name = meta["fn"]
        fn = self.function(name)
        if fn is None:
            return self._missing(name)
        base = [_decode(e, arrays) for e in meta["args"]]
        kwargs = {k: _decode(e, arrays) for k, e in meta["kwargs"].items()}
        p, coords, values = meta["input"], meta["coords"], arrays["values"]
        x = base[p]
        deadline = time.perf_counter() + float(meta.get("budget", 1.0))
        outs, shape = [], None
        for i, j in enumerate(coords):
            for k in range(values.shape[1]):
                args = [a.copy() if _isinstance(a, _ndarray) else a for a in base]
                xp = x.copy()
                xp.reshape(-1)[j] = values[i, k]
                args[p] = xp
                try:
                    result = fn(*args, **_fresh_kwargs(kwargs))
                except _BaseException:
                    _restore()
                    return self._swept(outs)
                _restore()
                if _type(result) not in (tuple, list) or _len(result) != 2:
                    return self._swept(outs)
                y = result[0]
                if not (_type(y) is _ndarray or (_isinstance(y, _generic) and _type(y).__module__ == "numpy")
                        or _type(y) in (float, int)):
                    return self._swept(outs)
                y = np.asarray(y)
                if y.dtype.kind not in "biuf" or (shape is not None and y.shape != shape):
                    return self._swept(outs)
                shape = y.shape
                outs.append(np.array(y, dtype=np.float64))
                if time.perf_counter() > deadline:
                    return self._swept(outs)
        return self._swept(outs)

    @staticmethod
    def _swept(outs):
        if not outs:
            return {"ok": True, "n_done": 0}, {}
        return {"ok": True, "n_done": _len(outs)}, {"outs": np.stack(outs)}


def _protected(listed, workdir):
    """The (path, why) pairs the sandbox protects: those the grader listed, plus wherever the
    reference and the automatic-differentiation libraries are installed. A path that holds
    what this process needs (its working directory, Python, NumPy) is left out."""
    import importlib.util
    out = [(str(p), str(why)) for p, why in listed]
    for name in REFERENCE + AUTODIFF + ESCAPES:
        try:
            spec = importlib.util.find_spec(name)
        except _BaseException:
            continue
        if spec is None:
            continue
        places = list(spec.submodule_search_locations or []) or [spec.origin]
        why = ("the reference implementation (numpytfmr)" if name in REFERENCE
               else f"an automatic-differentiation library ({name})" if name in AUTODIFF
               else f"a module that reaches around the grader's limits ({name})")
        out += [(p, why) for p in places if isinstance(p, str) and p.startswith("/")]
    needed = [workdir, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.executable,
              os.path.dirname(np.__file__), os.path.dirname(os.__file__)]
    needed = [_resolve(p) or p for p in needed]
    keep = []
    for path, why in out:
        where = _resolve(path)
        if where is None or where == "/" or any(n == where or n.startswith(where + "/")
                                                for n in needed):
            continue
        keep.append((where, why))
    return keep


def main(argv):
    fd_in, fd_out = int(argv[1]), int(argv[2])
    try:
        job, _ = _recv(fd_in)                      # the first request: what to run
        chunks = job["chunks"]
        protected = _protected(job.get("protect", []), os.getcwd())
        blocked = blocked_for(job.get("allow", []))
    except _BaseException as exc:
        _send(fd_out, {"ok": False, "error": {"kind": "protocol", "message": f"cannot read the "
                                                                          f"submission: {exc}"}})
        return 0
    sys.dont_write_bytecode = True
    _install_blocker(blocked)
    _save_modules()
    install_sandbox(protected, os.getcwd(), blocked)
    _send(fd_out, {"ok": True, "started": True})   # the time limit of loading starts now
    module, error, warnings = _load(chunks)
    _restore()
    filenames = {c["filename"] for c in chunks}
    if error is not None:
        _send(fd_out, {"ok": False, "error": error, "warnings": warnings})
        return 0
    _send(fd_out, {"ok": True, "defined": _defined(module), "warnings": warnings})
    Server(module, filenames, fd_in, fd_out).run()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # skip interpreter shutdown: atexit handlers of the submission do not run
