"""The parameter sweeps of `bench_sweeps.py` and `bench_devices.py`: each as a hierax
solve of one element, a hand-written diffrax Dopri8 of one element (real and
imaginary parts), and a scipy DOP853 reference of the whole batch (rtol 1e-13, in
float64 whatever JAX's precision). Matrices are complex128 NumPy arrays; JAX takes
them at its precision (complex64 without x64).
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from peers import real_embedding
from systems import dop853_final
from timing import alternating_times

import hierax


SX = np.array([[0, 1], [1, 0]], complex)
SZ = np.diag([1.0, -1.0]).astype(complex)


def dopri8(field, y0, span, rtol, args=None, throw=True):
    """diffrax Dopri8 of `field(t, y, args)` from `y0` over `[0, span]` (PID
    control at `rtol`, atol rtol / 100): the final state and the steps. `throw`:
    diffrax's (`False`: no host callback in the program)."""
    s = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Dopri8(),
        0.0,
        span,
        None,
        y0,
        args=args,
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=rtol / 100),
        max_steps=100_000,
        throw=throw,
    )
    return s.ys[-1], s.stats["num_steps"]  # pyright: ignore[reportOptionalSubscript]


class QubitSweep:
    """256 detunings of a qubit under a Gaussian pi pulse."""

    name = "qubit"
    span, mean, width = 12.0, 6.0, 1.5

    def __init__(self, count: int = 256):
        self.amplitude = np.pi / (self.width * np.sqrt(2 * np.pi))
        self.params = np.linspace(-2.0, 2.0, count)
        self.start = np.array([1.0, 0.0], complex)

    def pulse(self, t, xp=np):
        return self.amplitude * xp.exp(-((t - self.mean) ** 2) / (2 * self.width**2))

    def detuning(self, param):
        """The detuning of the element of parameter `param` (NumPy or JAX)."""
        return param

    def scale(self, param):
        """The factor on the pulse of the element of parameter `param` (a constant
        here: not a batched value, which would make the amplitude a swept one)."""
        del param
        return 1.0

    def hamiltonian(self, param):
        return hierax.TimeOperator(
            [
                hierax.Constant(self.detuning(param) / 2),
                hierax.Gaussian(
                    self.mean, self.width, self.scale(param) * self.amplitude / 2
                ),
            ],
            [SZ, SX],
        )

    def hierax_one(self, rtol, order=None, throw=True):
        times = jnp.array([0.0, self.span])
        start = jnp.asarray(self.start)

        def one(delta):
            s = hierax.sesolve(
                self.hamiltonian(delta),
                start,
                times,
                rtol=rtol,
                atol=rtol / 100,
                order=order,
                throw=throw,
            )
            return s.final_state, s.stats["num_steps"]

        return one

    def diffrax_one(self, rtol, throw=True):
        z, x = real_embedding(-1j * SZ / 2), real_embedding(-1j * SX / 2)
        z, x = jnp.asarray(z), jnp.asarray(x)
        y0 = jnp.concatenate([np.real(self.start), np.imag(self.start)])

        def field(t, y, param):
            drive = self.scale(param) * self.pulse(t, jnp)
            return self.detuning(param) * (z @ y) + drive * (x @ y)

        def one(param):
            y, steps = dopri8(field, y0, self.span, rtol, param, throw)
            return y[:2] + 1j * y[2:], steps

        return one

    def reference(self):
        """All elements as one real ODE for scipy's DOP853."""
        b = len(self.params)
        d = self.detuning(self.params)

        def derivative(t, psi):
            w = self.scale(self.params) * self.pulse(t) / 2
            out = np.empty_like(psi)
            out[:, 0] = -1j * (d / 2 * psi[:, 0] + w * psi[:, 1])
            out[:, 1] = -1j * (w * psi[:, 0] - d / 2 * psi[:, 1])
            return out

        return dop853_final(derivative, np.tile(self.start, (b, 1)), self.span)


class RabiSweep(QubitSweep):
    """256 amplitudes of the same Gaussian pulse (pulse areas 0 to 4 pi) on a qubit
    detuned by 0.3: a Rabi sweep, the drive's amplitude a traced parameter."""

    name = "rabi"

    def __init__(self, count: int = 256):
        super().__init__(count)
        self.params = np.linspace(0.0, 4.0, count)

    def detuning(self, param):
        del param
        return 0.3

    def scale(self, param):
        return param


class StatesSweep:
    """64 initial kets of a driven random 32-level system."""

    name = "states"
    span, frequency, drive = 10.0, 1.3, 0.3

    def __init__(self, n: int = 32, count: int = 64, seed: int = 0):
        rng = np.random.default_rng(seed)

        def hermitian():
            m = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
            m = (m + m.conj().T) / 2
            return m / np.max(np.abs(np.linalg.eigvalsh(m)))

        self.h0, self.v = 2 * hermitian(), hermitian()
        kets = rng.normal(size=(count, n)) + 1j * rng.normal(size=(count, n))
        self.params = kets / np.linalg.norm(kets, axis=1, keepdims=True)
        self.n = n

    def hamiltonian(self):
        return hierax.TimeOperator(
            [hierax.Constant(1.0), hierax.Cos(self.frequency, 0.0, self.drive)],
            [self.h0, self.v],
        )

    def hierax_one(self, rtol, order=None, throw=True):
        times = jnp.array([0.0, self.span])
        h = self.hamiltonian()

        def one(ket):
            s = hierax.sesolve(
                h, ket, times, rtol=rtol, atol=rtol / 100, order=order, throw=throw
            )
            return s.final_state, s.stats["num_steps"]

        return one

    def hierax_columns(self, rtol):
        """The batch as the columns of one state: no `vmap`."""
        times = jnp.array([0.0, self.span])
        h = self.hamiltonian()

        def solve(kets):
            s = hierax.sesolve(h, kets.T, times, rtol=rtol, atol=rtol / 100)
            return s.final_state.T, s.stats["num_steps"]

        return solve

    def diffrax_one(self, rtol, throw=True):
        g0 = jnp.asarray(real_embedding(-1j * self.h0))
        g1 = jnp.asarray(real_embedding(-1j * self.v))
        n = self.n

        def field(t, y, args):
            del args
            c = self.drive * jnp.cos(self.frequency * t)
            return g0 @ y + c * (g1 @ y)

        def one(ket):
            y0 = jnp.concatenate([ket.real, ket.imag])
            y, steps = dopri8(field, y0, self.span, rtol, throw=throw)
            return y[:n] + 1j * y[n:], steps

        return one

    def reference(self):
        def derivative(t, psi):
            h = self.h0 + self.drive * np.cos(self.frequency * t) * self.v
            return -1j * (h @ psi)

        return dop853_final(derivative, self.params.T, self.span).T


# --- ladders of tolerances, shared by the sweep benchmarks --------------------------


def ladder_calls(make):
    """`make(rtol)`'s `one(param) -> (state, steps)` mapped over a batch and jitted
    with rtol traced, `f(params, rtol)`: one compile serves the whole ladder."""
    return jax.jit(jax.vmap(lambda p, rtol: make(rtol)(p), in_axes=(0, None)))


def step_summary(steps) -> dict:
    steps = np.asarray(steps).ravel()
    return dict(
        min=int(steps.min()), median=float(np.median(steps)), max=int(steps.max())
    )


def run_ladder(methods, params, reference, rtols, repeats, error_of):
    """For each rtol, the methods (`f(params, rtol) -> (states, steps)`) take
    turns: error (`error_of(states, reference)`; a point whose error is not finite
    is marked failed), steps, times."""
    out = {name: [] for name in methods}
    args = jnp.asarray(params)
    for rtol in rtols:
        r = jnp.asarray(rtol)
        calls = {name: (lambda f=f, r=r: f(args, r)) for name, f in methods.items()}
        times = alternating_times(calls, repeats)
        for name, f in methods.items():
            states, steps = f(args, r)
            error = error_of(states, reference)
            out[name].append(
                dict(
                    rtol=rtol,
                    error=error,
                    failed=not np.isfinite(error),
                    steps=step_summary(steps),
                    seconds=float(np.median(times[name])),
                    spread=[float(np.min(times[name])), float(np.max(times[name]))],
                )
            )
    return out


def print_ladder(ladder: dict) -> None:
    """Each method's ladder, a line a point: rtol, error, steps, time."""
    for name, points in ladder.items():
        for p in points:
            s = p["steps"]
            print(
                f"{name:>15} rtol {p['rtol']:.0e}: error {p['error']:.1e}, "
                f"steps {s['min']}/{s['median']:.0f}/{s['max']}, "
                f"{p['seconds'] * 1e3:.2f} ms"
            )
