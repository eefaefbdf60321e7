"""Source -> shared object (`runtime/native_build.py`): built bytes, or an error naming the command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stitchfleet.compiler.targets.native_build import BuildError, build_shared_object


def cc(compiler: str) -> Callable[[Path, Path], list[str]]:
    return lambda src, out: [compiler, "-shared", "-fPIC", str(src), "-o", str(out)]


def test_a_source_builds_into_a_loadable_object(tmp_path: Path) -> None:
    import ctypes

    data = build_shared_object("int answer(void) { return 42; }\n", "a.c", cc("cc"), 60)
    (tmp_path / "a.so").write_bytes(data)
    assert ctypes.CDLL(str(tmp_path / "a.so")).answer() == 42


def test_a_rejected_source_names_the_command_and_the_compiler_message() -> None:
    with pytest.raises(BuildError, match=r"(?s)cc -shared .* failed:\n.*error"):
        build_shared_object("int broken(void) { return }\n", "b.c", cc("cc"), 60)


def test_a_missing_compiler_is_a_build_error() -> None:
    with pytest.raises(BuildError, match="no-such-cc"):
        build_shared_object("int x;\n", "c.c", cc("/nonexistent/no-such-cc"), 60)
