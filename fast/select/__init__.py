"""The top-16 select: its launch policy (``policy``), the jit levels both decodes take
(``levels``), the one-warp PTX block (``warp_ptx``) and the MSA stock select's rows
(``ascending``)."""
