"""The values the Taylor interpreter carries, the table of primitive rules, and the
messages of its refusals.

Every variable of the interpreted jaxpr is either a `Series` (its normalised
Taylor coefficients $x_0, \\ldots, x_K$ on a leading axis of length $K+1$) or a plain
value, which stands for a series whose coefficients above order 0 all vanish. Values
that do not depend on the input series (weights, masks, closed-over arrays) therefore
cost exactly what they cost in the original program.
"""

import os
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp


class Series:
    """The Taylor coefficients of one variable, shape `(K + 1, *aval.shape)`."""

    __slots__ = ("coeffs",)

    def __init__(self, coeffs: Any):
        self.coeffs = coeffs

    @property
    def primal(self) -> Any:
        return self.coeffs[0]

    def __repr__(self) -> str:
        return f"Series({self.coeffs!r})"


class Context:
    """What every rule needs besides its operands: the order; for error messages, the
    public call, the name of the function being expanded and the equations that
    enclose the current one; and the outputs of `custom_jvp` calls being solved for
    (see `_rules_custom`)."""

    __slots__ = ("api", "fn_name", "order", "pending", "stack")

    def __init__(
        self,
        order: int,
        api: str,
        fn_name: str,
        stack: tuple = (),
        pending: tuple = (),
    ):
        self.order = order
        self.api = api
        self.fn_name = fn_name
        self.stack = stack
        self.pending = pending

    def inside(self, eqn: Any) -> "Context":
        """The context of the equations of `eqn`'s inner jaxprs."""
        return Context(
            self.order, self.api, self.fn_name, self.stack + (eqn,), self.pending
        )

    def at_order(self, order: int, pending: tuple | None = None) -> "Context":
        pending = self.pending if pending is None else pending
        return Context(order, self.api, self.fn_name, self.stack, pending)

    def unsupported(
        self, eqn: Any, why: str = "", hint: str | None = None
    ) -> NotImplementedError:
        """The refusal of `eqn`: what the user wrote and where, and what to do."""
        name = eqn.primitive.name
        what = user_function(self.stack + (eqn,))
        where = user_line(self.stack + (eqn,))
        message = f"{self.api}: cannot expand "
        message += f"`{what}` (primitive '{name}')" if what else f"primitive '{name}'"
        message += f" at {where}" if where else ""
        message += f" in function {self.fn_name}"
        message += f": {why}." if why else ": it has no Taylor rule."
        message += " " + (HINTS.get(name, DEFAULT_HINT) if hint is None else hint)
        return NotImplementedError(message)


DEFAULT_HINT = (
    "Compute this step outside the function you expand and pass its result in, wrap "
    "it in `jax.lax.stop_gradient` if it does not depend on the expansion variable, "
    "or open an issue naming the primitive (the supported ones are listed by "
    "`hierax._taylor.supported_primitives()`)."
)

# What to do instead, for primitives users meet in practice.
HINTS: dict[str, str] = {
    "random_gamma": (
        "Sampling is not differentiable past first order: draw the sample outside "
        "the expanded function, or hold it fixed with `jax.lax.stop_gradient`."
    ),
    "eig": (
        "Non-Hermitian eigendecompositions have no rule: for a Hermitian matrix use "
        "`jnp.linalg.eigh`."
    ),
}


# --- where in the user's code ---------------------------------------------------

_LIBRARY_MARKERS = ("site-packages", "dist-packages", os.path.join("lib", "python"))
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_PUBLIC_PREFIXES = (
    ("jax/_src/numpy/linalg.py", "jnp.linalg."),
    ("jax/_src/numpy/fft.py", "jnp.fft."),
    ("jax/_src/numpy/", "jnp."),
    ("jax/_src/scipy/linalg.py", "jax.scipy.linalg."),
    ("jax/_src/scipy/special.py", "jax.scipy.special."),
    ("jax/_src/scipy/", "jax.scipy."),
    ("jax/_src/nn/", "jax.nn."),
    ("jax/_src/lax/linalg.py", "lax.linalg."),
    ("jax/_src/lax/", "lax."),
    ("jax/_src/random.py", "jax.random."),
)


def _is_library(file_name: str) -> bool:
    path = os.path.abspath(file_name)
    return path.startswith(_OWN_DIR) or any(m in path for m in _LIBRARY_MARKERS)


def _public_name(function_name: str, file_name: str) -> str:
    path = file_name.replace(os.sep, "/")
    for marker, prefix in _PUBLIC_PREFIXES:
        if marker in path:
            return prefix + function_name
    for package in ("equinox", "diffrax", "lineax", "optimistix", "jax"):
        if f"/{package}/" in path:
            return f"{package}.{function_name}"
    return function_name


def _frames(eqn: Any) -> list:
    traceback = getattr(eqn.source_info, "traceback", None)
    return list(traceback.frames) if traceback is not None else []


def user_line(eqns: tuple) -> str | None:
    """`file:line` of the user's code that produced the innermost of `eqns`: the
    first frame outside installed libraries, searching outwards."""
    for eqn in reversed(eqns):
        for frame in _frames(eqn):
            if not _is_library(frame.file_name):
                return f"{frame.file_name}:{frame.line_num}"
    return None


def user_function(eqns: tuple) -> str | None:
    """The library function the user called that led to the innermost of `eqns`
    (`jnp.linalg.solve` rather than `custom_linear_solve`), if there is one."""
    for eqn in eqns:  # outermost first: the call the user wrote
        closed = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        info = getattr(getattr(closed, "jaxpr", closed), "debug_info", None)
        source = getattr(info, "func_src_info", None) or ""
        if " at " in source:
            name, file_name = source.split(" at ", 1)
            if _is_library(file_name.rsplit(":", 1)[0]):
                return _public_name(name, file_name)
    frames = _frames(eqns[-1])
    for i, frame in enumerate(frames):
        if not _is_library(frame.file_name):
            for inner in reversed(frames[:i]):
                if "<locals>" not in inner.function_name and "/jax/_src/" in (
                    inner.file_name.replace(os.sep, "/")
                ):
                    if not any(
                        w in inner.file_name
                        for w in ("core.py", "pjit.py", "traceback_util", "api")
                    ):
                        return _public_name(inner.function_name, inner.file_name)
            return None
    return None


# --- the rule table ---------------------------------------------------------------

# Rules are keyed by primitive name. A rule is called as `rule(ctx, eqn, invals)` when
# at least one operand is a `Series`, and returns one value, or a list of values when
# the primitive has multiple results.
RULES: dict[str, Callable] = {}

# Names a primitive had in other JAX versions this package supports: registering the
# current name registers these too. Every other registered name must be a primitive
# of the installed JAX or Equinox (tested), so a misspelt rule cannot hide.
FORMER_NAMES: dict[str, tuple[str, ...]] = {
    "jit": ("pjit",),
    "custom_vjp_call": ("custom_vjp_call_jaxpr",),
}


def register(*names: str) -> Callable[[Callable], Callable]:
    def decorator(rule: Callable) -> Callable:
        for name in names:
            RULES[name] = rule
            for former in FORMER_NAMES.get(name, ()):
                RULES[former] = rule
        return rule

    return decorator


def is_series(x: Any) -> bool:
    return isinstance(x, Series)


def primal(x: Any) -> Any:
    return x.coeffs[0] if isinstance(x, Series) else x


def is_inexact(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def lift(order: int, x: Any, aval: Any = None) -> Any:
    """The coefficient array of `x`: a `Series` as it is, a plain value as itself at
    order 0 followed by zeros."""
    if isinstance(x, Series):
        return x.coeffs
    if aval is not None:
        x = jnp.asarray(x, dtype=aval.dtype)
        x = jnp.broadcast_to(x, aval.shape)
    else:
        x = jnp.asarray(x)
    rest = jnp.zeros((order,) + x.shape, x.dtype)
    return jnp.concatenate([x[None], rest], axis=0)
