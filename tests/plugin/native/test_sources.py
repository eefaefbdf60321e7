"""The native sources are real files shipped as package data: every one is listed in setup.cfg's
package_data, read into the text the op's cache key hashes, and no Python module of the plugin or of
the CUDA target holds C/C++/CUDA in a string (`#include` inside a string constant)."""

from __future__ import annotations

import ast
import configparser
import fnmatch
from pathlib import Path

import pytest

from stitchfleet.compiler.targets.cuda.prelude import PRELUDE
from stitchfleet.plugin.native import sources

ROOT = Path(__file__).resolve().parents[3]
NATIVE_SUFFIXES = (".c", ".cc", ".h", ".cu", ".cuh")
# the trees whose native code lives in files (others move theirs in their own commits)
CHECKED = ("stitchfleet/plugin", "stitchfleet/compiler/targets/cuda/prelude.py")


def _package_data() -> dict[str, list[str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    section = parser["options.package_data"]
    return {package: [p.strip() for p in value.split(",") if p.strip()] for package, value in section.items()}


def test_every_native_file_is_package_data() -> None:
    data = _package_data()
    found = [p for p in (ROOT / "stitchfleet").rglob("*") if p.suffix in NATIVE_SUFFIXES]
    assert found, "no native source files under stitchfleet/"
    missing = []
    for path in found:
        relative = path.relative_to(ROOT)
        shipped = False
        for package, patterns in data.items():
            folder = Path(*package.split("."))
            if folder in relative.parents:
                inside = str(relative.relative_to(folder))
                shipped = shipped or any(fnmatch.fnmatch(inside, pattern) for pattern in patterns)
        if not shipped:
            missing.append(str(relative))
    assert not missing, f"native sources not in setup.cfg [options.package_data]: {missing}"


def test_the_op_source_is_every_file_it_compiles() -> None:
    assert sources.MAIN in sources.FILES
    for name, text in sources.FILES.items():
        assert f"// file {name}\n{text}" in sources.SOURCE  # an edit to any file changes the cache key
    headers = {n for n in sources.FILES if n.endswith(".h")}
    included = {n for n in headers if f'#include "{n}"' in sources.FILES[sources.MAIN]}
    assert included == headers  # dispatch.cc includes them all: none is shipped but left out of the build


def test_the_prelude_is_read_from_its_file() -> None:
    assert (ROOT / "stitchfleet/compiler/targets/cuda/prelude.cuh").read_text() == PRELUDE
    assert "sf_grid_sync" in PRELUDE


def _strings_with_includes(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "#include" in node.value
    ]


@pytest.mark.parametrize("tree", CHECKED)
def test_no_python_module_holds_native_source(tree: str) -> None:
    root = ROOT / tree
    modules = [root] if root.is_file() else sorted(root.rglob("*.py"))
    held = {str(m.relative_to(ROOT)): lines for m in modules if (lines := _strings_with_includes(m))}
    assert not held, f"C/C++/CUDA in Python strings (move it to a file shipped as package data): {held}"


def test_the_finder_sees_native_source_in_a_string(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('SOURCE = r"""\n#include <cuda.h>\nint x;\n"""\n')
    assert _strings_with_includes(module) == [1]
