"""The kernels: one file per recursion, each the one implementation of its maths,
taking series and term structures (never operators or solver terms)."""
