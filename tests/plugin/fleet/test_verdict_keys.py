"""What a probe finding is about: the device profile (CPU model and cores, or the GPU) and the shapes."""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.ir.builder import GraphBuilder
from stitchfleet.plugin.fleet.rank_devices import usable_cores
from stitchfleet.plugin.fleet.verdict_keys import MAX_SHAPES, cpu_model, input_shapes, profile

CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)   Platinum 8480C\nflags\t: fpu\n"


def test_the_cpu_model_comes_from_cpuinfo_with_its_spaces_folded(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert cpu_model(tmp_path / "cpuinfo") == "Intel(R) Xeon(R) Platinum 8480C"
    assert cpu_model(tmp_path / "missing")  # elsewhere: what the platform says, never empty


def test_a_cpu_profile_names_the_model_and_the_usable_cores() -> None:
    found = profile("cpu")
    assert found.startswith("cpu:") and found.endswith(f" x{usable_cores()}") and len(found) <= 128
    assert profile("cuda", "H200").startswith("cuda:")  # no GPU here: the declared type (or "unknown gpu")


def _graph(*shapes: tuple[int, ...]) -> object:
    builder = GraphBuilder()
    values = [builder.parameter(f"p{k}", shape) for k, shape in enumerate(shapes)]
    total = values[0]
    for value in values[1:]:
        total = total + value
    builder.output("out", total)
    return builder.build()


def test_the_input_shapes_list_the_inputs_and_shorten_long_ones_with_a_hash() -> None:
    assert input_shapes(_graph((32, 128), (32, 128))) == "f32[32,128],f32[32,128]"
    assert input_shapes(_graph((64, 128), (64, 128))) != input_shapes(_graph((32, 128), (32, 128)))
    many = input_shapes(_graph(*[(8, 1024, 1024)] * 12))
    other = input_shapes(_graph(*[(8, 1024, 1024)] * 13))
    assert len(many) < MAX_SHAPES and many.startswith("f32[8,1024,1024],") and "..#" in many and many != other
