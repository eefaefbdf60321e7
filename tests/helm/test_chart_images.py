"""The chart and the images of images/*.Containerfile agree: repositories, tags, appVersion, command.

Input: the default chart render, Chart.yaml, the Containerfiles and the webhook's init container
defaults. Output: assertions only.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from stitchfleet import __version__
from stitchfleet.operator.injection import SHIM_COMMAND, SHIM_MOUNT
from tests.helm.chart_render import CHART_DIR, Rendered

IMAGES = Path(__file__).resolve().parents[2] / "images"
BUILD_SCRIPT = IMAGES.parent / "scripts" / "build_images.sh"


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


def test_default_operator_image_is_the_one_the_build_tags(default_render: Rendered) -> None:
    deployment = default_render.one("Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/stitchfleet/stitchfleet:{__version__}"
    assert "image=ghcr.io/stitchfleet/stitchfleet\n" in BUILD_SCRIPT.read_text()
    assert "image=ghcr.io/stitchfleet/stitchfleet-shim\n" in BUILD_SCRIPT.read_text()


def test_shim_image_runs_the_init_container_command() -> None:
    # The init container overrides the entrypoint with SHIM_COMMAND: its program must be the
    # entrypoint of both images, and the shim image's default command must install into the mount.
    assert SHIM_COMMAND[0] == "stitchfleet"
    for name in ("operator", "shim"):
        assert 'ENTRYPOINT ["stitchfleet"]' in (IMAGES / f"{name}.Containerfile").read_text()
    shim = (IMAGES / "shim.Containerfile").read_text()
    assert f'CMD ["shim", "install", "{SHIM_MOUNT}"]' in shim
    # The venv must not live under the mount: the init container's volume would hide it.
    for name in ("operator", "shim"):
        assert f"venv {SHIM_MOUNT} " not in (IMAGES / f"{name}.Containerfile").read_text()


def test_the_shim_image_prebuilds_the_op_for_the_supported_tensorflow() -> None:
    """The image's `ops` stage builds the native op for the TF version the package supports (setup.cfg's `tf`
    extra), so pods on that version load it without a C++ compiler."""
    shim = (IMAGES / "shim.Containerfile").read_text()
    extras = (IMAGES.parent / "setup.cfg").read_text()
    pinned = extras.split("tensorflow-cpu==", 1)[1].split()[0]
    assert f"ARG TF_VERSION={pinned}\n" in shim
    assert "AS ops" in shim and "shim install /opt/ops-shim --with-op" in shim
    assert "COPY --from=ops /opt/ops-shim/ops" in shim
