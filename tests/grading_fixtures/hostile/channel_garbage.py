# Hostile (appended to the correct submission): writes garbage into the grader's answer channel.
import os as _os
import sys as _sys


def relu_forward(x):
    for fd in _sys.argv[1:]:
        try:
            _os.write(int(fd), b"\xff" * 64)
        except (OSError, ValueError):
            pass
    return np.maximum(x, 0), {"pos": x > 0}
