"""The accelerator profiles are the one table: the API's enum, product labels and device names agree."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from chunkpilot.api import Accelerator, crdgen
from chunkpilot.api.accelerators import AcceleratorProfile, gpu_products, matching_device, profiles


def test_the_api_accelerators_are_the_profiles_that_name_a_gpu_product() -> None:
    assert {a.value for a in Accelerator} == set(gpu_products())
    assert {p.name for p in profiles().values() if p.gpu_product is None} == {"generic-cpu"}


def test_the_crd_enum_of_the_accelerator_is_the_gpu_profiles() -> None:
    definition = next(d for d in crdgen.DEFINITIONS if d.kind == "InferenceService")
    schema = crdgen.build_crd(definition)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    accelerator = schema["properties"]["spec"]["properties"]["resources"]["properties"]["accelerator"]
    assert sorted(accelerator["enum"]) == sorted(gpu_products())


def test_each_file_is_one_profile_named_by_its_stem() -> None:
    root = resources.files("chunkpilot.api.accelerators")
    stems = sorted(e.name.removesuffix(".json") for e in root.iterdir() if e.name.endswith(".json"))
    assert stems == list(profiles())
    for name in stems:
        data = json.loads(root.joinpath(f"{name}.json").read_text(encoding="utf-8"))
        assert data["name"] == name
        assert dict(profiles()[name].document) == data


def test_product_labels_are_distinct_label_values() -> None:
    labels = list(gpu_products().values())
    assert len(labels) == len(set(labels))
    for label in labels:
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", label), label


@pytest.mark.parametrize("profile", list(profiles().values()), ids=lambda p: p.name)
def test_a_gpu_is_recognised_by_its_own_names_and_a_cpu_by_none(profile: AcceleratorProfile) -> None:
    if profile.gpu_product is None:
        assert profile.device_patterns == ()
        return
    assert profile.device_patterns
    memory = int(profile.memory_gib * 2**30)
    for device_name in (profile.description, profile.gpu_product.replace("-", " ")):
        found = matching_device(device_name, memory)
        assert found is not None and found.name == profile.name, device_name


@pytest.mark.parametrize(
    ("device_name", "memory_bytes", "expected"),
    [
        # a device reports a little less memory than its nominal size
        ("NVIDIA A100-SXM4-40GB", int(39.4 * 2**30), "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", int(39.4 * 2**30), "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", int(79.2 * 2**30), "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", int(79.2 * 2**30), "a100-80gb"),
        ("NVIDIA GH200 480GB", int(94.5 * 2**30), None),
        ("NVIDIA GeForce RTX 4090", int(23.6 * 2**30), None),
    ],
)
def test_the_a100s_are_told_apart_by_memory(
    device_name: str, memory_bytes: int, expected: str | None
) -> None:
    found = matching_device(device_name, memory_bytes)
    assert (found.name if found else None) == expected


def test_a_malformed_profile_names_its_file() -> None:
    with pytest.raises(ValueError, match=r"x\.json: .*memory_gib"):
        AcceleratorProfile.from_document({"name": "x"}, "x.json")
    with pytest.raises(ValueError, match=r"x\.json: device pattern"):
        AcceleratorProfile.from_document({"name": "x", "memory_gib": 1, "device_patterns": ["("]}, "x.json")
    with pytest.raises(ValueError, match=r"x\.json: gpu_product"):
        AcceleratorProfile.from_document({"name": "x", "memory_gib": 1, "gpu_product": ""}, "x.json")
