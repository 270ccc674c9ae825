"""Splitting states and sparse operators across devices with `jax.sharding`."""

from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .._data import SparseMatrix
from ._pauli import PauliSum


def shard_rows(x: Any, mesh: Mesh, axis_name: str | None = None) -> Any:
    """Split the rows of states and sparse matrices across the devices of `mesh`;
    everything else is replicated. The hierax calls then run on every device at
    once (JAX's computation follows the data), with results identical to one device
    up to rounding.

    **Arguments:**

    - `x`: a state (`(n,)` or `(n, m)` array: its first axis is split), or an
        operator or any pytree holding [`hierax.SparseMatrix`][] terms (their rows
        are split; other arrays, such as time-function parameters and dense
        matrices, are replicated), or [`hierax.PauliSum`][]s (their strings are
        split: each device holds `capacity / devices` of them).
    - `mesh`: a `jax.sharding.Mesh`, e.g. `jax.make_mesh((4,), ("rows",))`; with
        `jax.distributed.initialize()` it may span several hosts.
    - `axis_name`: the mesh axis to split along (default: the mesh's first axis).

    **Returns:**

    `x` with its arrays placed on the mesh's devices.

    For a batch of states or parameters, split the batch axis instead:
    `jax.device_put(batch, NamedSharding(mesh, PartitionSpec("rows")))` and
    `jax.vmap` the call, with a mesh whose axes are automatic
    (`jax.make_mesh(..., axis_types=(jax.sharding.AxisType.Auto,))`); `shard_rows`
    makes the axes of the mesh it is given automatic itself.
    """
    api = "hierax.shard_rows"
    if not isinstance(mesh, Mesh):
        raise TypeError(f"`{api}`: `mesh` must be a jax.sharding.Mesh, got {mesh!r}.")
    axis = mesh.axis_names[0] if axis_name is None else axis_name
    if axis not in mesh.axis_names:
        raise ValueError(
            f"`{api}`: `axis_name` {axis!r} is not an axis of the mesh "
            f"{mesh.axis_names}."
        )
    count = mesh.shape[axis]
    # Automatic axes: XLA's partitioner decides where a product gathers the rows it
    # needs from other devices (explicit axes would ask every gather to say).
    mesh = Mesh(
        mesh.devices,
        mesh.axis_names,
        axis_types=(AxisType.Auto,) * len(mesh.axis_names),
    )
    rows = NamedSharding(mesh, PartitionSpec(axis))
    replicated = NamedSharding(mesh, PartitionSpec())

    def split(array: Any, what: str) -> Any:
        n = array.shape[0]
        if n % count:
            raise ValueError(
                f"`{api}`: {what} has {n} rows, which do not split evenly over the "
                f"{count} devices of mesh axis {axis!r}."
            )
        return jax.device_put(array, rows)

    def place(leaf: Any) -> Any:
        if isinstance(leaf, SparseMatrix):
            return SparseMatrix(
                split(leaf.values, "a sparse matrix"),
                split(leaf.columns, "a sparse matrix"),
                diagonal=leaf.diagonal,
            )
        if isinstance(leaf, PauliSum):
            what = "a Pauli sum's capacity"
            return PauliSum(
                x=split(leaf.x, what),
                z=split(leaf.z, what),
                coefficients=split(leaf.coefficients, what),
                count=jax.device_put(leaf.count, replicated),
                dropped=jax.device_put(leaf.dropped, replicated),
                n_qubits=leaf.n_qubits,
            )
        if eqx.is_array(leaf):
            return jax.device_put(leaf, replicated)
        return leaf

    if isinstance(x, (jax.Array, np.ndarray)):
        if x.ndim not in (1, 2):
            raise ValueError(
                f"`{api}`: a state must have shape (n,) or (n, m), got "
                f"{tuple(x.shape)}."
            )
        return split(x, "the state")
    return jax.tree_util.tree_map(
        place, x, is_leaf=lambda leaf: isinstance(leaf, (SparseMatrix, PauliSum))
    )


__all__ = ["shard_rows"]
