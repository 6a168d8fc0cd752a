"""Developer tools that need no GPU: the sm_90 compile of the scorer and its SASS mix."""

import os
import subprocess
import sys


def test_sass_tool_compiles_the_scorer_for_sm90():
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "fast.sass", "--hs", "4"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "REG:" in done.stdout and "HGMMA" in done.stdout and "PRMT" in done.stdout
