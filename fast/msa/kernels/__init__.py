"""The MSA format's jit kernels: the block scorers (``scorer_dot``, ``scorer_mma`` and its
``block_ring``), the stock select (``select``, ``ascending``) and the CP plan, push and
merge output (``cp``)."""
