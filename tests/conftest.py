"""Helpers shared by the model tests (test_blocks, test_gpt, test_encdec) and the attention
tests (test_attention, test_mha, test_scoring), and the time limits of every test (below)."""
import time
import types

import numpy as np
import pytest


def well_conditioned(params, rng):
    """The parameters redrawn at a well-conditioned point: O(1/sqrt(fan_in)) weights (the
    embedding tables by their width), gammas near 1, biases O(0.3).

    GPT-2's 0.02 initialisation makes attention nearly uniform and the finite differences
    of its scores tiny; at this point every finite difference is well above rounding noise.
    """
    out = {}
    for k, a in params.items():
        if k.endswith(".gamma"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(a.shape)
        elif a.ndim == 1:
            out[k] = 0.3 * rng.standard_normal(a.shape)
        else:
            out[k] = rng.standard_normal(a.shape) / np.sqrt(a.shape[1] if k.endswith("wte") else a.shape[0])
    return out


def assert_attention_gradients(forward, kwargs, args, seed=0):
    """An attention op's backward (the registry's) against finite differences, to 1e-7
    (test_attention, test_mha, test_scoring)."""
    from numpytfmr.gradcheck import check_gradients
    from numpytfmr.registry import bind
    from numpytfmr.registry.attention import OPS
    backward = {spec.forward: spec.backward for spec in OPS}[forward]
    res = check_gradients(bind(forward, kwargs), backward, args, seed=seed)
    assert res.passed and max(res.errors.values()) <= 1e-7, str(res)


def mha_weights(rng, d_model, n_heads, n_kv_heads, d_head, *, biases=True, dtype=np.float64):
    """[Wq, Wk, Wv, Wo, bq, bk, bv, bo] of mha_forward, O(1/sqrt(fan_in)) (biases None
    without ``biases``)."""
    s = d_model ** -0.5
    W = [rng.standard_normal((d_model, n_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((d_model, n_kv_heads * d_head)) * s,
         rng.standard_normal((n_heads * d_head, d_model)) * (n_heads * d_head) ** -0.5]
    b = ([rng.standard_normal(n) * 0.3 for n in (n_heads * d_head, n_kv_heads * d_head,
                                                 n_kv_heads * d_head, d_model)]
         if biases else [None] * 4)
    return [None if a is None else a.astype(dtype) for a in W + b]


# --- time limits of the tests -----------------------------------------------------------------
# The machine running the suite may be busy with other work (two cores shared by several
# people, a CI runner), so no verdict may depend on how fast it runs.
#
# GRADING_TIMEOUT: the seconds per case (and for loading the submission) of a graded run
# whose submission finishes. Far above what any case takes, so a loaded machine gives the
# verdicts an idle one gives; nothing waits this long unless something is broken.
GRADING_TIMEOUT = 120.0
# HANG_TIMEOUT: the limit of the tests whose point is a hang (a loop at import or in a
# function), which wait it out once per hang. It must also let a correct submission load and
# run its cases on a loaded machine, so it is not 1 s.
HANG_TIMEOUT = 5.0
# COMMAND_TIMEOUT: how long a test waits for a command it runs in a subprocess before calling
# it hung; a guard against a test that never ends, not a speed target.
COMMAND_TIMEOUT = 600

# Hypothesis: no per-example deadline and no "data generation too slow" health check, whose
# verdicts follow the machine's load (each property test also says deadline=None itself).
try:
    from hypothesis import HealthCheck, settings as _hypothesis_settings
except ImportError:                       # the test extra installs it
    pass
else:
    _hypothesis_settings.register_profile(
        "numpytfmr", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    _hypothesis_settings.load_profile("numpytfmr")


@pytest.fixture(autouse=True)
def generous_grading_timeout(monkeypatch):
    """Every graded run of a test that sets no timeout of its own gets GRADING_TIMEOUT, not the
    grader's default of 10 s per case: ``grade()`` and ``numpytfmr grade`` without
    ``--timeout`` or a config that names one, and the grading.json that ``make_assignment()``
    writes (run in-process or by a command the test starts). A test that passes a timeout
    keeps it; the default itself is checked where it is documented, not relied on here."""
    from numpytfmr.grading import cases, skeleton
    monkeypatch.setitem(cases.DEFAULTS, "timeout", GRADING_TIMEOUT)
    monkeypatch.setitem(skeleton.make_assignment.__kwdefaults__, "timeout", GRADING_TIMEOUT)


def budget_in_cpu_seconds(monkeypatch, module):
    """Make the time budget of a training command (``--minutes``, read through ``module.time``)
    count this process's CPU seconds instead of the wall clock's, so that a run with a budget
    of a few seconds plans and trains the same on a machine busy with other work. Only
    ``module`` sees the change; the rest of the process keeps the real clock."""
    clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
    clock.perf_counter = time.process_time
    monkeypatch.setattr(module, "time", clock)


# --- running on every core ------------------------------------------------------------------
# With pytest-xdist (the test extra installs it), a plain `python -m pytest` runs the suite in
# one worker process per core (`-n auto`), as if `-n auto --dist loadgroup` had been given.
# Asking for anything else on the command line keeps it: `-n 0` or `-p no:xdist` runs the
# suite in this one process, `-n 4` in four. Every test passes either way.
#
# A fixture of module scope is made once in each worker that runs a test using it. Where making
# it is costly (a virtualenv, a built site, the browser, a trained or graded run), the tests of
# that module that use a fixture of module scope form one group, run by one worker, which makes
# it once (MADE_ONCE); everything else is spread test by test.
MADE_ONCE = {"test_commands", "test_grading_installs", "test_grading_sandbox",
             "test_grading_skeleton", "test_hf_export", "test_post_commands", "test_pretrain",
             "test_site", "test_site_browser"}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    option = config.option
    if (config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
            and getattr(option, "numprocesses", 0) is None and option.dist == "no"
            and not option.usepdb and not option.collectonly):
        option.numprocesses = "auto"
        option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests of a MADE_ONCE module that use a fixture of module scope join its group."""
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ not in MADE_ONCE:
            continue
        defs = item._fixtureinfo.name2fixturedefs.values()
        if any(d[-1].scope in ("module", "class", "package") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(module.__name__))
