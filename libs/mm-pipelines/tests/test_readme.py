"""The README example runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_python_example_runs() -> None:
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
