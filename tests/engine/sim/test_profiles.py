"""Profile lookup: names and aliases match whatever their case and separators."""

from __future__ import annotations

import pytest
from chunkpilot.engine.sim.profiles.loader import (
    ProfileError,
    _accelerators,
    _models,
    load_accelerator,
    load_model,
    normalise,
)


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.1-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        " Meta-Llama/LLAMA-3.1-8B ",
        "meta_llama/llama_3.1_8b",
    ],
)
def test_model_names_match_by_normalised_key(name: str) -> None:
    assert load_model(name).name == "llama-3.1-8b"


def test_accelerator_aliases_match_by_normalised_key() -> None:
    assert load_accelerator("H100 SXM").name == "h100"
    assert load_accelerator("nvidia_h100_80gb_hbm3").name == "h100"


def test_every_name_and_alias_is_one_profile() -> None:
    for table in (_models(), _accelerators()):
        keys = [normalise(k) for name, data in table.items() for k in (name, *data.get("aliases", ()))]
        assert len(keys) == len(set(keys))


def test_unknown_names_list_the_known_profiles() -> None:
    with pytest.raises(ProfileError, match=r"llama-3\.1-8b"):
        load_model("acme/unknown-model")
    with pytest.raises(ProfileError, match="h100"):
        load_accelerator("tpu-v9")
