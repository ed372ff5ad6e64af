"""The operating system's isolation of a submission process: how a child is started.

Three modes, chosen once per grading run (:func:`choose`), each started by one function below
(:func:`launch_bubblewrap`, :func:`launch_user`, :func:`launch_none`):

``bubblewrap``
    The child runs under ``bwrap`` (Debian's ``bubblewrap``) in fresh PID, mount, IPC, UTS and
    network namespaces. Its filesystem is read-only and holds only what Python and NumPy need:
    the system's ``/usr``, the interpreter's installation (its own folder, its standard library
    and shared libraries) and NumPy's own folder. Every site-packages folder, the reference and
    the grading files are hidden behind empty read-only tmpfs folders (or ``/dev/null`` for a
    file), so the reference, installed autodiff libraries, the config, the other submissions
    and the results do not exist inside. The interpreter is the installation's own binary
    (a virtual environment's base interpreter), never hidden, however the grader was started
    (``numpytfmr grade``, ``python -m``, pyenv, conda, ``venv --copies``, ``/usr/local``).
    It writes only to size-capped tmpfs folders (``/home/student``, its home and working
    folder, and ``/tmp`` and ``/dev/shm``), all discarded when it ends. Its ``/proc`` shows its
    own processes only. It runs in a new user namespace, with further user namespaces disabled,
    mapped to the grader's user, or, as root, to the submission's own user ID (below). Where
    that user cannot reach the interpreter (a Python in root's home), bwrap runs as root
    without a user namespace and the child drops to its user ID before Python loads anything
    else. Killing the sandbox's first process kills its whole PID namespace.
``user``
    Root without a working bubblewrap: the child runs as an unprivileged user ID of the
    submission's own, in a private folder only that user can read, with the same resource
    limits. Every process of that user is killed at the end, and what it owns in every
    world-writable folder (found by a walk of the filesystem) is removed. Chosen automatically
    only where a probe run as that user shows that the reference, the config and the other
    submissions are unreadable to it.
``none``
    Neither: the child runs as the grader's own user. Only the resource limits, a new session
    and the audit hook (child.py; not a security boundary) stand in its way. Reports say
    "not isolated"; chosen automatically only for one submission, graded by a user who is not
    root, without a grading config (nothing secret to keep).

User IDs (as root): each submission gets its own from the reserved range (``UID_BASE`` and
up), never reused within a run: a run claims a block of the range (a lock file in a folder
only root may use) and counts up in it, across its worker processes (:func:`new_uid`,
:func:`submission_user`).

Every mode sets the same resource limits (CPU time, address space, file size, open files and,
where a user ID is the child's own, the number of processes), runs ``python -I -S`` with a
minimal environment, and talks to the grader only over pipes (see channel.py).
"""
import contextlib
from dataclasses import dataclass
import functools
import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

REQUIRE_ENV = "NUMPYTFMR_REQUIRE_SANDBOX"
UID_BASE = int(os.environ.get("NUMPYTFMR_UID_BASE", "2000000000"))
UID_BLOCK = 1 << 16              # user IDs a run may hand out
UID_BLOCKS = 2048                # runs at once on one machine: the range ends below 2**31
                                 # (bwrap refuses --uid above that)
UID_STATE = "/run/numpytfmr-uids"   # the runs' block claims (root only)
WORK = "/home/student"           # the sandbox's working folder, home and TMPDIR
TMP_BYTES = 64 << 20             # its size; /tmp and /dev/shm get SHM_BYTES each
SHM_BYTES = 16 << 20
MAX_PROCESSES = 32               # per submission, where its user ID is its own
MAX_OPEN_FILES = 256
MODES = ("bubblewrap", "user", "none")
DESCRIPTION = {
    "bubblewrap": "bubblewrap sandbox (own PID, mount, IPC and network namespaces; read-only "
                  "filesystem without the reference, the config or other submissions)",
    "user": "own unprivileged user ID and private folder (no namespaces: files readable by "
            "every user stay readable)",
    "none": "not isolated (the submission ran as the grader's own user)",
}
INSTALL = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
           "bubblewrap)")


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot be had on this machine; the message says why."""


@dataclass(frozen=True)
class Isolation:
    """How submission processes are started: ``mode`` (one of MODES) and, for the terminal,
    ``reason`` (why this mode and not a stronger one)."""
    mode: str
    reason: str = ""

    @property
    def description(self):
        return DESCRIPTION[self.mode]


def _is_root():
    return os.geteuid() == 0


def interpreter():
    """The Python binary submission processes run: the installation's own (a virtual
    environment's base interpreter, which needs no pyvenv.cfg), resolved through links."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    for candidate in (base, sys.executable):
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and os.access(real, os.X_OK):
            return real
    return os.path.realpath(sys.executable)


# --- user IDs --------------------------------------------------------------------------------

_RUN = {}             # this run's block of user IDs: {"fd", "block", "next"} (kept across fork)
_CURRENT = []         # the user ID of the submission this process grades (submission_user)


def _state_folder():
    """A folder only root may use, for the runs' claims; None where there is none."""
    try:
        os.mkdir(UID_STATE, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(UID_STATE)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        return None
    return UID_STATE


def _claim_block():
    """Claim a block of user IDs for this run (a lock held while any of its processes lives)."""
    import fcntl
    import multiprocessing
    import random

    if _RUN:
        return _RUN
    folder = _state_folder()
    start = random.randrange(UID_BLOCKS)
    block, fd = start, None
    for k in range(UID_BLOCKS if folder else 0):
        block = (start + k) % UID_BLOCKS
        fd = os.open(os.path.join(folder, f"{block}.lock"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            os.close(fd)
            fd = None
    # the counter lives in shared memory: the class's forked workers count on from it
    _RUN.update(fd=fd, block=block, next=multiprocessing.get_context("fork").Value("Q", 0))
    return _RUN


def claim_user_ids():
    """As root, claim this run's block of user IDs now (before worker processes fork, so that
    they count on in one block); nothing otherwise."""
    if _is_root():
        _claim_block()


def new_uid():
    """A user ID from the reserved range that no process of this run has had (root only; the
    grader's own where not root). Any process an earlier run left under it is killed first."""
    if not _is_root():
        return os.getuid()
    run = _claim_block()
    with run["next"].get_lock():
        k = run["next"].value
        run["next"].value += 1
    if k >= UID_BLOCK:
        raise SandboxUnavailable(f"this run has used all {UID_BLOCK} of its user IDs")
    uid = UID_BASE + run["block"] * UID_BLOCK + k
    kill_user(uid)
    return uid


def child_uid():
    """The user ID of the submission being graded (:func:`submission_user`), else a fresh one."""
    return _CURRENT[-1] if _CURRENT else new_uid()


@contextlib.contextmanager
def submission_user(isolation):
    """While one submission is graded: every process started for it runs under one user ID of
    its own (as root); at the end every process of that ID is killed and, in mode "user", what
    it owns in the world-writable folders is removed. Yields the user ID."""
    uid = new_uid()
    _CURRENT.append(uid)
    try:
        yield uid
    finally:
        _CURRENT.pop()
        end_user(uid, isolation.mode)


def end_user(uid, mode):
    """Kill every process of ``uid`` and, in mode "user", remove what it left where any user
    may write (root only; nothing otherwise)."""
    if _is_root() and mode != "none" and uid != 0:
        kill_user(uid)
        if mode == "user":
            remove_files_of(uid)


# --- choosing ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def bubblewrap_problem():
    """None when a bubblewrap sandbox starts Python and imports NumPy here, else why not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu/Fedora package: bubblewrap)"
    try:
        proc = subprocess.run(**launch("bubblewrap", ["-c", _PROBE + _SANDBOXED], uid=new_uid(),
                                       limits=_PROBE_LIMITS), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not be started ({exc})"
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        return f"bwrap could not start Python with NumPy (exit {proc.returncode}: {tail})"
    return None


def choose(requested="auto", protect=(), *, allow_none=True):
    """The :class:`Isolation` for this run; SandboxUnavailable (one line: why, and what to
    install) when it cannot be had.

    requested: "auto" or one of MODES. "auto" takes bubblewrap where it works; otherwise, as
        root, mode "user" only where :func:`user_problem` finds nothing in ``protect``
        readable by a submission's user; otherwise "none" where ``allow_none`` (one submission
        with nothing secret, graded by a user who is not root); otherwise it refuses. The
        environment variable NUMPYTFMR_REQUIRE_SANDBOX=1 makes anything but bubblewrap an
        error. "user" asked for by name is refused only where the submission's user cannot
        start Python with NumPy.
    protect: (path, why) pairs a submission may not read.
    """
    if requested not in ("auto",) + MODES:
        raise ValueError(f"isolation is {requested!r}; expected auto, {', '.join(MODES)}")
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    problem = bubblewrap_problem() if requested in ("auto", "bubblewrap") else None
    if requested == "bubblewrap" or (required and requested == "auto"):
        if problem:
            why = f" ({REQUIRE_ENV}=1)" if required and requested == "auto" else ""
            raise SandboxUnavailable(f"the bubblewrap sandbox is required{why} but cannot run: "
                                     f"{problem}")
        return Isolation("bubblewrap")
    if requested == "user":
        if not _is_root():
            raise SandboxUnavailable("isolation by user ID needs the grader to run as root")
        why = user_problem(protect, readable_ok=True)
        if why:
            raise SandboxUnavailable(f"isolation by user ID cannot work here: {why}; or {INSTALL}")
        return Isolation("user")
    if requested == "none":
        return Isolation("none")
    if not problem:
        return Isolation("bubblewrap")
    if _is_root():
        why = user_problem(protect)
        if why is None:
            return Isolation("user", problem)
        raise SandboxUnavailable(f"{problem}; and isolation by user ID alone would not hold: {why}"
                                 f". To grade safely, {INSTALL}; or name --isolation user or "
                                 "--isolation none to grade anyway")
    if allow_none:
        return Isolation("none", problem + "; and the grader is not root, so it cannot give "
                                           "each submission a user ID of its own")
    raise SandboxUnavailable(f"{problem}, and the grader is not root (no user ID of its own for "
                             f"each submission). To grade safely, {INSTALL}; or name "
                             "--isolation none (--no-isolation) to grade anyway")


_READABLE_CAP = 2000             # protected files a probe tries to read


def _files_to_probe(protect):
    """The protected paths, and the files below protected folders (no link followed; at most
    _READABLE_CAP), that a submission's user must not be able to read."""
    out = []
    for path, _ in protect:
        path = os.path.abspath(os.fspath(path))
        if not os.path.lexists(path):
            continue
        out.append(path)
        if os.path.isdir(path) and not os.path.islink(path):
            for root, dirs, files in os.walk(path):
                out += [os.path.join(root, n) for n in dirs + files]
                if len(out) > _READABLE_CAP:
                    break
        if len(out) > _READABLE_CAP:
            break
    return sorted(set(out))[:_READABLE_CAP]


def user_problem(protect=(), readable_ok=False):
    """None when a process of a submission's user ID starts Python with NumPy here and (unless
    ``readable_ok``) can read nothing in ``protect``; else one sentence saying why not. The
    probe runs as that user (root only)."""
    uid = new_uid()
    python = interpreter()
    unreachable = _unreachable(python)
    if unreachable:
        return (f"the submissions' user ({uid}) cannot run the interpreter {python}: {unreachable}"
                " (use a Python every user can run)")
    paths = _files_to_probe(protect)
    folder = private_folder("user", uid)
    try:
        kw = launch("user", ["-c", _PROBE + _READ_PROBE], uid=uid, limits=_PROBE_LIMITS,
                    workdir=folder)
        proc = subprocess.run(**kw, input=json.dumps(paths).encode(), capture_output=True,
                              timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return (f"the submissions' user ({uid}) cannot start {python} ({exc}; use a Python "
                "every user can run)")
    finally:
        end_user(uid, "user")
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        return (f"the submissions' user ({uid}) cannot start Python with NumPy (exit "
                f"{proc.returncode}: {tail}; use a Python and NumPy every user can run)")
    if readable_ok:
        return None
    try:
        readable = json.loads(proc.stdout.decode("utf-8"))
    except ValueError:
        return "the probe's answer could not be read"
    if readable:
        return (f"a submission's user can read {len(readable)} protected file(s), e.g. "
                f"{readable[0]} (make them unreadable to others: chmod -R o-rwx)")
    return None


def _unreachable(path):
    """Why a user other than root cannot execute ``path`` ("" when it can)."""
    for parent in ["/"] + _ancestors(path):
        try:
            mode = os.stat(parent).st_mode
        except OSError as exc:
            return f"{parent}: {exc.strerror}"
        if not mode & stat.S_IXOTH:
            return (f"{parent} is not searchable by other users (mode "
                    f"{stat.S_IMODE(mode):04o})")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not mode & stat.S_IXOTH:
        return f"it is not executable by other users (mode {stat.S_IMODE(mode):04o})"
    return ""


# --- starting ------------------------------------------------------------------------------

_PROBE_LIMITS = {"cpu_seconds": 30, "memory_bytes": 2 << 30, "file_bytes": 1 << 20}
# what a submission process does first (child.py), then NumPy; and, in the sandbox, a check
_PROBE = ("import json, os, sys; s = json.loads(sys.argv[-1]); sys.path[:0] = s['path']\n"
          "if s['drop']: os.setgroups([]); os.setgid(s['drop'][1]); os.setuid(s['drop'][0])\n"
          "import numpy\n")
_SANDBOXED = ("import importlib.util\n"
              "assert os.getuid() != 0 and not os.path.exists('/etc/passwd')\n"
              "assert importlib.util.find_spec('numpytfmr') is None\n")
# in mode "user": which of the paths on standard input this user can open or list
_READ_PROBE = ("got = []\n"
               "for p in json.loads(sys.stdin.read()):\n"
               "    try:\n"
               "        os.listdir(p) if os.path.isdir(p) else os.close(os.open(p, os.O_RDONLY))\n"
               "        got.append(p)\n"
               "    except OSError:\n"
               "        pass\n"
               "print(json.dumps(got))\n")
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_PASSED_ON = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _env(**extra):
    """The submission's environment: ``_ENV``, the machine's OpenBLAS settings (on some
    processors NumPy's OpenBLAS needs them to start, or to compute right), and ``extra``."""
    return dict(_ENV, **{k: os.environ[k] for k in _PASSED_ON if k in os.environ}, **extra)


def _limiter(limits, processes):
    """A preexec_fn setting the child's resource limits (it runs after fork, before exec);
    ``processes``: the limit on the number of processes of its user ID (0: none)."""
    import resource

    def cap(which, soft, hard):
        _, current = resource.getrlimit(which)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(which, (soft, hard))

    def apply():
        cpu = int(limits["cpu_seconds"])
        cap(resource.RLIMIT_CPU, cpu, cpu + 2)
        cap(resource.RLIMIT_AS, int(limits["memory_bytes"]), int(limits["memory_bytes"]))
        cap(resource.RLIMIT_FSIZE, int(limits["file_bytes"]), int(limits["file_bytes"]))
        cap(resource.RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES)
        cap(resource.RLIMIT_CORE, 0, 0)
        if processes:
            cap(resource.RLIMIT_NPROC, processes, processes)
    return apply


def _processes_of(uid):
    """How many processes user ``uid`` runs now: the process limit counts them all, so a
    sandbox that shares the grader's user ID gets MAX_PROCESSES on top of them."""
    count = 0
    for pid in os.listdir("/proc"):
        try:
            count += pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            pass
    return count


def allowed_paths(modules=("numpy",)):
    """(package folders to show, folders to put on sys.path) for the importable ``modules``:
    each package's own folder and its wheel's vendored libraries (``numpy.libs``)."""
    import importlib.util
    show, path = [], []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            raise ValueError(f"module {name!r} is not installed for this Python")
        places = list(spec.submodule_search_locations or []) or [spec.origin]
        for place in places:
            place = os.path.realpath(place)
            parent = os.path.dirname(place)
            show.append(place)
            libs = os.path.join(parent, f"{name}.libs")
            if os.path.isdir(libs):
                show.append(os.path.realpath(libs))
            if parent not in path:
                path.append(parent)
    return show, path


def _stdlib():
    """The interpreter's standard library folders (never hidden)."""
    import sysconfig
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib")})


def _inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _trees(python):
    """The folders the sandbox shows, read-only: the system's, and the interpreter's
    installation (its prefix, its own folder, its standard library)."""
    trees = ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.isdir(top) and not os.path.islink(top):
            trees.append(top)
    for extra in [os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix),
                  os.path.dirname(python)] + _stdlib():
        if not _inside(extra, trees):
            trees.append(extra)
    return trees


def _shared_library():
    """libpython, where the interpreter loads it from outside the folders shown (else None)."""
    import sysconfig
    name, libdir = sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LIBDIR")
    if not (sysconfig.get_config_var("Py_ENABLE_SHARED") and name and libdir):
        return None
    path = os.path.realpath(os.path.join(libdir, name))
    return path if os.path.isfile(path) else None


def _package_folders(trees):
    """Every folder of installed packages in ``trees``: what ``site`` knows of for this
    interpreter and its base, and what a look finds in the usual places (``lib*/python*/
    {site,dist}-packages``, under ``local/`` too, conda's environments and package cache)."""
    import site
    import sysconfig
    prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    found = set(site.getsitepackages(prefixes)) | {site.getusersitepackages()}
    for p in prefixes:
        paths = sysconfig.get_paths(vars={"base": p, "platbase": p})
        found.update(paths[k] for k in ("purelib", "platlib"))
    patterns = ["lib*/python*/*-packages", "local/lib*/python*/*-packages",
                "envs/*/lib/python*/site-packages", "pkgs"]
    for tree in trees:
        for pattern in patterns:
            found.update(glob.glob(os.path.join(tree, pattern)))
    return {os.path.realpath(p) for p in found if p}


@functools.lru_cache(maxsize=None)
def _hidden_folders(python):
    """The folders to hide in the sandbox: every package folder in the shown trees and every
    ``sys.path`` entry (PYTHONPATH, a script's folder), but never the interpreter's own
    folder, its standard library, or a folder above them."""
    trees = _trees(python)
    keep = [os.path.dirname(python)] + _stdlib()
    out = set(_package_folders(trees))
    for p in sys.path:
        real = os.path.realpath(p) if p else ""
        if real and not _inside(real, _stdlib()):
            out.add(real)
    return sorted(p for p in out if os.path.isdir(p) and p != "/" and _inside(p, trees)
                  and not any(_inside(k, [p]) for k in keep))


def _ancestors(path):
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


# ==== THE BOUNDARY: starting a submission process ===============================================
# One function per mode returns the keyword arguments of subprocess.Popen. Nothing else in the
# grader starts student code (channel.Submission calls launch()).

def launch(mode, python_args, *, uid, limits, protect=(), modules=("numpy",), workdir=None):
    """The keyword arguments of ``subprocess.Popen`` that start ``python -I -S *python_args``
    in ``mode``: ``args``, ``env``, ``cwd``, ``preexec_fn`` and, as root, the IDs.

    python_args: what follows ``-I -S`` (``["-c", source, ...]``); child.py reads its last
        argument as JSON: ``{"path": [...], "drop": [uid, gid] or null}``
    uid: the child's own user ID (used as root only)
    protect: (path, why) pairs that must not exist inside the bubblewrap sandbox
    workdir: the private working folder in modes "user" and "none"
    """
    if mode == "bubblewrap":
        return launch_bubblewrap(python_args, uid=uid, limits=limits, protect=protect,
                                 modules=modules)
    if mode == "user":
        return launch_user(python_args, uid=uid, limits=limits, modules=modules, workdir=workdir)
    return launch_none(python_args, limits=limits, modules=modules, workdir=workdir)


def launch_bubblewrap(python_args, *, uid, limits, protect, modules):
    """bwrap, then the interpreter. As root, bwrap runs as ``uid`` in a user namespace when that
    user can reach the interpreter and NumPy; otherwise as root without one, and the child
    drops to ``uid`` before anything loads."""
    show, path = allowed_paths(modules)
    python, root = interpreter(), _is_root()
    reach = [python, os.path.realpath(sys.base_prefix)] + show + [
        f for f in (_shared_library(),) if f]
    as_child = root and _reachable_by_all(reach)
    drop = root and not as_child
    if as_child:                # paths the child's user could not reach anyway need no mount
        protect = [(p, w) for p, w in protect if _reachable_by_all([os.path.dirname(p)])]
    argv = _bwrap_argv(python, protect, show, drop)
    if as_child:
        argv[1:1] = ["--uid", str(uid), "--gid", str(uid)]
    for k, v in _env(HOME=WORK, TMPDIR=WORK).items():
        argv += ["--setenv", k, v]
    setup = {"path": path, "drop": [uid, uid] if drop else None}
    out = {"args": argv + ["--", python, "-I", "-S"] + list(python_args) + [json.dumps(setup)],
           "env": _env(), "cwd": "/",
           "preexec_fn": _limiter(limits, MAX_PROCESSES if root
                                  else MAX_PROCESSES + _processes_of(os.getuid()))}
    if as_child:
        out.update(user=uid, group=uid, extra_groups=[])
    return out


def launch_user(python_args, *, uid, limits, modules, workdir):
    """The interpreter as ``uid`` (no groups), in its private ``workdir``, in a new session."""
    _, path = allowed_paths(modules)
    return {"args": [interpreter(), "-I", "-S"] + list(python_args)
            + [json.dumps({"path": path, "drop": None})],
            "env": _env(HOME=workdir or "/nonexistent", TMPDIR=workdir or "/tmp"),
            "cwd": workdir or "/", "start_new_session": True,
            "preexec_fn": _limiter(limits, MAX_PROCESSES),
            "user": uid, "group": uid, "extra_groups": []}


def launch_none(python_args, *, limits, modules, workdir):
    """The interpreter as the grader's own user, in a new session (not isolated)."""
    _, path = allowed_paths(modules)
    return {"args": [interpreter(), "-I", "-S"] + list(python_args)
            + [json.dumps({"path": path, "drop": None})],
            "env": _env(HOME=workdir or "/nonexistent", TMPDIR=workdir or "/tmp"),
            "cwd": workdir or "/", "start_new_session": True,
            "preexec_fn": _limiter(limits, 0)}

# ==== end of the boundary =======================================================================


def _bwrap_argv(python, protect, show, drop):
    """The bwrap options: a read-only system, the interpreter's installation, NumPy; every
    package folder and protected path hidden."""
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--clearenv"]
    if drop:            # root: no user namespace; the child drops to its own user ID itself
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    # the writable folders first: what Python and NumPy need is bound over them where it lives
    # below one (a virtualenv in /tmp)
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--chmod", "1777", "/dev/shm",
             "--size", str(SHM_BYTES), "--tmpfs", "/tmp", "--chmod", "1777", "/tmp",
             "--size", str(TMP_BYTES), "--tmpfs", WORK, "--chmod", "1777", WORK]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
    trees = _trees(python)
    files = [f for f in (_shared_library(),) if f and not _inside(f, trees)]
    for tree in trees + files:
        for parent in _ancestors(tree):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", tree, tree]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    keep = [python] + _stdlib() + files
    protected = [os.path.realpath(p) for p, _ in protect]
    hide = sorted({p for p in list(_hidden_folders(python)) + protected
                   if _inside(p, trees) and os.path.lexists(p)
                   and not any(_inside(k, [p]) for k in keep)}, key=len)
    hidden_dirs = []
    for p in hide:
        if os.path.isdir(p):
            argv += ["--tmpfs", p]
            hidden_dirs.append(p)
        else:
            argv += ["--ro-bind", "/dev/null", p]
    for p in show:
        for parent in _ancestors(p):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", p, p]
    for p in hidden_dirs:
        argv += ["--remount-ro", p]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK]
    return argv


def _reachable_by_all(paths):
    """Whether every folder above each of ``paths`` may be searched by any user."""
    try:
        return all(os.stat(parent).st_mode & stat.S_IXOTH
                   for p in paths for parent in _ancestors(os.path.realpath(p)) + ["/"])
    except OSError:
        return False


def readable_by_all(path):
    """Whether any user may read ``path`` (every folder above it searchable by others, and it
    readable by others): what isolation by user ID alone leaves open."""
    try:
        return _reachable_by_all([path]) and bool(os.stat(os.path.realpath(path)).st_mode
                                                  & stat.S_IROTH)
    except OSError:
        return False


def private_folder(mode, uid):
    """A fresh working folder for a child in mode "user" (owned by its user, mode 0700) or
    "none" (the grader's, 0700); None under bubblewrap (its /tmp is a tmpfs of its own)."""
    if mode == "bubblewrap":
        return None
    folder = tempfile.mkdtemp(prefix="numpytfmr-grade-")
    if mode == "user":
        os.chown(folder, uid, uid)
    return folder


# --- ending ---------------------------------------------------------------------------------

def kill_user(uid):
    """Kill every process of user ``uid`` (root only): a forked process takes that user ID and
    signals everything it may signal (``kill(-1)``) until no process of the ID is left
    (:func:`_left_of`; Linux's ``kill(-1)`` succeeds whenever the machine runs any other
    process, so its status cannot tell). Returns whether none is left."""
    pid = os.fork()
    if pid == 0:                                     # the child: never returns
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            me = os.getpid()
            for _ in range(_KILL_ROUNDS):
                os.kill(-1, signal.SIGKILL)
                if not _left_of(uid, me):
                    code = 0
                    break
        except ProcessLookupError:
            code = 0
        except BaseException:                        # noqa: BLE001 -- report by exit status
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


_KILL_ROUNDS = 1000              # kill(-1) rounds (each with a look at /proc: a few seconds in
                                 # all) before kill_user gives up on a process that will not die


def _left_of(uid, me):
    """Whether a live process (not a zombie) other than ``me`` has ``uid`` as its real, effective
    or saved user ID: one ``kill(-1)`` from that user may signal. Read from each process's
    ``/proc/PID/status`` (its credentials, whatever the owner of its ``/proc`` folder)."""
    wanted = str(uid)
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                text = f.read(4096).decode("ascii", "replace")
        except OSError:                              # gone meanwhile
            continue
        state = uids = None
        for line in text.splitlines():
            if line.startswith("State:"):
                state = line.split()[1:2]
            elif line.startswith("Uid:"):
                uids = line.split()[1:4]
                break
        if uids and wanted in uids and state not in (["Z"], ["X"]):
            return True
    return False


# file systems with nothing a submission could write to, and trees too large to walk
_PSEUDO = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs",
           "bpf", "configfs", "fusectl", "pstore", "binfmt_misc", "autofs", "nsfs"}


def _pseudo_mounts():
    out = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                fstype = parts[parts.index("-") + 1]
                if fstype in _PSEUDO:
                    out.add(parts[4].encode().decode("unicode_escape"))
    except (OSError, ValueError, IndexError):
        out.update({"/proc", "/sys"})
    return out


@functools.lru_cache(maxsize=None)
def world_writable_folders():
    """Every folder any user may write in and reach (``/tmp``, ``/var/tmp``, ``/dev/shm``,
    ``/run/lock``, ``/dev/mqueue``...): found by a walk of the filesystem from ``/`` that
    follows no link, enters only folders other users may search, skips pseudo file systems
    (/proc, /sys) and opens no folder without subfolders (its link count is 2)."""
    skip, found, todo = _pseudo_mounts(), [], ["/"]
    while todo:
        folder = todo.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False) or entry.path in skip:
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not st.st_mode & stat.S_IXOTH:
                    continue
                if st.st_mode & stat.S_IWOTH:
                    found.append(entry.path)
                if st.st_nlink != 2:
                    todo.append(entry.path)
    return tuple(sorted(found))


def remove_files_of(uid, folders=None):
    """Remove what user ``uid`` left in the world-writable ``folders`` (default: all of them,
    :func:`world_writable_folders`), without following a link (a folder is walked by
    descriptors)."""
    for folder in world_writable_folders() if folders is None else folders:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            for entry in os.scandir(fd):
                try:
                    st = entry.stat(follow_symlinks=False)
                    if st.st_uid != uid:
                        continue
                    _remove(entry.name, fd, stat.S_ISDIR(st.st_mode))
                except OSError:
                    continue
        finally:
            os.close(fd)


def _remove(name, dir_fd, is_dir):
    """Remove ``name`` in the folder ``dir_fd``, a folder with all it holds; links are removed,
    never followed."""
    if not is_dir:
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for entry in os.scandir(fd):
            _remove(entry.name, fd, entry.is_dir(follow_symlinks=False))
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
