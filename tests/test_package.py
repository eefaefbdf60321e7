"""The package frame: light imports, and import contracts that really bite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "tensorflow",
    "horovod",
    "pycuda",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "prometheus_client",
    "kopf",
    "kubernetes",
    "matplotlib",
)

# Runs in a fresh interpreter where every heavy library fails to import, as in a venv
# that holds only numpy.
_BLOCKED_IMPORT = textwrap.dedent(
    """
    import importlib.abc, sys
    HEAVY = {heavy!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"blocked for the test: {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import stitchfleet, stitchfleet.settings, stitchfleet.cli
    import stitchfleet.compiler, stitchfleet.plugin, stitchfleet.telemetry, stitchfleet.operator
    stitchfleet.settings.load({{}})
    stitchfleet.cli.build_parser().format_help()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    assert not loaded, loaded
    print("light import ok")
    """
)


def test_import_needs_only_numpy() -> None:
    code = _BLOCKED_IMPORT.format(heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "light import ok" in result.stdout


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(tree), "HOME": str(tree)}
    return subprocess.run(
        [exe, "--config", str(tree / "setup.cfg"), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tree,
        env=env,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "stitchfleet", tmp_path / "stitchfleet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    return tmp_path


def test_contracts_hold_on_the_tree(tree_copy: Path) -> None:
    result = _lint_imports(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("compiler/__init__.py", "import tensorflow", "The compiler imports nothing of ours but settings"),
        ("compiler/__init__.py", "import stitchfleet.telemetry", "The compiler imports nothing of ours but settings"),
        ("telemetry/__init__.py", "import stitchfleet.compiler", "Telemetry imports nothing of compiler"),
        ("operator/__init__.py", "import stitchfleet.plugin", "Plugin and operator never import each other"),
        ("telemetry/__init__.py", "import kopf", "kopf and kubernetes only in the operator"),
        ("plugin/__init__.py", "import sqlalchemy", "SQLAlchemy, Alembic, psycopg and prometheus_client only"),
        ("operator/__init__.py", "import pycuda", "pycuda only in compiler.targets.cuda.driver"),
    ],
)
def test_contract_breaks_on_forbidden_import(tree_copy: Path, module: str, line: str, contract: str) -> None:
    target = tree_copy / "stitchfleet" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    assert f"{contract}" in result.stdout
    assert "BROKEN" in result.stdout


@pytest.mark.tf
@pytest.mark.slow
def test_the_demo_runs_from_any_directory_without_the_repository(tmp_path: Path) -> None:
    """Only the package (as `stitchfleet shim install` copies it) on the path, cwd elsewhere: no benchmarks/."""
    from stitchfleet.boot import installer

    copy = tmp_path / "opt"
    installer.install(copy)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("STITCHFLEET_", "PYTHONPATH"))}
    env |= {"PYTHONPATH": str(copy), "TF_CPP_MIN_LOG_LEVEL": "3", "STITCHFLEET_STATE_DIR": str(tmp_path / "state")}
    command = [sys.executable, "-m", "stitchfleet.cli", "demo", "--steps", "12", "--every", "6", "--dir", str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# stitchfleet weekly savings report" in done.stdout
    assert not (copy / "benchmarks").exists()
