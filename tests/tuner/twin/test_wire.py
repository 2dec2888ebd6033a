"""The twin Job's documents: a ranking request and its result survive JSON unchanged, and a ranking
made from the decoded request (in another process, by the Job's command) is the operator's own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from chunkpilot.engine.sim.scheduler import SchedulerConfig, SGLangSchedulerConfig, TrtllmSchedulerConfig
from chunkpilot.tuner.twin import online, wire

CHUNKPILOT = str(Path(sys.executable).with_name("chunkpilot"))


@pytest.mark.parametrize(
    "engine",
    [None, SchedulerConfig(max_model_len=8192), SGLangSchedulerConfig(), TrtllmSchedulerConfig()],
    ids=["defaults", "vllm", "sglang", "trtllm"],
)
def test_a_request_survives_json_with_its_engines_scheduler(
    ranking_request: online.Request, engine: SchedulerConfig | None
) -> None:
    sent = replace(ranking_request, engine=engine, directory="/operator/only")
    text = wire.encode_request(sent)
    back = wire.decode_request(text)
    assert back == replace(sent, directory=None)  # the directory is the writer's own
    assert type(back.engine) is type(engine)
    assert json.loads(text)["apiVersion"] == wire.API_VERSION


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"apiVersion": "chunkpilot.io/twin-job/v0", "kind": "RankingRequest"}', "expected apiVersion"),
        ('{"apiVersion": "chunkpilot.io/twin-job/v1", "kind": "RankingRequest"}', "needs its 'request'"),
        ('{"apiVersion": "chunkpilot.io/twin-job/v1", "kind": "RankingRequest", "request": {}}', "invalid"),
    ],
)
def test_a_malformed_request_is_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(wire.WireError, match=says):
        wire.decode_request(text)


def test_an_unknown_engine_is_named(ranking_request: online.Request) -> None:
    data = json.loads(wire.encode_request(replace(ranking_request, engine=SchedulerConfig())))
    data["request"]["engine"]["engine"] = "tgi"
    with pytest.raises(wire.WireError, match="unknown engine"):
        wire.decode_request(json.dumps(data))


def test_the_jobs_command_ranks_as_the_operator_does(ranking_request: online.Request, tmp_path: Path) -> None:
    """``chunkpilot twin work`` in its own process: the same ranking, joined to the operator's fit."""
    request_file = tmp_path / "request.json"
    request_file.write_text(wire.encode_request(ranking_request))
    done = subprocess.run(
        [CHUNKPILOT, "twin", "work", "--request", str(request_file), "--out", str(tmp_path / "result.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ranked" in done.stderr
    result = wire.decode_result((tmp_path / "result.json").read_text())
    assert wire.decode_result(wire.encode_result(result)) == result

    here = online.calibrate(replace(ranking_request, directory=str(tmp_path / "here")))
    assert result.key == here.key and result.ranked and result.ranked == here.ranked
    assert result.incumbent == here.incumbent and result.evaluations == here.evaluations
    fit = online.calibrate(replace(ranking_request, rank=False, directory=str(tmp_path / "fit")))
    joined = wire.with_ranking(fit, result)
    assert joined.ranked == here.ranked and joined.predicted_ms == here.predicted_ms
    with pytest.raises(wire.WireError, match="ranks twin"):
        wire.with_ranking(replace(fit, key="other-1"), result)


def test_an_unusable_request_file_exits_2_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "request.json"
    bad.write_text('{"apiVersion": "x"}')
    done = subprocess.run(
        [CHUNKPILOT, "twin", "work", "--request", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "expected apiVersion" in done.stderr
