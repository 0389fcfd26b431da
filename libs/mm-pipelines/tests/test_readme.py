"""The README example runs as written and prints what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"
_PRINT = re.compile(r"^\s*print\(.*\)\s+# (?P<expected>.+)$")


def readme_example() -> str:
    return re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)


def test_every_print_of_the_readme_example_states_its_output():
    prints = [line for line in readme_example().splitlines() if line.lstrip().startswith("print(")]
    assert prints and all(_PRINT.match(line) for line in prints), prints


def test_readme_example_prints_what_its_comments_say(tmp_path):
    code = readme_example()
    expected = [m.group("expected") for m in map(_PRINT.match, code.splitlines()) if m]
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected
