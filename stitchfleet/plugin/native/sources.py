"""The op library's C++ sources: package data files in `csrc/`, read once per process.

Input: the files shipped with the package (setup.cfg package_data). Output: `FILES` (file name ->
text), `MAIN` (the one translation unit compiled; it includes the others) and `SOURCE`, every file's
name and text in one string: what the op's cache key and prebuilt name hash, so any edit rebuilds it.
"""

from __future__ import annotations

from importlib.resources import files

MAIN = "dispatch.cc"
FILES: dict[str, str] = {
    entry.name: entry.read_text(encoding="utf-8")
    for entry in sorted(files("stitchfleet.plugin.native").joinpath("csrc").iterdir(), key=lambda e: e.name)
    if entry.name.endswith((".cc", ".h"))
}
SOURCE = "".join(f"// file {name}\n{text}" for name, text in FILES.items())
