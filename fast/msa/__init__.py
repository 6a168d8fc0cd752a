"""The BF16 / FP8 key format under the MSA rules (docs/DESIGN.md §10), as ``reference/msa/``
holds its contract: the block scorer (``scorer``), the stock decode (``stock``) and the CP
decode (``cp``), each a subclass of the NVFP4 format's decode with the same interface, and
their kernels (``kernels/``)."""
