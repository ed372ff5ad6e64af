"""``python -m numpytfmr.grading --check``: can submission processes start here, and how are
they isolated? (Gradescope's setup.sh runs it at build time; see sandbox.py.)

It starts one submission process exactly as ``numpytfmr grade`` does (channel.check), and,
where the ``numpytfmr`` console script is installed beside this Python, runs ``numpytfmr grade
--check`` too: the command instructors type must pass the same check."""
import argparse
import os
import subprocess
import sys
import sysconfig

from .channel import check
from .grader import make_plan
from .sandbox import MODES


def console_script():
    """The ``numpytfmr`` console script of this Python's installation, or None."""
    path = os.path.join(sysconfig.get_path("scripts"), "numpytfmr")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def main(argv=None):
    """Exit 0 when submission processes start here in isolation, 1 (saying why) when not."""
    p = argparse.ArgumentParser(prog="python -m numpytfmr.grading",
                                description="Check that submission processes start here, and "
                                            "say how they are isolated.")
    p.add_argument("--check", action="store_true", help="start one, as grading would")
    p.add_argument("--isolation", choices=("auto",) + MODES, default="auto")
    args = p.parse_args(argv)
    isolation, problem = check(args.isolation, make_plan().protect)
    if problem or isolation is None or isolation.mode == "none":
        why = problem or "submissions would not be isolated (mode none)"
        print(f"numpytfmr sandbox: submissions cannot be isolated here: {why}", file=sys.stderr)
        return 1
    print(f"numpytfmr sandbox: {isolation.description}"
          + (f" (bubblewrap: {isolation.reason})" if isolation.reason else ""))
    script = console_script()
    if script is not None:
        proc = subprocess.run([script, "grade", "--check", "--isolation", args.isolation],
                              capture_output=True, text=True, timeout=600)
        said = " ".join((proc.stdout + proc.stderr).split())[-400:]
        if proc.returncode != 0:
            print(f"numpytfmr sandbox: the console script {script} fails the check: {said}",
                  file=sys.stderr)
            return 1
        print(f"numpytfmr sandbox: the console script {script} passes too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
