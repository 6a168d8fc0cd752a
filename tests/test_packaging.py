"""The wheel a user installs: every package of the runtime, the reference and the fuzzers,
and nothing of the performance lab or the tests."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = ("fast", "reference", "fuzz")  # the top-level packages the wheel carries


def _package_dirs() -> set[str]:
    """Every directory under the installed packages that holds Python source, dotted."""
    found = set()
    for top in INSTALLED:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add(".".join(path.parent.relative_to(ROOT).parts))
    return found


def test_the_wheel_holds_every_package_and_nothing_of_the_lab(tmp_path):
    """Built as a user builds it (``pip wheel .``, offline: the build backend installed with
    the test extra): each package directory of the tree is in it with its ``__init__.py``
    (a hand-kept list once left ``reference.msa`` out, and ``python -m reference`` failed
    from an install), and ``bench/``, ``tests/`` and the docs are not. Built from a copy of
    the tree: an in-tree build reuses ``build/lib``, where a package since dropped lingers."""
    src = tmp_path / "src"
    junk = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "results", ".hypothesis")
    shutil.copytree(ROOT, src, ignore=junk)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=src,
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {".".join(Path(n).parent.parts) for n in names if n.endswith("/__init__.py")}
    missing = _package_dirs() - packages
    assert not missing, f"package directories left out of the wheel: {sorted(missing)}"
    assert "indexer_constants.py" in names
    lab = [n for n in names if n.split("/")[0] in ("bench", "tests", "docs", "conftest.py")]
    assert not lab, lab
