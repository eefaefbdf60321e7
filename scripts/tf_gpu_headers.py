"""Fetches the GPU-enabled `tensorflow` wheel's headers and framework library for CI's build of the GPU op.

Input: a target directory and the TF version (default: the one the op is pinned to, 2.15.1); pip and
PyPI. Output: TARGET/tensorflow/include (the wheel's headers) and TARGET/tensorflow/
libtensorflow_framework.so.2, extracted from the wheel (downloaded without dependencies, not installed:
the test venv keeps tensorflow-cpu), so `dispatch_op.build_against(TARGET)` compiles the op with
-DGOOGLE_CUDA=1 against the headers of the build that loads it. Idempotent: an extracted tree is kept.
Run: `python scripts/tf_gpu_headers.py DIR [--version X]`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FRAMEWORK = "tensorflow/libtensorflow_framework.so.2"


def fetch(target: Path, version: str) -> Path:
    """The extracted tree's `tensorflow` folder (downloading and extracting only when it is not there)."""
    done = target / FRAMEWORK
    if done.is_file() and (target / "tensorflow" / "VERSION").read_text().strip() == version:
        return target / "tensorflow"
    with tempfile.TemporaryDirectory(prefix="stitchfleet-tfwheel-") as tmp:
        pip = [sys.executable, "-m", "pip", "download", f"tensorflow=={version}", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, "-d", tmp], check=True, timeout=1800)
        (wheel,) = Path(tmp).glob("tensorflow-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("tensorflow/include/") or name == FRAMEWORK:
                    archive.extract(name, target)
    (target / "tensorflow" / "VERSION").write_text(version + "\n")
    return target / "tensorflow"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--version", default="2.15.1")
    args = parser.parse_args()
    print(fetch(args.target, args.version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
