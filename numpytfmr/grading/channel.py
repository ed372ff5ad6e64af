"""The grader's side of a submission process: start it, send requests, read answers, kill it.

Student code never runs in the grading process. Each :class:`Submission` process is
``python -I -S`` running child.py's source, started by sandbox.py in the isolation chosen for
the run (a bubblewrap sandbox, a user ID of its own, or, when asked, none), with limits on CPU
time, address space, file size, open files and processes, and a minimal environment. Every
wait has a wall-clock deadline; when it passes, the whole sandbox (or process group, and every
process of the child's user ID) is killed.

The grader trusts nothing the child can touch. It reads no file the child could have written
and follows no path in a folder the child can write: the submission's code goes to the child
over a pipe, and its answers, its printed output and its errors come back over pipes the
grader created, each read up to a byte cap, never blocking past a deadline. Answers are
frames of uncompressed arrays (child.py's :func:`~.child.frame`) whose declared dtypes and
shapes are checked against the cap before anything is allocated; a missing, late, oversized
or malformed answer raises :class:`ChildFailure`, which the grader counts as a failure of the
test being run.
"""
import os
import select
import shutil
import signal
import struct
import subprocess
import time

import numpy as np

from . import sandbox
from .child import MAX_HEADER, MAX_MESSAGE, frame, parse_header, split_body
from .judge import Returned   # the judge's class of a returned value, rebuilt here

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py"),
          encoding="utf-8") as _f:
    CHILD_SOURCE = _f.read()
STARTUP_SECONDS = 60.0          # to start the sandbox, the interpreter and NumPy
OUTPUT_CAP = 64 << 10           # bytes of the child's printed output kept (the last ones)
END_SECONDS = 2.0               # for a process to exit once its requests end, before it is killed


# CPU seconds of the submission processes this process has ended (:meth:`Submission.kill`):
# "processes", measured from /proc before each ends (its whole tree: bwrap, its init and the
# Python, whose CPU time never reaches the grader's own count of its children, because a PID
# namespace's processes are reaped inside it); "reaped", the part the grader's count of its
# children does hold (the processes it waited for itself), so that the two are not added twice.
SPENT = {"processes": 0.0, "reaped": 0.0}


def process_tree_cpu(pid):
    """CPU seconds (user and system) of process ``pid`` and its live descendants, including
    the children each has waited for; 0.0 where /proc cannot tell. Kernel-written figures
    only: a process's name is skipped (it may hold any character)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents, ticks = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        try:
            parents.setdefault(int(fields[1]), []).append(int(name))
            ticks[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (ValueError, IndexError):
            continue
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += ticks.get(p, 0)
        todo += parents.get(p, [])
    return total / tick


def _children_cpu():
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
    protect: (path, why) pairs kept out of reach: absent from the bubblewrap sandbox, and
        refused by the child's audit hook in every mode (see child.py)
    isolation: a :class:`~.sandbox.Isolation` (default: the strongest that works here)
    modules: what the submission may import beyond the standard library
    After construction: ``load_error`` (dict or None), ``defined`` (names), ``warnings``,
    ``start_seconds`` (to start the isolated Python and NumPy).
    """

    def __init__(self, chunks, *, timeout, limits, protect=(), isolation=None, modules=("numpy",)):
        self.isolation = isolation or sandbox.choose()
        self.uid = sandbox.child_uid()
        self.workdir = None
        self.proc = None
        self._r = self._w = self._out = None
        self.returncode = None
        self._output = bytearray()
        self.cpu_seconds = 0.0       # its processes' CPU time, known once it has ended
        self._reaped = 0.0
        start = time.monotonic()
        try:
            self._start(chunks, protect, limits, modules)
        except BaseException:
            self.kill()
            raise
        self.load_error, self.defined, self.warnings = None, [], []
        # Python and NumPy start-up is not the submission's time: the limit starts when the
        # process says it is about to run the submission.
        meta, _ = self._receive(time.monotonic() + STARTUP_SECONDS, "starting Python and NumPy")
        self.start_seconds = time.monotonic() - start
        if meta.get("started"):
            meta, _ = self._receive(time.monotonic() + timeout, "loading the submission")
        self.warnings = meta.get("warnings") or []
        if meta.get("ok"):
            self.defined = [n for n in meta.get("defined", []) if isinstance(n, str)]
        else:
            self.load_error = meta.get("error") or {"kind": "protocol", "message": "no answer"}

    # ==== THE BOUNDARY: starting the process (each mode's launch function is in sandbox.py) ====
    def _start(self, chunks, protect, limits, modules):
        mode = self.isolation.mode
        self.workdir = sandbox.private_folder(mode, self.uid)
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        out_r, out_w = os.pipe()
        self._w, self._r, self._out = req_w, ans_r, out_r
        try:
            kw = sandbox.launch(mode, ["-c", CHILD_SOURCE, str(req_r), str(ans_w)], uid=self.uid,
                                limits=limits, protect=protect, modules=modules,
                                workdir=self.workdir)
            kw.setdefault("start_new_session", True)
            self.proc = subprocess.Popen(**kw, stdin=subprocess.DEVNULL, stdout=out_w,
                                         stderr=out_w, pass_fds=(req_r, ans_w))
        finally:
            for fd in (req_r, ans_w, out_w):
                os.close(fd)
        for fd in (self._w, self._r, self._out):
            os.set_blocking(fd, False)
        job = {"chunks": chunks, "protect": [[str(p), str(why)] for p, why in protect],
               "allow": list(modules)}
        self._send(frame(job), time.monotonic() + STARTUP_SECONDS, "sending the submission")
    # ==== end of the boundary =======================================================================

    # -- requests --------------------------------------------------------------------------

    def request(self, meta, arrays, deadline, doing):
        """Send one request and return the answer ``(meta, arrays)``; ChildFailure otherwise."""
        if self.proc is None or self.returncode is not None:
            raise ChildFailure("died", "the submission process is not running")
        self._send(frame(meta, arrays), deadline, doing)
        return self._receive(deadline, doing)

    def _wait(self, deadline, doing, write=False):
        """Wait until the answer pipe is readable (or the request pipe writable), keeping the
        last OUTPUT_CAP bytes of what the child prints meanwhile."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail("timeout", doing)
            watch = [self._out] if self._out is not None else []
            ready_r, ready_w, _ = select.select(watch + ([] if write else [self._r]),
                                                [self._w] if write else [], [], left)
            if self._out is not None and self._out in ready_r:
                self._drain()
            if ready_w or self._r in ready_r:
                return

    def _drain(self):
        try:
            b = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            b = b""
        if not b:                                  # the child closed its output
            os.close(self._out)
            self._out = None
            return
        self._output += b
        del self._output[:-OUTPUT_CAP]

    def _send(self, data, deadline, doing):
        view = memoryview(data)
        while len(view):
            self._wait(deadline, doing, write=True)
            try:
                n = os.write(self._w, view)
            except BlockingIOError:
                continue
            except OSError:
                self._fail("died", doing)
            view = view[n:]

    # ==== THE BOUNDARY: reading what comes back (child.py's parse_header and split_body check the
    # frame; decode_value above re-checks each value). Nothing else reads from the child. ======
    def _read(self, n, deadline, doing):
        buf = bytearray()
        while len(buf) < n:
            self._wait(deadline, doing)
            try:
                b = os.read(self._r, min(n - len(buf), 1 << 20))
            except BlockingIOError:
                continue
            if not b:
                self._fail("died", doing)
            buf += b
        return buf

    def _receive(self, deadline, doing):
        n_head, n_body = struct.unpack("<QQ", bytes(self._read(16, deadline, doing)))
        if n_head > MAX_HEADER or n_body > MAX_MESSAGE:
            self._fail("corrupt", doing, f"the answer claims {n_head} + {n_body} bytes")
        try:
            meta, specs = parse_header(bytes(self._read(n_head, deadline, doing)), n_body)
        except ChildFailure:
            raise
        except Exception as exc:  # noqa: BLE001 -- any malformed answer is a failure
            self._fail("corrupt", doing, f"{type(exc).__name__}: {exc}")
        return meta, split_body(self._read(n_body, deadline, doing), specs)
    # ==== end of the boundary =======================================================================

    def _fail(self, kind, doing, detail=""):
        if kind == "timeout":
            self.kill()
            raise ChildFailure("timeout", f"no answer within the time limit while {doing}")
        if kind == "corrupt":
            self.kill()
            raise ChildFailure("corrupt", f"the answer while {doing} was malformed ({detail}); "
                                          "did the submission write to the grader's channel?")
        self._sample_cpu()
        reaped = _children_cpu()
        try:
            self.returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.returncode = None
        self._reaped += _children_cpu() - reaped
        end = time.monotonic() + 0.5                # what it printed last, if it comes soon
        while self._out is not None and time.monotonic() < end:
            if select.select([self._out], [], [], end - time.monotonic())[0]:
                self._drain()
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
        return bytes(self._output[-n_chars:]).decode("utf-8", "replace")

    def kill(self):
        """Kill the sandbox (its PID namespace), the process group and, as root, every process
        of the child's user ID; remove its private folder and what it left in world-writable
        ones."""
        mode = self.isolation.mode
        if self.proc is not None:
            self._sample_cpu()
            reaped = _children_cpu()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # the group: everything it started
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
            except (ProcessLookupError, OSError):
                pass
            try:
                rc = self.proc.wait(timeout=10)
                if self.returncode is None:
                    self.returncode = rc
            except subprocess.TimeoutExpired:
                pass
            self._reaped += _children_cpu() - reaped
            self.cpu_seconds = max(self.cpu_seconds, self._reaped)
            SPENT["processes"] += self.cpu_seconds
            SPENT["reaped"] += self._reaped
            self.proc = None
        sandbox.end_user(self.uid, mode)     # as root: every process of its user ID, its files
        for fd in (self._r, self._w, self._out):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = self._out = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)   # descriptor-based: no link followed
            self.workdir = None

    def close(self, grace=END_SECONDS):
        """End the process when its work is done: close its request pipe (the child exits when
        its requests end), wait up to ``grace`` seconds for it, then :meth:`kill` whatever is
        left. A process that ends by itself is waited for by its parents (bwrap's), so its CPU
        time reaches the grader's count of its children; a killed sandbox's is lost."""
        if self.proc is not None and self.returncode is None and self._w is not None:
            self._sample_cpu()
            try:
                os.close(self._w)
            except OSError:
                pass
            self._w = None
            reaped = _children_cpu()
            try:
                self.returncode = self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            self._reaped += _children_cpu() - reaped
        self.kill()

    def _sample_cpu(self):
        if self.proc is not None and self.proc.poll() is None:
            self.cpu_seconds = max(self.cpu_seconds, process_tree_cpu(self.proc.pid))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- the build-time check -------------------------------------------------------------------

_CHECK_SOURCE = "import numpy\n\n\ndef probe(x):\n    return numpy.asarray(x) * 2\n"


def check(requested="auto", protect=()):
    """Start one submission process exactly as grading does (:func:`.sandbox.choose`, then a
    :class:`Submission` under a user ID of its own): ``(isolation, None)`` when it loads a
    file with NumPy, else ``(isolation or None, why not)``. Automatic choice never settles
    for mode "none" here."""
    try:
        isolation = sandbox.choose(requested, protect, allow_none=False)
    except sandbox.SandboxUnavailable as exc:
        return None, str(exc)
    limits = {"cpu_seconds": 30, "memory_bytes": 2 << 30, "file_bytes": 1 << 20}
    with sandbox.submission_user(isolation):
        try:
            with Submission([{"filename": "check.py", "source": _CHECK_SOURCE,
                              "continue_on_error": False}], timeout=30, limits=limits,
                            protect=protect, isolation=isolation) as session:
                if session.load_error:
                    return isolation, (f"a submission could not load: "
                                       f"{session.load_error.get('message', session.load_error)}")
                if "probe" not in session.defined:
                    return isolation, "a submission loaded, but its function was not found"
        except (ChildFailure, OSError) as exc:
            return isolation, f"a submission process could not start: {exc}"
    return isolation, None
