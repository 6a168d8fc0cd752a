"""The Triton implementation of CP decode (kernels, symmetric buffers, rank launcher).

Kernels are not here yet; ``fast.backend`` already decides where Triton code runs.
"""
