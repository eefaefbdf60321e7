"""boot shim: installed by `stitchfleet shim install`, run by real interpreters at startup.

Each test starts a fresh Python with only the installed shim (and maybe other
directories) on PYTHONPATH, as the webhook sets it up in a pod.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stitchfleet import __version__, cli
from stitchfleet.boot import installer

pytestmark = pytest.mark.timeout(120)

PROBE = "import stitchfleet, sys; print('PACKAGE', stitchfleet.__file__); print('DONE')"


@pytest.fixture
def opt(tmp_path: Path) -> Path:
    target = tmp_path / "opt" / "stitchfleet"
    installer.install(target)
    return target


def user_sitecustomize(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(body)
    return directory


def plugin_boot(opt: Path, body: str) -> None:
    """Stands in for the plugin's boot module, which lands with the plugin."""
    (opt / "stitchfleet" / "plugin" / "session" / "auto_attach.py").write_text(body)


def python(tmp_path: Path, *path: Path, code: str = PROBE, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STITCHFLEET_", "PYTHON"))}
    clean |= {"PYTHONPATH": os.pathsep.join(map(str, path)), **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=60
    )


def test_install_lays_out_package_and_shim(opt: Path) -> None:
    assert (opt / "shim" / "sitecustomize.py").read_text() == (
        installer.package_dir() / "boot" / "sitecustomize.py"
    ).read_text()
    assert (opt / "stitchfleet" / "settings.py").is_file()
    assert (opt / "stitchfleet" / "operator" / "injection.py").is_file()
    again = installer.install(opt)
    assert again.shim_file == opt / "shim" / "sitecustomize.py"
    assert again.files > 10


def test_install_into_a_file_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        installer.install(target)


def test_cli_shim_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["shim", "install", str(tmp_path / "opt")]) == 0
    out = capsys.readouterr().out
    assert f"installed stitchfleet {__version__}" in out
    assert str(tmp_path / "opt" / "shim") in out
    (tmp_path / "file").write_text("x")
    assert cli.main(["shim", "install", str(tmp_path / "file")]) == 1
    assert "cannot install into" in capsys.readouterr().err


def test_shim_makes_the_injected_package_importable(tmp_path: Path, opt: Path) -> None:
    result = python(tmp_path, opt / "shim")
    assert result.returncode == 0, result.stderr
    assert f"PACKAGE {opt / 'stitchfleet' / '__init__.py'}" in result.stdout
    assert result.stderr == ""


def test_shim_chain_loads_the_sitecustomize_it_shadows(tmp_path: Path, opt: Path) -> None:
    user = user_sitecustomize(tmp_path / "image-site", "print('IMAGE SITECUSTOMIZE', __name__)\nIMAGE = 1\n")
    result = python(tmp_path, opt / "shim", user)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("IMAGE SITECUSTOMIZE sitecustomize") == 1
    assert result.stdout.index("IMAGE SITECUSTOMIZE") < result.stdout.index("DONE")
    assert result.stderr == ""


def test_a_failing_shadowed_sitecustomize_costs_one_warning_line(tmp_path: Path, opt: Path) -> None:
    user = user_sitecustomize(tmp_path / "image-site", "raise RuntimeError('image setup broke')\n")
    result = python(tmp_path, opt / "shim", user)
    assert result.returncode == 0
    assert "DONE" in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert "stitchfleet: boot shim: loading the shadowed sitecustomize failed" in lines[0]
    assert "RuntimeError: image setup broke" in lines[0]


def test_two_shim_copies_do_not_load_each_other_forever(tmp_path: Path, opt: Path) -> None:
    second = tmp_path / "second"
    installer.install(second)
    user = user_sitecustomize(tmp_path / "image-site", "print('IMAGE SITECUSTOMIZE')\n")
    result = python(tmp_path, opt / "shim", second / "shim", user)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("IMAGE SITECUSTOMIZE") == 1
    assert result.stderr == ""


def test_enabled_job_imports_the_plugin_boot(tmp_path: Path, opt: Path) -> None:
    plugin_boot(opt, "print('PLUGIN BOOTED')\n")
    on = python(tmp_path, opt / "shim", STITCHFLEET_ENABLED="1")
    assert on.stdout.splitlines()[0] == "PLUGIN BOOTED"
    off = python(tmp_path, opt / "shim", STITCHFLEET_ENABLED="0")
    unset = python(tmp_path, opt / "shim")
    assert "PLUGIN BOOTED" not in off.stdout + unset.stdout


def test_with_the_real_plugin_boot_module_the_shim_is_silent(tmp_path: Path, opt: Path) -> None:
    assert (opt / "stitchfleet" / "plugin" / "session" / "auto_attach.py").exists()
    result = python(tmp_path, opt / "shim", STITCHFLEET_ENABLED="1")
    assert result.returncode == 0
    assert "DONE" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("boot_body", "env", "words"),
    [
        ("raise ImportError('no libcudart')\n", {"STITCHFLEET_ENABLED": "1"}, "ImportError: no libcudart"),
        ("import sys\n", {"STITCHFLEET_ENABLED": "sure"}, "STITCHFLEET_ENABLED='sure': expected a boolean"),
    ],
)
def test_a_failing_boot_never_fails_the_user_process(
    tmp_path: Path, opt: Path, boot_body: str, env: dict[str, str], words: str
) -> None:
    plugin_boot(opt, boot_body)
    result = python(tmp_path, opt / "shim", code="print('USER CODE RAN')", **env)
    assert result.returncode == 0
    assert result.stdout == "USER CODE RAN\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("stitchfleet: boot shim: importing stitchfleet.plugin.session.auto_attach failed")
    assert words in lines[0]


def test_install_carries_the_prebuilt_ops_lying_beside_the_package(opt: Path, tmp_path: Path) -> None:
    """The shim image's package has the ops its builder stage made beside it; the init container's install
    copies them into the pod's volume with the package, where the pod's bridge_op looks for them."""
    (opt / installer.OPS_DIR).mkdir()
    (opt / installer.OPS_DIR / "tfop-abc.so").write_bytes(b"\x7fELF")
    pod = tmp_path / "pod"
    code = f"from pathlib import Path; from stitchfleet.boot import installer; installer.install(Path({str(pod)!r}))"
    done = python(tmp_path, opt, code=code)
    assert done.returncode == 0, done.stderr
    assert (pod / installer.OPS_DIR / "tfop-abc.so").read_bytes() == b"\x7fELF"
    assert (pod / "stitchfleet" / "settings.py").is_file()


def test_the_copy_brings_the_package_bytecode_a_job_then_loads(tmp_path: Path) -> None:
    """Regression: the copy left out the package's bytecode, so a job whose image sets PYTHONDONTWRITEBYTECODE
    (as ours do) compiled every stitchfleet module it imported, in every process."""
    image = tmp_path / "image"  # the shim image's package, compiled as its Containerfile compiles its venv
    installer.install(image)
    compiled = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(image / "stitchfleet")], capture_output=True, timeout=120
    )
    assert compiled.returncode == 0, compiled.stderr
    pod = tmp_path / "pod"
    code = f"from pathlib import Path; from stitchfleet.boot import installer; installer.install(Path({str(pod)!r}))"
    done = python(tmp_path, image, code=code, PYTHONDONTWRITEBYTECODE="1")
    assert done.returncode == 0, done.stderr
    copied = pod / "stitchfleet" / "settings.py"
    cached = Path(importlib.util.cache_from_source(str(copied)))
    assert cached.is_file()
    job = [sys.executable, "-v", "-c", "import stitchfleet.settings as s; print(s.__file__)"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STITCHFLEET_", "PYTHON"))}
    ran = subprocess.run(
        job,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean | {"PYTHONPATH": str(pod), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == str(copied)
    assert f"code object from '{cached}'" in ran.stderr
