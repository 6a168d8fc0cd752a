"""Developer tools that need no GPU: the sm_90 compile of the scorers and their SASS mix."""

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("kernel", ["wgmma", "prmt"])
def test_sass_tool_compiles_the_scorer_for_sm90(kernel, tmp_path):
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    dump = tmp_path / "scorer.sass"
    cmd = [sys.executable, "-m", "fast.sass", "--kernel", kernel, "--hs", "4", "--dump", str(dump)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "REG:" in done.stdout and "HGMMA" in done.stdout and "PRMT" in done.stdout
    stores = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?STS", dump.read_text(), flags=re.M))
    if kernel == "wgmma":
        # the point of the kernel: the dequantized tile stays in registers. Staging it would
        # take 16 STS.128 per thread and page (64 fp16 per 64-token block, two blocks); the
        # stores left are q's tile (once per program) and the cross-warp max (13 at Hs = 4)
        assert stores < 16, f"{stores} shared-memory stores: the fp16 tile goes through shared memory again"
    else:
        assert stores > 16  # tl.dot stages the tile: the difference the test above relies on
