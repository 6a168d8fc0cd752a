"""The NVFP4 format's input checks under their earlier name: ``reference.inputs`` holds them
(the name of their MSA twin, ``reference.msa.inputs``)."""

from .inputs import DecodeInputs, check_cp, check_decode_inputs, check_int, check_requests, check_tensor

__all__ = ["DecodeInputs", "check_cp", "check_decode_inputs", "check_int", "check_requests", "check_tensor"]
