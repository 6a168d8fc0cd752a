"""The top-16 select: its launch policy (``policy``), the jit levels every decode takes
(``levels``) and the one-warp PTX block (``warp_ptx``)."""
