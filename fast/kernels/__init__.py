"""The jit kernels of the runtime (Triton and Gluon); their host-side launch policy lives
beside the decodes (``fast.scorer``, ``fast.msa.scorer``, ``fast.select.policy``)."""
