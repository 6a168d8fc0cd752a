"""Run every ```python block of a Markdown file, in order, each in a fresh interpreter, from
the current directory (CI runs them from outside the source tree, against the installed
wheel): the README's examples cannot drift from the code. Usage: python readme_snippets.py
README.md. Exit status: 0 if every block ran, else 1 (the failing block and its error shown)."""

import re
import subprocess
import sys
from pathlib import Path


def blocks(text: str) -> list[str]:
    """The ```python fenced blocks of ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def main(path: str) -> int:
    """Run each block; returns the exit status."""
    found = blocks(Path(path).read_text())
    if not found:
        print(f"{path}: no ```python block", file=sys.stderr)
        return 1
    for i, code in enumerate(found, 1):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode != 0:
            shown = f"{code}\n{done.stdout}{done.stderr}"
            print(f"{path}: python block {i} of {len(found)} failed:\n{shown}", file=sys.stderr)
            return 1
        print(f"{path}: python block {i} of {len(found)} ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
