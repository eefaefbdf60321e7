"""The compiler targets' C, C++ and CUDA live in real files shipped as package data, not in Python strings."""

from __future__ import annotations

import ast
import configparser
import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest

import stitchfleet.compiler.targets as targets_package

TARGETS = Path(targets_package.__file__).parent
SETUP_CFG = TARGETS.parents[2] / "setup.cfg"
NATIVE = (".c", ".h", ".cc", ".cu", ".cuh")


def _native_files() -> list[Path]:
    return sorted(p for p in TARGETS.rglob("*") if p.suffix in NATIVE)


def test_no_python_module_of_the_compiler_holds_c_source() -> None:
    offenders = []
    for module in sorted(TARGETS.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "#include <" in node.value:
                offenders.append(f"{module.relative_to(TARGETS.parent)}:{node.lineno}")
    # the CUDA prelude is the gpua branch's (issue 28 item 3) and leaves prelude.py there
    assert [o for o in offenders if not o.startswith("targets/cuda/prelude.py")] == []


def test_every_native_source_is_package_data() -> None:
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    root = TARGETS.parents[2]
    shipped: list[str] = []  # globs relative to the repository root, from every package's entry
    for package, value in parser["options.package_data"].items():
        base = Path(*package.split(".")).as_posix()
        shipped += [f"{base}/{pattern.strip()}" for pattern in value.split(",") if pattern.strip()]
    files = _native_files()
    assert len(files) >= 6
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f.relative_to(root).as_posix(), p) for p in shipped)]
    assert unshipped == []


def test_native_sources_are_clang_formatted() -> None:
    tool = shutil.which("clang-format")
    if tool is None:
        pytest.skip("no clang-format on PATH (make lint installs the pinned one)")
    files = [str(f) for f in _native_files() if f.parent.name == "csrc"]
    done = subprocess.run([tool, "--dry-run", "--Werror", *files], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
