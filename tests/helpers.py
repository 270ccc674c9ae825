"""Shared test helpers: the Pauli matrices and the seed's known values, one
relative-error measure, and the oracles (SymPy + mpmath reference hierarchies, the
naive nested-`jacfwd` recursion, an ODE propagator) with the test systems, and the
runner of the scripts that tests start in subprocesses, and a counter of XLA
compiles.

JAX configuration (x64, rank promotion) is set once, in `conftest.py`, which pytest
loads before any test module imports this one.
"""

import contextlib
import functools
import gc
import json
import os
import pathlib
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
from benchmarks.oracle import (  # noqa: E402  (the oracle's symbol and matrices)
    SIGMA_X as SIGMA_X,
    SIGMA_Y as SIGMA_Y,
    SIGMA_Z as SIGMA_Z,
    t_sym as t_sym,
)
from jax.core import Tracer

import hierax


# The top row of X_k(1) for the seed (H(t) = cos(t) sigma_y, X_0 = sigma_x), as the
# question's record states it: an oracle independent of every implementation here.
SEED_EXACT = {
    2: (-1.682941969615793, -1.1677063269057155),
    9: (-15540.999433741366, 9987.578125605485),
}


class Counting(hierax.AbstractTimeFunction):
    """`function`, counting how often its series is traced (in `traces`, a static
    list: its structure cannot be hashed). hierax sees a time function of its
    own, not the one inside."""

    function: hierax.AbstractTimeFunction
    traces: list = eqx.field(static=True)

    @property
    def is_constant(self):
        return False

    def series(self, t, order, time_scale):
        self.traces.append(order)
        return self.function.series(t, order, time_scale)


_COMPILES: list[str] = []


@functools.cache
def _listen_to_compiles() -> None:
    def listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if "backend_compile" in event:
            _COMPILES.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)


def compile_count() -> int:
    """How many XLA compiles this process has run since the first call (JAX's
    compile events; a listener registered once)."""
    _listen_to_compiles()
    return len(_COMPILES)


def recorded_returns(monkeypatch: Any, module: Any, name: str) -> list:
    """Replace `module.name` for the test by a wrapper that records what each call
    returns (in order) in the list returned here."""
    returns: list = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        returns.append(real(*args, **kwargs))
        return returns[-1]

    monkeypatch.setattr(module, name, recording)
    return returns


def relative_error(computed: Any, reference: Any, *, per_level: bool = False) -> Any:
    """`||computed - reference|| / ||reference||` in the Frobenius norm: one float,
    or with `per_level=True` an array with one entry per index of the leading axis.
    A zero reference gives the absolute error."""
    computed = np.asarray(computed)
    reference = np.asarray(reference)
    if not per_level:
        computed, reference = computed[None], reference[None]
    count = len(reference)
    diff = np.linalg.norm((computed - reference).reshape(count, -1), axis=1)
    scale = np.linalg.norm(reference.reshape(count, -1), axis=1)
    errors = diff / np.where(scale > 0, scale, 1.0)
    return errors if per_level else float(errors[0])


# The per-level form under the name the hierarchy tests import.
relative_errors = functools.partial(relative_error, per_level=True)


# The SymPy oracle (SymPy differentiates each scalar time function symbolically,
# the values are taken with 30 digits, and the hierarchy runs as the direct Taylor
# recursion on truncated series in mpmath, independent of hierax) and its three
# systems live in `benchmarks/oracle.py`, whose accuracy and stress runs use them
# too: one copy, which the tests import (benchmarks never import the tests).
from benchmarks.oracle import (  # noqa: E402
    SYSTEMS as SYSTEMS,
    mp_relative_errors as mp_relative_errors,
    mp_series as mp_series,
    mp_to_numpy as mp_to_numpy,
    oscillator_system as oscillator_system,
    qutrit_system as qutrit_system,
    seed_system as seed_system,
    sympy_levels as sympy_levels,
)


# ----------------------------------------------------------------------------------
# The naive nested-`jacfwd` recursion: the definition itself, exponential in the order.
# ----------------------------------------------------------------------------------


def jacfwd_levels(
    step: Callable[[Any, Any, Any], Any],
    initial: Callable[[Any], Any],
    t: Any,
    order: int,
) -> Any:
    """Levels 0..order of `X_k(s) = step(s, X_{k-1}(s), dX_{k-1}/ds (s))` at `t`,
    with `X_0 = initial`, by nesting `jax.jacfwd` (independent of hierax; the cost
    grows exponentially with the order: keep it at 6 or below). `X_0` may be any
    pytree; the result has the same structure, with each leaf stacked over levels.
    """
    levels = [initial]
    for _ in range(order):
        below = levels[-1]
        levels.append(lambda s, below=below: step(s, below(s), jax.jacfwd(below)(s)))
    values = jax.jit(lambda s: [level(s) for level in levels])(jnp.asarray(t))
    return jax.tree.map(lambda *leaves: np.stack(leaves), *values)


def naive_levels(h_fn, x_fn, t, order):
    """X_0..X_order of the Heisenberg hierarchy `X_k = i[H, X_{k-1}] + dX_{k-1}/dt`
    by its definition (`jacfwd_levels`)."""

    def step(s, x, dx):
        h = h_fn(s)
        return 1j * (h @ x - x @ h) + dx

    return jacfwd_levels(step, lambda s: x_fn(s).astype(complex), t, order)


# ----------------------------------------------------------------------------------
# ODE propagation: U(t + tau) from U(t), and the Heisenberg observable.
# ----------------------------------------------------------------------------------


def propagate(h_fn, t0, tau, u0, rtol=1e-13):
    """Solve U' = -i H U from t0 to t0 + tau (DOP853, tight tolerances)."""
    u0 = np.asarray(u0, complex)
    shape = u0.shape

    def rhs(s, y):
        u = y[: y.size // 2] + 1j * y[y.size // 2 :]
        du = -1j * (np.asarray(h_fn(s)) @ u.reshape(shape)).ravel()
        return np.concatenate([np.real(du), np.imag(du)])

    y0 = np.concatenate([np.real(u0).ravel(), np.imag(u0).ravel()])
    sol = scipy.integrate.solve_ivp(
        rhs, (t0, t0 + tau), y0, method="DOP853", rtol=rtol, atol=1e-14
    )
    y = sol.y[:, -1]
    return (y[: y.size // 2] + 1j * y[y.size // 2 :]).reshape(shape)


# ----------------------------------------------------------------------------------
# Scripts in subprocesses (documentation pages, examples, fresh-interpreter checks)
# ----------------------------------------------------------------------------------


def session_folder(tmp_path_factory: Any) -> pathlib.Path:
    """The test session's temporary folder, shared by its pytest-xdist workers
    (each worker's own base folder sits inside it)."""
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared


def once_per_session(
    shared: pathlib.Path, name: str, compute: Callable[[], dict], timeout: float
) -> dict:
    """`compute()` (a JSON-serialisable dict) run once per test session, not once
    per pytest-xdist worker: the first process to create the lock folder
    `shared/<name>.lock` computes and writes `shared/<name>.json`; the others wait
    up to `timeout` seconds for it and read it."""
    status = shared / f"{name}.json"
    try:
        (shared / f"{name}.lock").mkdir()  # atomic: one process wins
    except FileExistsError:
        for _ in range(int(timeout * 10)):
            if status.exists():
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"the test session's {name} did not finish in time")
    else:
        try:
            report = dict(value=compute())
        except Exception:
            report = dict(error=traceback.format_exc())  # for the waiters too
        written = status.with_suffix(".tmp")
        written.write_text(json.dumps(report), encoding="utf-8")
        written.replace(status)  # atomic: waiters never read half a report
    report = json.loads(status.read_text(encoding="utf-8"))
    if "error" in report:
        raise RuntimeError(f"the test session's {name} failed:\n{report['error']}")
    return report["value"]


def run_script(
    args: list[str], *, env: dict[str, str], devices: int, **kwargs: Any
) -> subprocess.CompletedProcess:
    """`subprocess.run(args, env=env, ...)` for a Python process that starts JAX on
    `devices` host devices, with the test processes' compile flags (`conftest.py`:
    scripts that compile dozens of programs and run each briefly spend most of
    their time compiling)."""
    flags = os.environ.get("XLA_FLAGS", "")
    flags = f"--xla_force_host_platform_device_count={devices} {flags}".strip()
    kwargs = dict(capture_output=True, text=True, **kwargs)
    return subprocess.run(args, env={**env, "XLA_FLAGS": flags}, **kwargs)


# Scripts run one after another in one subprocess (one interpreter and one JAX
# start for all of them), each as `python <file> <argv...>` would run it: in a fresh
# namespace with `__name__ == "__main__"`, its own `sys.argv` and output, and x64
# reset to JAX's default (off). The garbage collector's thresholds are the test
# process's (`conftest.py`: when garbage is collected, not what a script computes).
_SCRIPT_RUNNER = """
import contextlib, gc, io, json, sys, traceback

listing, results_path, thresholds = sys.argv[1], sys.argv[2], sys.argv[3]
gc.set_threshold(*json.loads(thresholds))
import jax
scripts = json.loads(open(listing, encoding="utf-8").read())
results = {}
for name, script in scripts.items():
    jax.config.update("jax_enable_x64", False)  # each script starts from the default
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [script["file"], *script["argv"]]
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = compile(script["code"], script["file"], "exec")
            exec(code, {"__name__": "__main__", "__file__": script["file"]})
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else int(
                exit_.code is not None
            )
        except BaseException:
            traceback.print_exc()
            status = 1
    results[name] = dict(status=status, stdout=out.getvalue(), stderr=err.getvalue())
with open(results_path, "w", encoding="utf-8") as file:
    json.dump(results, file)
"""


def run_scripts(
    scripts: dict[str, dict[str, Any]],
    folder: pathlib.Path,
    devices: int = 4,
    **kwargs: Any,
) -> dict[str, dict[str, Any]]:
    """Run `scripts` (by name: `code`, and optionally the `file` it is read from and
    its `argv`) in one subprocess on `devices` host devices (`run_script`'s keyword
    arguments pass through); by name, each one's exit status (`status`), standard
    output (`stdout`) and standard error (`stderr`). `folder` (new) keeps the
    exchange files."""
    folder.mkdir()
    listing = {
        name: dict(code=s["code"], file=s.get("file", name), argv=s.get("argv", []))
        for name, s in scripts.items()
    }
    (folder / "scripts.json").write_text(json.dumps(listing), encoding="utf-8")
    results = folder / "results.json"
    process = run_script(
        [
            sys.executable,
            "-c",
            _SCRIPT_RUNNER,
            str(folder / "scripts.json"),
            str(results),
            json.dumps(gc.get_threshold()),
        ],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        devices=devices,
        timeout=900,
        **kwargs,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    return json.loads(results.read_text(encoding="utf-8"))


# Checks that need an interpreter of their own (JAX's defaults: x64 off, no pytest
# plugin, nothing imported but what the check imports; several host devices)
# register their code at import (`fresh_script`). The first test to ask runs every
# registered check with `run_scripts`; the session's processes share the outputs.
_FRESH_SCRIPTS: dict[str, dict[str, Any]] = {}


def fresh_script(name: str, code: str) -> str:
    """Register `code` (a script) to run in the session's fresh interpreter under
    `name`; `fresh_output(..., name)` gives what it did."""
    _FRESH_SCRIPTS[name] = dict(code=code)
    return name


def fresh_output(tmp_path_factory: Any, name: str) -> dict[str, Any]:
    """The registered script `name` as run in the session's fresh interpreter: its
    exit status (`status`), standard output (`stdout`) and error (`stderr`)."""
    shared = session_folder(tmp_path_factory)
    runs = once_per_session(
        shared,
        "fresh-scripts",
        lambda: run_scripts(_FRESH_SCRIPTS, shared / "fresh-scripts"),
        900,
    )
    return runs[name]


@contextlib.contextmanager
def no_reads_to_the_host():
    """Fail on any read of a concrete JAX array's values back to the host: JAX's
    transfer guard (which on a CPU sees only host-to-device transfers, a CPU
    array's memory being the host's), and a spy on NumPy's conversions and on the
    arrays' scalar conversions, which catch reads there too."""
    kind = type(jnp.zeros(1))
    saved = {}

    def refuse(*args, **kwargs):
        raise AssertionError("a JAX array was read back to the host")

    for name in ("__float__", "__complex__", "__int__", "__bool__", "item", "tolist"):
        saved[name] = kind.__dict__.get(name)
        setattr(kind, name, refuse)
    converters = {n: getattr(np, n) for n in ("asarray", "array", "asanyarray")}

    def spy(convert):
        def call(x, *args, **kwargs):
            if isinstance(x, jax.Array) and not isinstance(x, Tracer):
                refuse()
            return convert(x, *args, **kwargs)

        return call

    try:
        for name, convert in converters.items():
            setattr(np, name, spy(convert))
        with jax.transfer_guard("disallow"):
            yield
    finally:
        for name, convert in converters.items():
            setattr(np, name, convert)
        for name, method in saved.items():
            if method is None:
                delattr(kind, name)
            else:
                setattr(kind, name, method)


def dense_lanczos(dh, do, steps):
    """b_1 ... b_steps of the observable `do` under the Hamiltonian `dh` (dense
    matrices), by Lanczos with full reorthogonalisation, twice, in NumPy."""
    d = dh.shape[0]
    inner = lambda a, b: np.trace(a.conj().T @ b) / d
    previous, current, b_prev, bs, basis = 0 * do, do, 0.0, [], []
    current = current / np.sqrt(inner(do, do).real)
    basis.append(current)
    for _ in range(steps):
        a = dh @ current - current @ dh - b_prev * previous
        for _ in range(2):
            for v in basis:
                a = a - inner(v, a) * v
        b = np.sqrt(inner(a, a).real)
        bs.append(b)
        previous, current, b_prev = current, a / b, b
        basis.append(current)
    return np.array(bs)
