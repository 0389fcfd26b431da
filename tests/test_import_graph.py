"""No package imports itself in a circle: each library's and app's module import graph is acyclic.

The graph is read from the source with ``ast``, every ``import`` statement counted wherever it is
(module level, inside a function, under ``TYPE_CHECKING``), so a cycle hidden in a function-level
import fails too. An import of ``pkg.a.b`` is an edge to that module only (its parent packages are
already loading); ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg`` itself.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in REPO.glob("*/*/src/*") if (p / "__init__.py").is_file())


def module_names(package: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` (packages as ``__init__``)."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            out |= {
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            }
    return out & known - {module}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    names = module_names(package)
    return {name: imported_modules(name, path, set(names)) for name, path in names.items()}


def test_every_library_and_app_is_found() -> None:
    found = {p.name for p in PACKAGES}
    assert {"mm_config", "mm_checkpoint", "mm_parallel", "mm_pipelines", "mm_data", "mm_trainer"} <= found
    assert {"wan22_train", "ltx2_train"} <= found


def test_a_function_level_import_is_an_edge(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import g\n")
    (package / "b.py").write_text("def g():\n    from .a import f\n    from . import a\n")
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_module_imports_have_no_cycle(package: Path) -> None:
    sorter = graphlib.TopologicalSorter(import_graph(package))
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"{package.name}: import cycle {' -> '.join(err.args[1])}")
