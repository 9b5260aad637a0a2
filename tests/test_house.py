"""The package's house rules, checked on the source: no import cycle inside ``ecofl/``, no module over 400 lines,
the network layer importing nothing of the pipeline, and no line of the repository's Python over 120 characters."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ecofl"
ROOT = PACKAGE.parent
# Where the Python lives when there is no git to ask, and what under it is not source.
SOURCE_FOLDERS = ("ecofl", "simulations", "server", "client", "benchmarks", "tests", "scripts", "protocol")
NOT_SOURCE = {".venv", ".flwr", "multirun", "outputs", "__pycache__"}
MAX_LINE = 120


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _python_files() -> list[Path]:
    """The git-tracked ``*.py`` files; without git (or a checkout), those under the source folders."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        listed = ""
    files = [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]
    if files:
        return files
    return sorted(path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py")
                  if NOT_SOURCE.isdisjoint(path.relative_to(ROOT).parts))


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other ecofl modules (``TYPE_CHECKING`` ones included)."""
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    found.add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_inside_ecofl():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_ecofl_is_over_400_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_the_network_layer_imports_nothing_of_the_pipeline():
    graph = _imports(_modules())
    leaks = {name: sorted(d for d in deps if d.startswith("ecofl.pipeline"))
             for name, deps in graph.items() if name.startswith("ecofl.net")}
    assert {name: deps for name, deps in leaks.items() if deps} == {}


def test_no_line_of_python_is_over_120_characters():
    """No line of any of the repository's Python files (git-tracked ``*.py``) is longer than 120 characters."""
    files = _python_files()
    assert files, "found no Python files to check"
    long = [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
            for path in files
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
            if len(line) > MAX_LINE]
    assert long == [], f"{len(long)} lines over {MAX_LINE} characters:\n" + "\n".join(long)
