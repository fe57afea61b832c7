"""House rules a maintainer expects, checked with the suite: ruff's rule set (pyproject.toml [tool.ruff.lint]) on
all Python in the repository, and mypy on the harness package ([tool.mypy]: every function annotated)."""

import ast
import re
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
            "harness.config.schema()  # every adapter imported, as the Snakefile's validation does\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant of a module but its docstrings: what code can compare or look up."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_a_framework_is_named_only_in_its_own_folder():
    """Code that keys on a framework's name (a string that is the name: a comparison, a config key, a dict of names)
    lives in harness/frameworks/<name>/; everywhere else asks the registry, so that adding a framework is adding its
    folder. Prose may name frameworks (messages, examples, comments), and so may profiles and docs. The reference
    backend's name is also the field's word for the reference policy and answers, so it is not checked."""
    from harness.frameworks import get_adapter, known_frameworks

    names = {n for n in known_frameworks() if get_adapter(n).plan is not None}
    assert {"verl", "openrlhf", "dschat"} <= names  # the check sees the planned frameworks
    found = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        parts = path.relative_to(REPO / "harness").parts
        own = parts[1] if parts[0] == "frameworks" and len(parts) > 2 else None
        found += [f"{path.relative_to(REPO)}:{line}: {value!r}" for line, value in _string_constants(path)
                  if value in names and value != own]
    quoted = re.compile(rf"""["']({'|'.join(sorted(names))})["']""")
    for path in [REPO / "Snakefile", *sorted((REPO / "workflows" / "rules").glob("*.smk"))]:
        for line, text in enumerate(path.read_text().splitlines(), 1):
            code = text.split("#", 1)[0]
            found += [f"{path.relative_to(REPO)}:{line}: {m.group(0)}" for m in quoted.finditer(code)]
    assert not found, "framework names outside their folders:\n" + "\n".join(found)


# The stages of harness/, each importing only those before it (docs/design.md, "Layout"). A framework's adapter plans
# and launches with the runtime's environments and launch skeleton; the config's schema merges the adapters' blocks.
STAGES = ("reading", "io", "remax", "conformance", "reward", "inputs", "results", "runtime", "frameworks", "config",
          "runs", "regression", "comparison", "report", "cli")


def test_no_stage_imports_a_later_one():
    """Every import between stages goes down STAGES: module level or inside a function alike (a deferred import is
    still an arrow), `if TYPE_CHECKING:` aside (it never runs)."""
    found = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        parts = path.relative_to(REPO / "harness").with_suffix("").parts
        here = parts[0]
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] if node.module and not node.level else [])
            for name in names:
                there = name.split(".")[1] if name.startswith("harness.") else None
                if here in STAGES and there in STAGES and STAGES.index(there) > STAGES.index(here):
                    found.append(f"harness/{'/'.join(parts)}.py:{node.lineno}: {here} imports {name} ({there})")
    assert not found, "imports up the stages:\n" + "\n".join(found)


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 80  # issue #34: a module a reader holds in mind, a function one screen


def test_no_module_or_function_of_the_harness_grows_past_its_size():
    """Every module of harness/ and benchmarks/ within MAX_MODULE_LINES lines and every function (a method, a nested
    one) within MAX_FUNCTION_LINES, docstring and comments included: a longer one is split by what its parts do."""
    found = []
    for path in sorted([*(REPO / "harness").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]):
        if "build" in path.relative_to(REPO).parts:  # what pip leaves beside a local project it built, not ours
            continue
        text = path.read_text()
        where = path.relative_to(REPO)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{where}: {len(text.splitlines())} lines")
        found += [f"{where}:{node.lineno}: {node.name} is {node.end_lineno - node.lineno + 1} lines"
                  for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not found, "over the size limits:\n" + "\n".join(found)


# Issue #49: one owner of a run's sequence. Planning, an embedded run and a launch are called here and nowhere else in
# harness/ or benchmarks/ (the CLI, ab, bisect, reproduce and the benchmarks reach them through it).
RUN_OWNER = "harness/runs/train.py"


def test_a_run_is_trained_in_one_place():
    """An adapter's `plan` or `run`, and harness.frameworks.launch's `launch`, are called only by RUN_OWNER; the rest
    calls its stage functions (the pipeline's rules through the CLI) or `train`."""
    found = []
    for path in sorted([*(REPO / "harness").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]):
        where = str(path.relative_to(REPO))
        if where == RUN_OWNER:
            continue
        tree = ast.parse(path.read_text())
        raw = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "harness.frameworks.launch" for a in node.names if a.name == "launch"}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Name) and f.id in raw) or (
                    isinstance(f, ast.Attribute) and f.attr in ("plan", "run") and "adapter" in ast.unparse(f.value)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(f)}(...)")
    assert not found, f"a run's stages called outside {RUN_OWNER}:\n" + "\n".join(found)


# Issue #49: code that runs in a framework's own environment, not the harness's, lives in harness/frameworks/<name>/
# inside/ (named by path: a script, a file the framework loads, a project an environment installs). It imports the
# standard library, the framework and the other packages of that environment, its own inside/ modules, and of the
# harness only the modules made for that use, each with the third-party packages it (with what it imports of the
# harness) may bring into the framework's environment:
INSIDE_MAY_IMPORT = {
    "harness.reward": set(),  # the shared rule reward and the reward server's client: the standard library only
    "harness.conformance": {"torch"},  # the shared advantage vectors (harness.remax): torch, which every framework has
    # the parity batch and update files, the applied-gradient hook: harness.io's yaml (torch only inside functions),
    # which every framework's environment has (Transformers needs it)
    "harness.parity": {"yaml"},
}
INSIDE = re.compile(r"harness\.frameworks\.[^.]+\.inside")


def _harness_modules() -> dict[str, Path]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (REPO / "harness").rglob("*.py") if "build" not in p.relative_to(REPO).parts}


def _imports(path: Path, name: str, modules: set[str]) -> list[tuple[int, str, bool]]:
    """(line, module, whether it runs when the module is imported) of every import: a module of `modules` where the
    name is one (`from harness import reward` is harness.reward), else the name as written; relative ones resolved.
    Not at import: inside a function, or under `if TYPE_CHECKING:`."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            at_import = False
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, at_import) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            found.extend((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, at_import)
                         for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, at_import)

    visit(ast.parse(path.read_text()), True)
    return found


def test_code_inside_a_framework_imports_only_its_environment_and_the_harness_never_imports_it():
    """A module under harness/frameworks/*/inside/ imports, of the harness, only INSIDE_MAY_IMPORT and its own
    framework's inside/ (anywhere in it: a deferred import runs there too), and those modules bring no more than they
    say; no other module of the harness imports an inside/ folder at module level (the harness's Python does not run
    a framework's code: it names those files by path)."""
    modules = _harness_modules()
    found = []
    for name, path in sorted(modules.items()):
        own = INSIDE.match(name)
        for line, imported, at_import in _imports(path, name, set(modules)):
            where = f"{path.relative_to(REPO)}:{line}: {imported}"
            is_harness = imported == "harness" or imported.startswith("harness.")
            if own and is_harness and imported not in INSIDE_MAY_IMPORT and not (
                    imported == own.group(0) or imported.startswith(own.group(0) + ".")):
                found.append(f"{where} (inside/ may import of the harness only {', '.join(INSIDE_MAY_IMPORT)})")
            elif not own and at_import and INSIDE.match(imported):
                found.append(f"{where} (the harness imports code that runs inside a framework)")
    assert found == [], "\n".join(found)
    for allowed, brings in INSIDE_MAY_IMPORT.items():
        seen, todo, third_party = set(), [allowed], set()
        while todo:  # what importing it runs: its module-level imports, the harness's followed
            name = todo.pop()
            seen.add(name)
            for _, imported, at_import in _imports(modules[name], name, set(modules)):
                parents = [".".join(imported.split(".")[:i]) for i in range(1, imported.count(".") + 2)]
                todo += [p for p in parents if at_import and p in modules and p not in seen]
                top = imported.split(".")[0]
                if at_import and top != "harness" and top not in sys.stdlib_module_names:
                    third_party.add(top)
        assert third_party <= brings, f"{allowed} brings {sorted(third_party - brings)} into a framework's environment"


def test_every_how_long_figure_shown_to_users_comes_from_one_dated_source():
    """Issue #53: harness/durations.py holds each profile's measured, dated duration; the README says it as it stands
    there, and no other module of the harness writes a duration of its own into what users read."""
    from harness.durations import DURATIONS, how_long

    readme = " ".join((REPO / "README.md").read_text().split())
    for profile, (figure, measured, _) in DURATIONS.items():
        assert f"{figure}, measured {measured}" == how_long(profile)
        assert f"{figure}, measured {measured}" in readme, f"the README does not say {profile}'s {how_long(profile)}"
    figure = re.compile(r"\b\d+(-\d+)? ?min(utes)? on \d+ cores")
    found = [f"{p.relative_to(REPO)}" for p in (REPO / "harness").rglob("*.py")
             if p.name != "durations.py" and figure.search(p.read_text())]
    assert found == [], f"a duration written outside harness/durations.py: {found}"
