"""The package's house rules, checked on the source: no import cycle inside ``ecofl/``, no module over 400 lines
and no class over 250, no branch on a schedule kind outside the modes, the network layer importing nothing of the
pipeline, one connect-and-join routine, and no line of the repository's Python over 120 characters."""

from __future__ import annotations

import ast
import re
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


MODES = "ecofl.pipeline.modes"  # the pipeline's modes: they drive the runtime and the cost model


def _deferred(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside a function or an ``if TYPE_CHECKING:`` block: they run at call time, or
    never."""
    inside = set()
    for node in ast.walk(tree):
        checking = isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or checking:
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    return inside


def _imports(modules: dict[str, Path], exempt_modes: bool = True) -> dict[str, set[str]]:
    """Each module's imports of other ecofl modules (``TYPE_CHECKING`` ones included), but for a mode's deferred
    ones: a mode (:mod:`ecofl.pipeline.modes`) is looked up by the planner, the cost model and the runtime, and
    reaches back into them only when they call it, as torch.distributed.pipelining's schedules drive its stages."""
    graph = {}
    for name, path in modules.items():
        found = set()
        tree = ast.parse(path.read_text())
        deferred = _deferred(tree) if exempt_modes and name.startswith(MODES) else set()
        for node in ast.walk(tree):
            if id(node) in deferred:
                continue
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


def test_the_modes_exemption_is_needed():
    """Without it the graph has a cycle (the modes and what drives them): the exemption hides no other import."""
    assert _cycles(_imports(_modules(), exempt_modes=False)), "the modes need no exemption any more: remove it"


SCHEDULE_KINDS = {"1f1b", "gpipe", "async-1f1b", "stream"}


def _compares_a_schedule_kind(tree: ast.Module) -> bool:
    """A comparison with a ``ScheduleKind`` member or a schedule kind's string form (``in`` a tuple of them too)."""
    def is_kind(node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.value.id == "ScheduleKind" and node.attr.isupper()
        if isinstance(node, ast.Constant):
            return node.value in SCHEDULE_KINDS
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_kind(element) for element in node.elts)
        return False

    return any(isinstance(node, ast.Compare) and any(map(is_kind, [node.left, *node.comparators]))
               for node in ast.walk(tree))


def test_at_most_two_modules_of_ecofl_compare_a_schedule_kind():
    """Everything but the modes' registry looks a mode up (:mod:`ecofl.pipeline.modes`), so a new mode is a
    module of its own and touches no branch elsewhere."""
    comparing = sorted(name for name, path in _modules().items()
                       if _compares_a_schedule_kind(ast.parse(path.read_text())))
    assert len(comparing) <= 2, comparing


def test_the_kind_finder_finds_comparisons():
    found = [_compares_a_schedule_kind(ast.parse(code)) for code in (
        "plan.schedule == ScheduleKind.STREAM", "x in (ScheduleKind.GPIPE, y)", "kind != 'async-1f1b'",
        "plan.schedule is ScheduleKind.ONE_F_ONE_B", "ScheduleKind.from_str(text)", "kind == 'training'")]
    assert found == [True, True, True, True, False, False]


MAX_CLASS = 250


def test_no_class_of_ecofl_is_over_250_lines():
    long = {f"{name}.{node.name}": node.end_lineno - node.lineno + 1
            for name, path in _modules().items() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS}
    assert long == {}


def test_no_module_of_ecofl_is_over_400_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_the_network_layer_imports_nothing_of_the_pipeline():
    graph = _imports(_modules())
    leaks = {name: sorted(d for d in deps if d.startswith("ecofl.pipeline"))
             for name, deps in graph.items() if name.startswith("ecofl.net")}
    assert {name: deps for name, deps in leaks.items() if deps} == {}


def _connects(tree: ast.Module) -> list[str]:
    """The calls in ``tree`` that open a connection or answer a home's challenge by hand."""
    return [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] in ("create_connection", "join_home")]


def test_every_connector_of_ecofl_dials_through_one_routine():
    """Connect-and-join, with its one retry policy, is ecofl/net/dial.py's alone (issue 41)."""
    found = {name: calls for name, path in _modules().items()
             if name != "ecofl.net.dial" and (calls := _connects(ast.parse(path.read_text())))}
    assert found == {}


def test_the_connect_finder_finds_a_hand_made_connection():
    assert _connects(ast.parse("s = socket.create_connection(a)\nc = join_home(s, k, 0)")) == [
        "socket.create_connection", "join_home"]
    assert _connects(ast.parse("c = dial(a, k, 0)")) == []


def _numpy_calls(tree: ast.Module) -> int:
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute) and node.func.attr == "numpy" and not node.args)


def test_every_host_copy_goes_through_one_helper():
    """A tensor leaves its device (a GPU's for a home with accelerators) only through ecofl/accelerator.py's
    host_copy / host_array: no ``.numpy()`` anywhere else in ecofl/, client/ or server/ (issue 42)."""
    found = {str(path.relative_to(ROOT)): count for folder in ("ecofl", "client", "server")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if path != PACKAGE / "accelerator.py" and (count := _numpy_calls(ast.parse(path.read_text())))}
    assert found == {}
    assert _numpy_calls(ast.parse("a = t.detach().cpu().numpy()\nb = np.asarray(x)")) == 1


def test_no_line_of_python_is_over_120_characters():
    """No line of any of the repository's Python files (git-tracked ``*.py``) is longer than 120 characters."""
    files = _python_files()
    assert files, "found no Python files to check"
    long = [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
            for path in files
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
            if len(line) > MAX_LINE]
    assert long == [], f"{len(long)} lines over {MAX_LINE} characters:\n" + "\n".join(long)


TESTS = ROOT / "tests"
SHARED_HELPERS = {"wait_for", "holds_for", "free_ports", "SECRET"}  # tests/helpers.py


def test_the_tests_define_each_shared_helper_once_and_import_no_test_module():
    """Polling, free ports and the test secret are tests/helpers.py's; no test module (nor a script one runs)
    imports another, so that each can be read, and run, on its own."""
    defined: dict[str, list[str]] = {}
    importing = []
    for path in sorted(TESTS.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = [node.name] if isinstance(node, ast.FunctionDef) else [
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in set(names) & SHARED_HELPERS:
                defined.setdefault(name, []).append(path.name)
        for node in ast.walk(tree):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else
                       re.findall(r"(?:from|import) (test_\w+)", node.value)
                       if isinstance(node, ast.Constant) and isinstance(node.value, str) else [])
            importing += [f"{path.name} imports {m}" for m in modules if m.startswith("test_")]
    assert defined == {name: ["helpers.py"] for name in SHARED_HELPERS}
    assert importing == []
