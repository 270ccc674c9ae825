"""Taylor rules of the primitives that are linear in their time-dependent operands.

A linear map acts on each coefficient separately, so these rules run the primitive
itself, batched over the order axis with `jax.vmap`. Operands in which the primitive
is not linear (indices, predicates) are plain values: they are integers or booleans,
whose coefficients above order 0 vanish.
"""

from collections.abc import Callable, Container
from typing import Any

import jax

from ._core import Context, Series, is_series, lift, primal, register
from ._interpreter import bind


def batched(eqn: Any, args: list[Any], axes: list[int | None]) -> Any:
    """Apply `eqn`'s primitive to each coefficient of the operands mapped on axis 0."""
    prim, params = eqn.primitive, eqn.params
    return jax.vmap(lambda *a: prim.bind(*a, **params), in_axes=axes)(*args)


def wrap(eqn: Any, out: Any) -> Any:
    if eqn.primitive.multiple_results:
        return [Series(o) for o in out]
    return Series(out)


def linear_rule(positions: Container[int] | None = None) -> Callable:
    """The rule of a primitive linear in the operands at `positions` (all if None)."""

    def rule(ctx: Context, eqn: Any, invals: list[Any]) -> Any:
        args: list[Any] = []
        axes: list[int | None] = []
        for i, (x, v) in enumerate(zip(invals, eqn.invars, strict=True)):
            if positions is None or i in positions:
                args.append(lift(ctx.order, x, v.aval))
                axes.append(0)
            elif is_series(x):
                raise ctx.unsupported(
                    eqn,
                    f"its operand {i} depends on the expansion variable",
                )
            else:
                args.append(x)
                axes.append(None)
        return wrap(eqn, batched(eqn, args, axes))

    return rule


_all_linear = linear_rule()
for _name in (
    "neg",
    "conj",
    "real",
    "imag",
    "complex",
    "transpose",
    "reshape",
    "broadcast_in_dim",
    "squeeze",
    "rev",
    "concatenate",
    "pad",
    "slice",
    "split",
    "reduce_sum",
    "cumsum",
    "convert_element_type",
    "reduce_precision",
    "copy",
    "stack",
    "unstack",
    "reduce_window_sum",
    "fft",
    "device_put",
    "reshard",
):
    register(_name)(_all_linear)

register("dynamic_slice", "gather")(linear_rule({0}))
register("dynamic_update_slice")(linear_rule({0, 1}))
register("scatter", "scatter-add")(linear_rule({0, 2}))

# Equinox's loop internals (diffrax's solves): a buffer write and a select whose
# predicate is a plain boolean.
register("maybe_set", "select_if_vmap")(linear_rule({1, 2}))


@register("nonbatchable")
def _identity(ctx: Context, eqn: Any, invals: list[Any]) -> Any:
    # Equinox's marker that a value must not be batched; it is the identity, and the
    # order axis is not a batch of the user's.
    return invals[0]


class _AllButFirst:
    def __contains__(self, i: object) -> bool:
        return isinstance(i, int) and i > 0


register("select_n")(linear_rule(_AllButFirst()))


@register("add", "sub", "add_any")
def _add(ctx: Context, eqn: Any, invals: list[Any]) -> Any:
    x, y = invals
    out_shape = eqn.outvars[0].aval.shape
    if (
        is_series(x) != is_series(y)
        and eqn.invars[0].aval.shape == eqn.invars[1].aval.shape == out_shape
    ):
        # A constant only moves coefficient 0.
        if is_series(x):
            if eqn.primitive.name == "sub":
                return Series(x.coeffs.at[0].add(-y))
            return Series(x.coeffs.at[0].add(y))
        shifted = -y.coeffs if eqn.primitive.name == "sub" else y.coeffs
        return Series(shifted.at[0].add(x))
    return _all_linear(ctx, eqn, invals)


@register("optimization_barrier")
def _identity_many(ctx: Context, eqn: Any, invals: list[Any]) -> Any:
    return list(invals)


def zero_derivative_rule(ctx: Context, eqn: Any, invals: list[Any]) -> Any:
    """Piecewise-constant functions: their coefficients above order 0 vanish (away
    from their jumps), as for JAX's own derivatives."""
    return bind(eqn, [primal(x) for x in invals])


for _name in ("sign", "floor", "ceil", "round", "stop_gradient", "nextafter"):
    register(_name)(zero_derivative_rule)
