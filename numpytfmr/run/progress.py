"""A small progress bar for the long-running commands (train, dpo, bench, ...).

On a terminal it redraws one line; elsewhere (CI logs, pipes) it prints a line at
every tenth of the run, so logs stay short.
"""
import sys
import time

__all__ = ["Progress"]


def _fmt_time(seconds):
    seconds = max(0, int(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """``with Progress(total, "train") as bar: bar.update(metrics={"loss": 1.2}, tokens=512)``."""

    def __init__(self, total, desc="", *, stream=None, enabled=True, width=24):
        self.total = max(1, int(total))
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.n = 0
        self.tokens = 0
        self.start = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_decile = -1
        self.metrics = {}

    def update(self, n=1, *, metrics=None, tokens=0):
        self.n = min(self.total, self.n + n)
        self.tokens += tokens
        if metrics:
            self.metrics.update(metrics)
        if not self.enabled:
            return
        decile = (10 * self.n) // self.total
        if self.tty:
            self.stream.write("\r" + self.line())
            self.stream.flush()
        elif decile != self._last_decile:
            self._last_decile = decile
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self):
        elapsed = time.perf_counter() - self.start
        frac = self.n / self.total
        filled = int(self.width * frac)
        bar = "#" * filled + "-" * (self.width - filled)
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        parts = [f"{self.desc} [{bar}] {self.n}/{self.total}"]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.metrics.items()]
        if self.tokens and elapsed > 0:
            parts.append(f"{self.tokens / elapsed:,.0f} tok/s")
        parts.append(f"{_fmt_time(elapsed)}<{_fmt_time(eta)}")
        return "  ".join(parts)

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
