"""House rules a maintainer expects, checked with the suite: ruff's rule set (pyproject.toml [tool.ruff.lint]) on
all Python in the repository, and mypy on the harness package ([tool.mypy]: every function annotated)."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    proc = _run("ruff", "check", "--no-cache", "harness", "tests", "benchmarks", "scripts")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing_in_the_harness():
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def _imported_modules(path: Path, name: str, modules: set[str]) -> set[str]:
    """The harness modules a module imports when it is imported: its module-level imports, not those inside
    functions (which run when called) or under `if TYPE_CHECKING:` (which never run). Importing a.b.c initialises
    a and a.b first; for a module inside them that is Python's own order, not an import of its own."""
    is_package = path.name == "__init__.py"
    named = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: len(name.split(".")) - (not is_package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            # `from a import b`: the submodule a.b where there is one, else names defined in a itself
            named |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    parents = {".".join(m.split(".")[:i]) for m in named for i in range(1, len(m.split(".")))}
    return {m for m in named | {p for p in parents if not name.startswith(p + ".")} if m in modules and m != name}


def test_no_module_of_the_harness_imports_itself_back():
    """An import cycle works only in one import order and hides behind imports inside functions; none exists at
    module level."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "harness").rglob("*.py")}
    graph = {name: _imported_modules(path, name, set(paths)) for name, path in paths.items()}
    cycles = []

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        for dep in sorted(graph[node]):
            if dep in stack:
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in done:
                visit(dep, [*stack, dep], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name], done)
    assert not cycles, "\n".join(cycles)


def test_the_registry_and_the_config_load_without_torch_or_transformers():
    """The Snakefile imports both to build the job graph: that must not cost a torch import."""
    code = ("import sys; import harness.frameworks, harness.config, harness.results.layout; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
