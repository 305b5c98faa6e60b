"""bench/ never depends on tests/: no bench module imports ``tests`` or puts it on sys.path.

An AST scan of every ``bench/**/*.py`` (the scripts and ``bench/support/``), so a bench
keeps running whatever the tests do; where both need a helper, it lives in
``bench/support/`` and the tests import it from there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _imports_tests(node: ast.AST) -> str | None:
    """The offending module name if ``node`` imports ``tests`` or a module under it."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
    else:
        return None
    for name in names:
        if name == "tests" or name.startswith("tests."):
            return name
    return None


def _path_to_tests(node: ast.AST) -> bool:
    """``sys.path.insert/append(... "tests" ...)``: the old way a bench reached a test helper."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("insert", "append")
        and ast.unparse(node.func.value) == "sys.path"
    ):
        return False
    return any(
        isinstance(const, ast.Constant) and isinstance(const.value, str) and "tests" in const.value
        for arg in node.args
        for const in ast.walk(arg)
    )


def bench_dependencies_on_tests(path: Path) -> list[str]:
    """Every line of ``path`` that imports tests/ or puts it on sys.path."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        name = _imports_tests(node)
        if name is not None:
            found.append(f"{path.name}:{node.lineno} imports {name}")  # type: ignore[attr-defined]
        elif _path_to_tests(node):
            found.append(f"{path.name}:{node.lineno} puts tests/ on sys.path")  # type: ignore[attr-defined]
    return found


def test_the_scan_sees_every_bench_script_and_helper() -> None:
    scanned = {p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*.py")}
    assert {"soak.py", "system_crash.py", "crash.py", "support/system_crash_loop.py"} <= scanned


@pytest.mark.parametrize(
    "path", sorted(BENCH.rglob("*.py")), ids=lambda p: p.relative_to(BENCH).as_posix()
)
def test_no_bench_module_imports_tests(path: Path) -> None:
    assert bench_dependencies_on_tests(path) == []


def test_the_scan_catches_each_way_of_reaching_tests(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text(
        "import sys\n"
        "import tests.support.servers\n"
        "from tests.test_system_crash import run_iteration\n"
        "from tests import support\n"
        'sys.path.insert(0, str(ROOT / "tests" / "support"))\n'
        "from crash_writer import run_iteration\n"
        "from .support import publisher\n"
        "import bench.support.metrics\n"
    )
    assert bench_dependencies_on_tests(script) == [
        "bad.py:2 imports tests.support.servers",
        "bad.py:3 imports tests.test_system_crash",
        "bad.py:4 imports tests",
        "bad.py:5 puts tests/ on sys.path",
    ]
