"""The operating system's isolation of a submission process: how a child is started.

Three modes, chosen once per grading run (:func:`choose`), the strongest that works here:

``bubblewrap``
    The child runs under ``bwrap`` (Debian's ``bubblewrap``) in fresh PID, mount, IPC, UTS and
    network namespaces. Its filesystem is read-only and holds only what Python and NumPy need
    (the system's ``/usr``, the interpreter's prefix, NumPy's own folder); every site-packages
    folder is hidden behind an empty read-only tmpfs, so the reference, installed autodiff
    libraries, the grading config, the other submissions and the results do not exist inside.
    It writes only to size-capped tmpfs folders (``/home/student``, its home and working folder, and
    ``/tmp`` and ``/dev/shm``), all discarded when it ends. Its ``/proc`` shows its own processes
    only. It runs in a new user namespace, with further user namespaces disabled, mapped to the
    grader's user, or, as root, to a user ID of the child's own (below). Where that user cannot
    reach the interpreter (a Python in root's home), bwrap runs as root without a user namespace
    and the child drops to its user ID before Python loads anything else. Killing the sandbox's first process kills its whole PID
    namespace: nothing it started outlives it.
``user``
    Root without a working bubblewrap: the child runs as an unprivileged user ID of its own
    (``UID_BASE`` + the grading process's PID, no groups), in a private folder only that user can
    read, with the same resource limits. Every process of that user is killed at the end, and
    the files it left in the shared temporary folders are removed.
``none``
    Neither: the child runs as the grader's own user. Only the resource limits, a new session
    and the audit hook (child.py; not a security boundary) stand in its way. Reports say
    "not isolated", and a whole class is graded this way only when asked (``--no-isolation``).

Every mode sets the same resource limits (CPU time, address space, file size, open files and,
where a user ID is the child's own, the number of processes), runs ``python -I -S`` with a
minimal environment, and talks to the grader only over pipes (see channel.py).
"""
from dataclasses import dataclass
import functools
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


def child_uid():
    """The user ID of this grading process's submissions (root only): its own, unprivileged."""
    return UID_BASE + os.getpid()


# --- choosing ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def bubblewrap_problem():
    """None when a bubblewrap sandbox starts Python and imports NumPy here, else why not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu/Fedora package: bubblewrap)"
    try:
        proc = subprocess.run(**launch("bubblewrap", ["-c", _PROBE + _SANDBOXED], uid=child_uid(),
                                       limits=_PROBE_LIMITS), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not be started ({exc})"
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        return f"bwrap could not start Python with NumPy (exit {proc.returncode}: {tail})"
    return None


def choose(requested="auto"):
    """The :class:`Isolation` for this run. ``requested``: "auto" (the strongest that works),
    or one of MODES. SandboxUnavailable when that mode cannot work here, or when the environment
    variable NUMPYTFMR_REQUIRE_SANDBOX=1 asks for bubblewrap and it does not work."""
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
    if requested == "auto":
        if not problem:
            return Isolation("bubblewrap")
        if _is_root():
            return Isolation("user", problem)
        return Isolation("none", problem + "; and the grader is not root, so it cannot give "
                                           "each submission a user ID of its own")
    if requested == "user" and not _is_root():
        raise SandboxUnavailable("isolation by user ID needs the grader to run as root")
    return Isolation(requested)


# --- starting ------------------------------------------------------------------------------

_PROBE_LIMITS = {"cpu_seconds": 30, "memory_bytes": 2 << 30, "file_bytes": 1 << 20}
# what a submission process does first (child.py), then NumPy; and, in the sandbox, a check
_PROBE = ("import json, os, sys; s = json.loads(sys.argv[-1]); sys.path[:0] = s['path']\n"
          "if s['drop']: os.setgroups([]); os.setgid(s['drop'][1]); os.setuid(s['drop'][0])\n"
          "import numpy\n")
_SANDBOXED = "assert os.getuid() != 0 and not os.path.exists('/etc/passwd')\n"
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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


def _site_folders():
    """Folders of installed packages this Python knows of, to hide in the sandbox."""
    import site
    import sysconfig
    found = set(site.getsitepackages() + [site.getusersitepackages()])
    found.update(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    found.update(p for p in sys.path if p and os.path.isdir(p))
    out = set()
    for p in found:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in stdlib and not real.startswith(
                tuple(s + "/lib-dynload" for s in stdlib)) and real != "/":
            out.add(real)
    return sorted(out)


def _inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _bwrap_argv(python, protect, show, drop):
    """The bwrap options: a read-only system, the interpreter, NumPy, nothing else."""
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
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
    trees = ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            trees.append(top)
    for extra in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        if not _inside(extra, trees):
            trees.append(extra)
    for tree in trees:
        for parent in _ancestors(tree):
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", tree, tree]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    hide = sorted({p for p in _site_folders() + [os.path.realpath(p) for p, _ in protect]
                   if _inside(p, trees) and os.path.lexists(p)}, key=len)
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


def _ancestors(path):
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def launch(mode, python_args, *, uid, limits, protect=(), modules=("numpy",), workdir=None):
    """The keyword arguments of ``subprocess.Popen`` that start ``python -I -S *python_args``
    in ``mode``: ``args``, ``env``, ``cwd``, ``preexec_fn`` and, in "user" mode, the IDs.

    python_args: what follows ``-I -S`` (``["-c", source, ...]``); child.py reads its last
        argument as JSON: ``{"path": [...], "drop": [uid, gid] or null}``
    uid: the child's own user ID (used as root only)
    protect: (path, why) pairs that must not exist inside the bubblewrap sandbox
    workdir: the private working folder in modes "user" and "none"
    """
    show, path = allowed_paths(modules)
    root = _is_root()
    env = dict(_ENV)
    if mode == "bubblewrap":
        python = os.path.realpath(sys.executable)
        # As root, bwrap itself runs as the child's user ID, in a user namespace, when that
        # user can reach the interpreter and NumPy; where it cannot (an interpreter in root's
        # home), bwrap runs as root without one and the child drops to its user ID first.
        as_child = root and _reachable_by_all([python, os.path.realpath(sys.base_prefix)] + show)
        drop = root and not as_child
        setup = {"path": path, "drop": [uid, uid] if drop else None}
        if as_child:
            protect = [(p, why) for p, why in protect if _reachable_by_all([os.path.dirname(p)])]
        argv = _bwrap_argv(python, protect, show, drop)
        if as_child:
            argv[1:1] = ["--uid", str(uid), "--gid", str(uid)]
        for k, v in dict(env, HOME=WORK, TMPDIR=WORK).items():
            argv += ["--setenv", k, v]
        args = argv + ["--", python, "-I", "-S"] + list(python_args) + [json.dumps(setup)]
        out = {"args": args, "env": env, "cwd": "/",
               "preexec_fn": _limiter(limits, processes=MAX_PROCESSES if root
                                      else MAX_PROCESSES + _processes_of(os.getuid()))}
        if as_child:
            out.update(user=uid, group=uid, extra_groups=[])
        return out
    setup = {"path": path, "drop": None}
    env.update(HOME=workdir or "/nonexistent", TMPDIR=workdir or "/tmp")
    out = {"args": [sys.executable, "-I", "-S"] + list(python_args) + [json.dumps(setup)],
           "env": env, "cwd": workdir or "/", "start_new_session": True,
           "preexec_fn": _limiter(limits, processes=MAX_PROCESSES if mode == "user" else 0)}
    if mode == "user":
        out.update(user=uid, group=uid, extra_groups=[])
    return out


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
    signals everything it may signal (``kill(-1)``) until nothing is left."""
    pid = os.fork()
    if pid == 0:                                     # the child: never returns
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(10000):
                os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            code = 0
        except BaseException:                        # noqa: BLE001 -- report by exit status
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def remove_files_of(uid, folders=SHARED_TMP):
    """Remove what user ``uid`` left at the top of the shared temporary folders, without
    following a link (a folder is walked by descriptors)."""
    for folder in folders:
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


# --- the build-time check ----------------------------------------------------------------------

def check(requested="auto"):
    """Start one isolated Python with NumPy, as a submission's would start; return
    (isolation, None) when it works, else (isolation or None, why not)."""
    try:
        isolation = choose(requested)
    except SandboxUnavailable as exc:
        return None, str(exc)
    if isolation.mode == "bubblewrap":
        return isolation, None                      # choose() ran the very same probe
    folder = private_folder(isolation.mode, child_uid())
    try:
        kw = launch(isolation.mode, ["-c", _PROBE], uid=child_uid(),
                    limits=_PROBE_LIMITS, workdir=folder)
        proc = subprocess.run(**kw, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return isolation, f"Python could not be started ({exc})"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.decode("utf-8", "replace").split())[-300:]
        return isolation, f"Python with NumPy did not start (exit {proc.returncode}: {tail})"
    return isolation, None


def main(argv=None):
    """``python -m numpytfmr.grading --check``: exit 0 when submission processes can
    start here in isolation, 1 (saying why) when none can."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m numpytfmr.grading",
                                description="Check that submission processes start here, and "
                                            "say how they are isolated.")
    p.add_argument("--check", action="store_true", help="start one, as grading would")
    p.add_argument("--isolation", choices=("auto",) + MODES, default="auto")
    args = p.parse_args(argv)
    isolation, problem = check(args.isolation)
    if isolation is not None and not problem and isolation.mode != "none":
        print(f"numpytfmr sandbox: {isolation.description}"
              + (f" (bubblewrap: {isolation.reason})" if isolation.reason else ""))
        return 0
    why = problem or (f"neither bubblewrap nor a user ID of its own is available "
                      f"({isolation.reason})")
    print(f"numpytfmr sandbox: submissions cannot be isolated here: {why}", file=sys.stderr)
    return 1

