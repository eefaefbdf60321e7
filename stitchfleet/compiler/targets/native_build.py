"""Source text -> shared object bytes with a command-line compiler, in a private temp directory.

Input: the source text, its file name (the suffix picks the language), the files it includes
(name -> text, written beside it) and the compiler command for (source path, output path). Output:
the built shared object's bytes, or `BuildError` with the command line and the end of the
compiler's message. Used by the cpu backend (clusters as C) and by the plugin's native bridge op
(C++ against TF's headers); both cache the bytes themselves.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path


class BuildError(RuntimeError):
    """The compiler is missing, timed out or rejected the source (its message included)."""


def build_shared_object(
    text: str,
    file_name: str,
    command: Callable[[Path, Path], list[str]],
    timeout_s: float,
    beside: Mapping[str, str] | None = None,
) -> bytes:
    with tempfile.TemporaryDirectory(prefix="stitchfleet-build-") as tmp:
        source, output = Path(tmp) / file_name, Path(tmp) / "built.so"
        for name, included in (beside or {}).items():  # `#include "name"` finds them beside the source
            (Path(tmp) / name).write_text(included)
        source.write_text(text)
        argv = command(source, output)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError) as err:
            raise BuildError(f"{shlex.join(argv)}: {err}") from None
        if done.returncode != 0:
            raise BuildError(f"{shlex.join(argv)} failed:\n{done.stderr[-4000:]}")
        return output.read_bytes()
