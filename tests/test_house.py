"""House rules: a line budget per package, one-way layers in the compiler, one-way compile, typed plugin.

Input: the source files of the package (read, not imported). Output: a failure naming each package
over its line budget (a long file only warns: ideas are not split by line count), each upward import
between the compiler's layers, each plugin module that calls the planner itself, each `Any` in a plugin
subpackage's public signatures and each Python string holding C/C++/CUDA. Why: docs/architecture.md.
"""

from __future__ import annotations

import ast
import configparser
import sys
import warnings
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "stitchfleet"
COMPILER = "stitchfleet.compiler"
# Lines of Python per package (tinygrad's idea: the whole stays small, each file as long as its idea).
# Raising a budget is a decision made in review, with the reason in the commit.
PACKAGE_BUDGETS = {
    "compiler": 17000,
    "plugin": 15000,  # 14000 until issue 29: measured loss, group rerun, quiet path (s21); routine leases (s24);
    # the stop hook from the callers, the fallback by name, the guard's one-pass judging (s25); outputs no step
    # reads dropped, a constant for a reserve space CPU kernels ignore (s32: -1.2 ms of a 22 ms Transformer step);
    # the slowdown guard's confirmed verdicts, a measured figure said faster or slower in words (s33); the step time
    # a last run measured for a job told none (s34); setup figures by the graph's size, the fleet's verdict read
    # before the setup's import (s35); a node's group readings within their noise pooled in its setup record, so a
    # marginal job neither re-probes every run nor is turned away by one unlucky reading (s38); a quiet step known
    # by its fetched objects (s45: 9 us of the hook's ~35 us a quiet step); a cold run's op build among what the
    # cache spares, a baseline step that adds nothing to the user's run, a plain loop's quiet runs heard (s47); a
    # leased step's own work booked in full (s48: the report claimed ~0.02 ms a step of the hook's work as saved);
    # the setup's heap collected and frozen, its database client connected within it (s49: 0.18 s of a full
    # collection and ~0.3 s of the client's connection fell in the job's steps, unbooked); holdout runs (s53: one run
    # in every STITCHFLEET_HOLDOUT_EVERY runs as written and timed, plain TF's step for the report's held-out check; a
    # run's later sessions follow its first); the settle block (s54: calm steps of plain TF cap each window's
    # reference, which stood 5-16% above plain processes after stitched steps)
    "telemetry": 7100,  # 7000 until the scan's own held-out check (savings_scan: ~90 lines): the report's check,
    # recomputed from the raw rows apart from holdout.py, which the tests set it against (test_holdout_scan)
    "operator": 3500,
    "boot": 300,
    "demo": 900,
    "": 1200,  # the top-level modules: settings, cli, __init__
}
FILE_WARNING = 600  # a file past this many lines is worth a look (a warning, never a failure)
# plugin module (path under stitchfleet/) -> why it may still call the planner itself; keep it empty
PLANS_ITSELF: dict[str, str] = {}
PLANNER = "plan_cluster"
# plugin subpackage -> why its public signatures may still say `Any`; keep it empty. control/ and session/
# are being typed on the `stepcost` branch (issue 28 item 4); the skip goes when that branch is merged.
UNTYPED_PLUGIN: dict[str, str] = {}
# where no Python module may hold a C/C++/CUDA source (tests keep such strings only as the finders' samples)
NATIVE_FREE = ("stitchfleet", "scripts", "benchmarks")
# lowest first: a layer may import the ones below it, never one above
LAYERS = ("ir", "plan", "kernel", "lower", "targets", "pipeline", "compile_command")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_lines(paths: list[Path], base: Path = PACKAGE) -> dict[str, int]:
    """Lines per top-level package under `base` ("" for the modules directly in it)."""
    lines: dict[str, int] = {}
    for p in paths:
        parts = p.relative_to(base).parts
        key = parts[0] if len(parts) > 1 else ""
        lines[key] = lines.get(key, 0) + len(p.read_text().splitlines())
    return lines


def over_budget(lines: dict[str, int], budgets: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Each package over its budget (or with none): (its lines, its budget)."""
    return {name: (n, budgets.get(name, 0)) for name, n in lines.items() if n > budgets.get(name, 0)}


def long_files(paths: list[Path], base: Path = PACKAGE, limit: int = FILE_WARNING) -> dict[str, int]:
    """Each file (path under `base`) longer than `limit` lines."""
    counts = {str(p.relative_to(base)): len(p.read_text().splitlines()) for p in paths}
    return {name: n for name, n in counts.items() if n > limit}


def imported(source: str, module: str) -> set[str]:
    """Every module a source imports, lazy (in-function) imports included, relative ones resolved."""
    found: set[str] = set()
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level], *([base] if base else [])])
            # the names under the module: `from stitchfleet.compiler import pipeline` names the pipeline
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def names_the_planner(source: str) -> bool:
    """Whether a source imports, calls or otherwise names `plan_cluster` (any import form or attribute)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.alias) and node.name.split(".")[-1] in (PLANNER, "planner"):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "planner":
            return True
        if (isinstance(node, ast.Name) and node.id == PLANNER) or (
            isinstance(node, ast.Attribute) and node.attr == PLANNER
        ):
            return True
    return False


def planning_plugin_modules() -> set[str]:
    """Plugin modules (paths under stitchfleet/) that name the planner."""
    return {
        str(p.relative_to(PACKAGE))
        for p in sorted((PACKAGE / "plugin").rglob("*.py"))
        if names_the_planner(p.read_text())
    }


def _says_any(annotation: ast.expr | None) -> bool:
    """Whether an annotation names `Any` (`Any`, `typing.Any`, or inside a string annotation)."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if (isinstance(node, ast.Name) and node.id == "Any") or (
            isinstance(node, ast.Attribute) and node.attr == "Any"
        ):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _says_any(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _function_any(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> list[str]:
    a = function.args
    params = [
        *a.posonlyargs,
        *a.args,
        *a.kwonlyargs,
        *([a.vararg] if a.vararg else []),
        *([a.kwarg] if a.kwarg else []),
    ]
    found = [f"{owner}{function.name}({p.arg})" for p in params if _says_any(p.annotation)]
    return found + ([f"{owner}{function.name} -> return"] if _says_any(function.returns) else [])


def any_in_public_signatures(source: str) -> list[str]:
    """Each `Any` in a module's public signatures: its public functions' parameters and returns, its public
    classes' public (and dunder) methods and class-level annotated attributes, its annotated public names."""
    found: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _public(node.name):
            found += _function_any(node, "")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _public(node.target.id):
            found += [node.target.id] if _says_any(node.annotation) else []
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _public(item.name):
                    found += _function_any(item, f"{node.name}.")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _public(item.target.id):
                    found += [f"{node.name}.{item.target.id}"] if _says_any(item.annotation) else []
    return found


def untyped_plugin_signatures(skipped: Collection[str] = ()) -> dict[str, list[str]]:
    """Plugin module (path under stitchfleet/) -> the `Any` in its public signatures, skipping subpackages."""
    found = {}
    for path in sorted((PACKAGE / "plugin").rglob("*.py")):
        parts = path.relative_to(PACKAGE / "plugin").parts
        if len(parts) > 1 and parts[0] in skipped:
            continue
        if hits := any_in_public_signatures(path.read_text()):
            found[str(path.relative_to(PACKAGE))] = hits
    return found


def strings_with_includes(source: str) -> list[int]:
    """Lines of the string constants holding `#include`: a C, C++ or CUDA source kept in Python."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "#include" in node.value
    ]


def backend_names() -> set[str]:
    """The registered backends' names: the target folders (`targets/<name>/`, `-` for `_`)."""
    return {p.parent.name.replace("_", "-") for p in (PACKAGE / "compiler" / "targets").glob("*/__init__.py")}


def _says_backend(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "backend" in name.lower()


def _backend_literals(node: ast.expr, backends: Collection[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in backends
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_backend_literals(item, backends) for item in node.elts)
    return False


def backend_branches(source: str, backends: Collection[str]) -> list[int]:
    """Lines where code decides by a backend's name (what a target's `Profile` should say instead): a comparison
    of something named like a backend with a backend name literal, or a backend parameter defaulting to one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_says_backend(o) for o in operands) and any(_backend_literals(o, backends) for o in operands):
                found.append(node.lineno)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args]
            defaults = list(zip(arguments[len(arguments) - len(node.args.defaults) :], node.args.defaults, strict=True))
            defaults += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d]
            found += [d.lineno for a, d in defaults if "backend" in a.arg and _backend_literals(d, backends)]
    return sorted(found)


def layer(module: str) -> int | None:
    """The layer index of a compiler module (None: a module outside the layers, free to import)."""
    if not module.startswith(COMPILER + "."):
        return None
    top = module.split(".")[2]
    return LAYERS.index(top) if top in LAYERS else None


def upward_imports(sources: dict[str, str]) -> list[str]:
    """'importer -> imported' for each import of a higher compiler layer than the importer's."""
    found = []
    for module, source in sorted(sources.items()):
        mine = layer(module)
        if mine is None:
            continue
        for target in sorted(imported(source, module)):
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                found.append(f"{module} ({LAYERS[mine]}) -> {target} ({LAYERS[theirs]})")
    return found


def test_every_package_is_within_its_line_budget() -> None:
    over = over_budget(package_lines(_modules()), PACKAGE_BUDGETS)
    assert not over, f"packages over their line budget (lines, budget): {over}"


def test_long_files_only_warn() -> None:
    for name, n in sorted(long_files(_modules()).items()):
        warnings.warn(f"{name}: {n} lines (over {FILE_WARNING}): is it still one idea?", stacklevel=1)


def test_no_compiler_layer_imports_a_higher_one() -> None:
    sources = {_module_name(p): p.read_text() for p in (PACKAGE / "compiler").rglob("*.py")}
    assert {layer(f"{COMPILER}.{name}") for name in LAYERS} == set(range(len(LAYERS)))
    assert not upward_imports(sources), "upward imports in the compiler:\n" + "\n".join(upward_imports(sources))


def test_the_plugin_never_plans_a_cluster_itself() -> None:
    found = planning_plugin_modules() - set(PLANS_ITSELF)
    assert not found, f"plugin modules calling the planner (use pipeline.compile_cluster): {sorted(found)}"


def test_every_listed_planner_exception_still_plans() -> None:
    # an exception that no longer needs its pass must leave the list
    stale = sorted(set(PLANS_ITSELF) - planning_plugin_modules())
    assert not stale, f"modules listed in PLANS_ITSELF that no longer name the planner: {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from stitchfleet.compiler.plan import PlanOptions, plan_cluster", True),
        ("from stitchfleet.compiler.plan.planner import PlanOptions", True),
        ("from stitchfleet.compiler import plan\nplan.plan_cluster(g, 0)", True),
        ("def f():\n    from stitchfleet.compiler.plan import plan_cluster as p", True),
        ("from stitchfleet.compiler.plan import PlanOptions, StitchPlan", False),
        ("from stitchfleet.compiler.pipeline import compile_cluster", False),
    ],
)
def test_planner_use_is_found(source: str, expected: bool) -> None:
    assert names_the_planner(source) is expected


def test_no_any_in_the_plugins_public_signatures() -> None:
    found = untyped_plugin_signatures(skipped=UNTYPED_PLUGIN)
    count = sum(len(hits) for hits in found.values())
    assert count == 0, f"{count} `Any` in public plugin signatures (use TF types, a Protocol, object): {found}"


def test_every_untyped_plugin_subpackage_exists() -> None:
    # an entry for a subpackage that is gone (renamed, merged) must leave the list
    assert all((PACKAGE / "plugin" / name / "__init__.py").is_file() for name in UNTYPED_PLUGIN)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(x: Any) -> int: ...", ["f(x)"]),
        ("def f(*args: Any, **kw: Any) -> None: ...", ["f(args)", "f(kw)"]),
        ("def f() -> typing.Any: ...", ["f -> return"]),
        ("def f() -> 'dict[str, Any]': ...", ["f -> return"]),
        ("class C:\n    x: list[Any]\n    def m(self, y: Any) -> None: ...", ["C.x", "C.m(y)"]),
        ("class C:\n    def __init__(self, g: Any) -> None: ...", ["C.__init__(g)"]),
        ("X: Any = None", ["X"]),
        ("def _f(x: Any) -> Any: ...\nclass _C:\n    x: Any", []),
        ("class C:\n    def _m(self, x: Any) -> None: ...", []),
        ("def f(x: tf.Tensor, y: object) -> Many: ...", []),
    ],
)
def test_any_in_public_signatures_is_found(source: str, expected: list[str]) -> None:
    assert any_in_public_signatures(source) == expected


def test_an_untyped_plugin_module_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plugin" / "graph").mkdir(parents=True)
    (tmp_path / "plugin" / "control").mkdir()
    (tmp_path / "plugin" / "graph" / "walk.py").write_text("def walk(op: Any) -> None: ...\n")
    (tmp_path / "plugin" / "control" / "c.py").write_text("def decide(x: Any) -> None: ...\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert untyped_plugin_signatures(skipped={"control"}) == {"plugin/graph/walk.py": ["walk(op)"]}


@pytest.mark.parametrize("tree", NATIVE_FREE)
def test_no_python_module_holds_a_native_source(tree: str) -> None:
    held = {}
    for path in sorted((ROOT / tree).rglob("*.py")):
        if lines := strings_with_includes(path.read_text()):
            held[str(path.relative_to(ROOT))] = lines
    assert not held, f"C/C++/CUDA in Python strings (move it to a source file shipped as package data): {held}"


def test_a_native_source_in_a_string_is_found() -> None:
    assert strings_with_includes('SOURCE = r"""\n#include <cuda.h>\nint x;\n"""\n') == [1]
    assert strings_with_includes("# a comment naming #include is no source\nx = 1\n") == []


def test_the_plugin_is_forbidden_every_target_s_code() -> None:
    # the plugin reaches a backend through the targets registry only: a new target's package joins the contract
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    contract = config["importlinter:contract:plugin-through-registry"]
    targets = PACKAGE / "compiler" / "targets"
    packages = {f"stitchfleet.compiler.targets.{p.parent.name}" for p in targets.glob("*/__init__.py")}
    assert contract["source_modules"].split() == ["stitchfleet.plugin"]
    assert packages and set(contract["forbidden_modules"].split()) == packages


def test_the_plugin_never_branches_on_a_backend_name() -> None:
    backends = backend_names()
    assert {"cpu", "cuda", "sim"} <= backends
    found = {}
    for path in sorted((PACKAGE / "plugin").rglob("*.py")):
        if lines := backend_branches(path.read_text(), backends):
            found[str(path.relative_to(PACKAGE))] = lines
    assert not found, f"plugin code deciding by a backend's name (say it in the target's Profile): {found}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('if backend == "cpu":\n    pass', [1]),
        ('ok = where.backend == "cpu" and onednn()', [1]),
        ('workers = 4 if all(b.backend == "cpu" for b in builds) else 1', [1]),
        ('setting = s.backend if s.backend in ("auto", "cpu") else b', [1]),
        ('def short(self, backend: str = "cpu") -> None: ...', [1]),
        ('def check(cache: str, *, backend: str = "cuda") -> None: ...', [1]),
        ('if _runs_on(setting) == "cpu":\n    pass', []),  # a device kind, not a backend's name
        ('if backend == automatic("cpu"):\n    pass', []),
        ("def short(self, backend: str) -> None: ...", []),
    ],
)
def test_a_backend_branch_is_found(source: str, expected: list[int]) -> None:
    assert backend_branches(source, {"cpu", "cuda", "sim", "cuda-cpu"}) == expected


def test_import_linter_contract_lists_the_same_layers() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    contract = config["importlinter:contract:compiler-layers"]
    assert contract["containers"].split() == [COMPILER]
    assert tuple(reversed(contract["layers"].split())) == LAYERS


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("stitchfleet.compiler.lower.program", "from stitchfleet.compiler.targets.sim import target", 1),
        ("stitchfleet.compiler.lower.program", "def f():\n    from stitchfleet.compiler import pipeline", 1),
        ("stitchfleet.compiler.lower.program", "from ..targets import cache", 1),
        ("stitchfleet.compiler.ir.graph", "import stitchfleet.compiler.plan.model", 1),
        ("stitchfleet.compiler.targets.cpu.source", "from stitchfleet.compiler.lower import Phase", 0),
        ("stitchfleet.compiler.plan.mapping", "from stitchfleet.compiler.devices import WARP", 0),
    ],
)
def test_upward_imports_are_found(module: str, source: str, expected: int) -> None:
    assert len(upward_imports({module: source})) == expected


def test_a_package_over_budget_is_found(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "a.py").write_text("x = 1\n" * 6)
    (tmp_path / "big" / "b.py").write_text("x = 1\n" * 5)
    (tmp_path / "top.py").write_text("x = 1\n" * 3)
    lines = package_lines(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert lines == {"big": 11, "": 3}
    assert over_budget(lines, {"big": 10, "": 3}) == {"big": (11, 10)}
    assert over_budget(lines, {"big": 11}) == {"": (3, 0)}  # a package without a budget is over it


def test_a_long_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (FILE_WARNING + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * FILE_WARNING)
    assert long_files(sorted(tmp_path.glob("*.py")), tmp_path) == {"long.py": FILE_WARNING + 1}
