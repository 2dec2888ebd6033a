"""The tuner's settings from the environment: the twin Jobs' switch, budget and image."""

from __future__ import annotations

import pytest
from chunkpilot.tuner.config import TunerConfig
from chunkpilot.tuner.twin.jobs import OffloadMode


def test_twin_jobs_are_off_by_default() -> None:
    config = TunerConfig.from_env({})
    assert config.twin_offload.mode is OffloadMode.OFF and config.twin_job_image is None


def test_twin_jobs_read_their_mode_budget_and_image() -> None:
    config = TunerConfig.from_env(
        {
            "CHUNKPILOT_TWIN_JOBS": "auto",
            "CHUNKPILOT_TWIN_LOCAL_CORES": "0.25",
            "CHUNKPILOT_TWIN_JOB_IMAGE": "ghcr.io/chunkpilot/chunkpilot:1",
        }
    )
    assert config.twin_offload.mode is OffloadMode.AUTO and config.twin_offload.cores == 0.25
    assert config.twin_job_image == "ghcr.io/chunkpilot/chunkpilot:1"


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        (
            {"CHUNKPILOT_TWIN_JOBS": "sometimes"},
            "CHUNKPILOT_TWIN_JOBS='sometimes': expected one of off, auto",
        ),
        ({"CHUNKPILOT_TWIN_JOBS": "auto"}, "set CHUNKPILOT_TWIN_JOB_IMAGE"),
        (
            {
                "CHUNKPILOT_TWIN_JOBS": "auto",
                "CHUNKPILOT_TWIN_JOB_IMAGE": "i",
                "CHUNKPILOT_TWIN_LOCAL_CORES": "x",
            },
            "CHUNKPILOT_TWIN_LOCAL_CORES='x'",
        ),
    ],
)
def test_bad_twin_job_settings_name_the_variable(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        TunerConfig.from_env(environ)
