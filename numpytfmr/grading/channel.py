"""The grader's side of a submission process: start it, send requests, read answers, kill it.

Student code never runs in the grading process. Each :class:`Submission` process is
``python -I child.py`` (isolated mode: no current directory, user site or PYTHON* variables),
run from a copy of child.py in a fresh temporary working directory, in a new session (its own
process group, so a kill reaches everything it started), with limits on CPU time, address
space and file size and a minimal environment, optionally as another (unprivileged) user.
Before the submission loads, the child installs its sandbox (an audit hook) over the paths
the grader lists in ``protect``. Every wait has a wall-clock deadline; when it passes the
whole process group is killed.

Requests and answers are length-prefixed ``.npz`` messages loaded with ``allow_pickle=False``;
a missing, late or malformed answer raises :class:`ChildFailure`, which the grader counts as a
failure of the test being run.
"""
import io
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
MAX_MESSAGE = 64 << 20
STARTUP_SECONDS = 60.0          # to start the interpreter and import NumPy


class ChildFailure(Exception):
    """The submission process did not answer: ``kind`` is "timeout", "died" or "corrupt"."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


_SIGNALS = {
    signal.SIGXCPU: "it used up its CPU-time limit",
    signal.SIGXFSZ: "it wrote more than the file-size limit allows",
    signal.SIGKILL: "it was killed (out of memory, or a time limit)",
    signal.SIGSEGV: "it crashed (segmentation fault -- often the memory limit)",
    signal.SIGABRT: "it aborted (often the memory limit)",
    signal.SIGBUS: "it crashed (bus error)",
}


def describe_exit(returncode):
    """A sentence on how a process ended, from its return code."""
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{_SIGNALS.get(-returncode, 'it was killed')} ({name})"
    return (f"it exited with status {returncode} (sys.exit() or os._exit() in the submission, "
            "or a crash)")


# --- values ------------------------------------------------------------------------------

def encode(value, arrays, key):
    """Encode a case value for the child: arrays into ``arrays`` under ``key``, the rest JSON."""
    if value is None:
        return {"t": "none"}
    if isinstance(value, (bool, np.bool_)):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"t": "int", "v": int(value)}
    if isinstance(value, (float, np.floating)) and not isinstance(value, np.generic):
        return {"t": "float", "v": float(value)}
    if isinstance(value, str):
        return {"t": "str", "v": value}
    if isinstance(value, np.generic):
        arrays[key] = np.asarray(value)
        return {"t": "array", "k": key, "scalar": True}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"cannot send an array of dtype {value.dtype}")
        arrays[key] = np.array(value, order="C")  # a copy; 0-d stays 0-d
        return {"t": "array", "k": key}
    if isinstance(value, (list, tuple)):
        items = [encode(v, arrays, f"{key}_{i}") for i, v in enumerate(value)]
        return {"t": "tuple" if isinstance(value, tuple) else "list", "v": items}
    if isinstance(value, dict):
        return {"t": "dict", "v": {str(k): encode(v, arrays, f"{key}_{k}") for k, v in value.items()}}
    raise TypeError(f"cannot send a value of type {type(value).__name__}")


def encode_call(args, kwargs):
    arrays = {}
    enc_args = [encode(a, arrays, f"a{i}") for i, a in enumerate(args)]
    enc_kwargs = {k: encode(v, arrays, f"k_{k}") for k, v in kwargs.items()}
    return enc_args, enc_kwargs, arrays


class Returned:
    """A value the submission returned, as described by the child and re-checked here.

    kind: "array" | "scalar" (NumPy scalar) | "pyscalar" (Python number) | "none" |
          "tuple" | "list" (``items``) | "refused" (``why``)
    array: the value as an ndarray for the three number kinds.
    """

    def __init__(self, kind, array=None, items=None, type_name=None, why=None):
        self.kind, self.array, self.items = kind, array, items
        self.type_name, self.why = type_name, why

    @property
    def is_number(self):
        return self.kind in ("array", "scalar", "pyscalar")

    def describe(self):
        if self.kind == "array":
            return f"an array of shape {self.array.shape} and dtype {self.array.dtype}"
        if self.kind == "scalar":
            return f"a NumPy scalar ({self.type_name})"
        if self.kind == "pyscalar":
            return f"a Python {self.type_name}"
        if self.kind == "none":
            return "None"
        if self.kind in ("tuple", "list"):
            return f"a {self.kind} of {len(self.items)}"
        return f"an object of type {self.type_name}"


def decode_value(desc, arrays, depth=0):
    """Turn the child's description into a :class:`Returned`, validating every claim."""
    if not isinstance(desc, dict) or depth > 3:
        return Returned("refused", why="the answer could not be read")
    kind = desc.get("kind")
    if kind == "none":
        return Returned("none")
    if kind in ("array", "scalar", "pyscalar"):
        a = arrays.get(desc.get("key"))
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
            return Returned("refused", why="the answer could not be read")
        if kind != "array" and a.ndim != 0:
            return Returned("refused", why="the answer could not be read")
        return Returned(kind, array=a, type_name=str(desc.get("type", "")))
    if kind in ("tuple", "list"):
        items = desc.get("items")
        if not isinstance(items, list):
            return Returned("refused", why="the answer could not be read")
        return Returned(kind, items=[decode_value(d, arrays, depth + 1) for d in items])
    if kind == "refused":
        return Returned("refused", type_name=str(desc.get("type", "?")),
                        why=str(desc.get("why", "returned an unsupported object"))[:500])
    return Returned("refused", why="the answer could not be read")


# --- the process ----------------------------------------------------------------------------

class Submission:
    """One running submission process (the child), loaded and ready for requests.

    chunks: list of {"filename", "source", "continue_on_error"} (see notebook.py)
    timeout: seconds allowed for loading the submission
    limits: dict with cpu_seconds, memory_bytes, file_bytes
    protect: (path, why) pairs the child's sandbox keeps out of reach (see child.py)
    user: run the child as this user (a name or uid; the grader must be root), with its
        working directory given to that user: the reference and the grading config can then
        be made unreadable to it by file permissions (the Gradescope bundle does)
    After construction: ``load_error`` (dict or None), ``defined`` (names), ``warnings``.
    """

    def __init__(self, chunks, *, timeout, limits, protect=(), user=None):
        self.workdir = tempfile.mkdtemp(prefix="numpytfmr-grade-")
        self.proc = None
        self._r = self._w = None
        self.returncode = None
        self._output = None
        try:
            self._start(chunks, protect, limits, user)
        except BaseException:
            self.kill()
            raise
        self.load_error, self.defined, self.warnings = None, [], []
        # Python and NumPy start-up is not the submission's time: the limit starts when the
        # process says it is about to run the submission.
        meta, _ = self._receive(time.monotonic() + STARTUP_SECONDS, "starting Python and NumPy")
        if meta.get("started"):
            meta, _ = self._receive(time.monotonic() + timeout, "loading the submission")
        self.warnings = meta.get("warnings") or []
        if meta.get("ok"):
            self.defined = [n for n in meta.get("defined", []) if isinstance(n, str)]
        else:
            self.load_error = meta.get("error") or {"kind": "protocol", "message": "no answer"}

    def _start(self, chunks, protect, limits, user):
        # The child runs from a copy of child.py in its own folder: it never needs to read
        # the package, which its sandbox (and, under ``user``, the file permissions) forbid.
        script = os.path.join(self.workdir, "child.py")
        shutil.copyfile(CHILD, script)
        job = os.path.join(self.workdir, "submission.json")
        with open(job, "w", encoding="utf-8") as f:
            json.dump({"chunks": chunks, "protect": [[str(p), str(why)] for p, why in protect]}, f)
        ids = {}
        if user is not None:
            uid, gid = user_ids(user)
            for path in (self.workdir, script, job):
                os.chown(path, uid, gid)
            ids = {"user": uid, "group": gid, "extra_groups": []}
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        self._output = open(os.path.join(self.workdir, "output.txt"), "wb")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.workdir,
               "TMPDIR": self.workdir, "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", script, str(req_r), str(ans_w)], cwd=self.workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
                pass_fds=(req_r, ans_w), start_new_session=True,
                preexec_fn=_limiter(limits), **ids)
        except BaseException:
            for fd in (req_w, ans_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(ans_w)
        self._w, self._r = req_w, ans_r
        os.set_blocking(self._w, False)

    # -- requests --------------------------------------------------------------------------

    def request(self, meta, arrays, deadline, doing):
        """Send one request and return the answer ``(meta, arrays)``; ChildFailure otherwise."""
        if self.proc is None or self.returncode is not None:
            raise ChildFailure("died", "the submission process is not running")
        buf = io.BytesIO()
        np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8),
                 **arrays)
        data = buf.getvalue()
        self._send(struct.pack("<Q", len(data)) + data, deadline, doing)
        return self._receive(deadline, doing)

    def _send(self, data, deadline, doing):
        view = memoryview(data)
        while len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail("timeout", doing)
            _, ready, _ = select.select([], [self._w], [], left)
            if not ready:
                continue
            try:
                n = os.write(self._w, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                self._fail("died", doing)
            view = view[n:]

    def _read(self, n, deadline, doing):
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail("timeout", doing)
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            b = os.read(self._r, min(n - got, 1 << 20))
            if not b:
                self._fail("died", doing)
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)

    def _receive(self, deadline, doing):
        (n,) = struct.unpack("<Q", self._read(8, deadline, doing))
        if n > MAX_MESSAGE:
            self._fail("corrupt", doing, f"the answer claims {n} bytes")
        data = self._read(n, deadline, doing)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            header = arrays.pop("__meta__")
            if header.dtype != np.uint8 or header.ndim != 1:
                raise ValueError("bad header")
            meta = json.loads(header.tobytes().decode("utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("bad header")
        except Exception as exc:  # noqa: BLE001 -- any malformed answer is a failure
            self._fail("corrupt", doing, f"{type(exc).__name__}: {exc}")
        return meta, arrays

    def _fail(self, kind, doing, detail=""):
        if kind == "timeout":
            self.kill()
            raise ChildFailure("timeout", f"no answer within the time limit while {doing}")
        if kind == "corrupt":
            self.kill()
            raise ChildFailure("corrupt", f"the answer while {doing} was malformed ({detail}); "
                                          "did the submission write to the grader's channel?")
        try:
            self.returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.returncode = None
        how = describe_exit(self.returncode)
        tail = " ".join(self.output_tail(300).split())
        if tail:
            how += f"; its last output: {tail!r}"
        self.kill()
        raise ChildFailure("died", f"the submission process ended while {doing}: {how}")

    # -- ending -----------------------------------------------------------------------------

    @property
    def alive(self):
        return self.proc is not None and self.returncode is None and self.proc.poll() is None

    def output_tail(self, n_chars=600):
        try:
            with open(os.path.join(self.workdir, "output.txt"), "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - n_chars))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self):
        """Kill the whole process group and remove the working directory."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # the group: everything it started
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()                           # itself, in case it left the group
            except (ProcessLookupError, OSError):
                pass
            try:
                rc = self.proc.wait(timeout=10)
                if self.returncode is None:
                    self.returncode = rc
            except subprocess.TimeoutExpired:
                pass
        for fd in (self._r, self._w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = None
        if self._output is not None and not self._output.closed:
            self._output.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    close = kill

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def user_ids(user):
    """(uid, gid) of ``user`` (a name or a uid); ValueError if there is no such user."""
    import pwd
    try:
        entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
    except KeyError:
        raise ValueError(f"there is no user {user!r} on this machine") from None
    return entry.pw_uid, entry.pw_gid


def _limiter(limits):
    """A preexec_fn that sets the resource limits of the child (runs after fork)."""
    import resource

    def cap(which, soft, hard):
        _, current = resource.getrlimit(which)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(which, (soft, hard))

    def apply():
        cpu = int(limits["cpu_seconds"])
        cap(resource.RLIMIT_CPU, cpu, cpu + 2)
        mem = int(limits["memory_bytes"])
        cap(resource.RLIMIT_AS, mem, mem)
        size = int(limits["file_bytes"])
        cap(resource.RLIMIT_FSIZE, size, size)
        cap(resource.RLIMIT_CORE, 0, 0)
    return apply
