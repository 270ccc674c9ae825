"""`host_method`: a method of an Equinox module looked up as a plain bound call.

Equinox makes every method looked up on a module instance a `BoundMethod` module,
so that `jax.jit(model.method)` works; building it costs 22 us on each look-up
(equinox 0.13, measured: `m.f(1)` 22 us against 0.6 us through this descriptor).
The queries that the calls answer in Python before compiling (is this operator
Hermitian, mirrored, what its known matrices are) run on every eager call of
`floquet` and the rewrites, and are never handed to JAX as callables: they are
`host_method`s.
"""

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload


_S = TypeVar("_S")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class host_method(Generic[_S, _P, _R]):
    """Decorates a method (also under `abc.abstractmethod`, which it keeps): on an
    instance it gives `functools.partial(method, instance)`, on the class the
    function itself."""

    def __init__(self, func: Callable[Concatenate[_S, _P], _R]):
        self.func = func
        functools.update_wrapper(cast(Any, self), func)

    @overload
    def __get__(
        self, obj: None, cls: Any = None
    ) -> Callable[Concatenate[_S, _P], _R]: ...

    @overload
    def __get__(self, obj: _S, cls: Any = None) -> Callable[_P, _R]: ...

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self.func
        return functools.partial(self.func, obj)
