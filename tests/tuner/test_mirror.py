"""Optuna RDB mirror: trials with params, values, constraints and states; idempotent; never raises."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from chunkpilot.tuner.act import mirror
from chunkpilot.tuner.act.mirror import (
    NUMBER_ATTR,
    mirror_trials,
    redact,
    study_name,
)
from chunkpilot.tuner.config import TunerConfig
from chunkpilot.tuner.study import RecordState, TrialRecord
from optuna.trial import TrialState

from chunkpilot.testing.tuner import a_space

SPACE = a_space()


def records() -> list[TrialRecord]:
    return [
        TrialRecord(0, {"max_num_batched_tokens": 2048, "max_num_seqs": 128}, RecordState.COMPLETE, 900.0,
                    {"itl": -0.2, "ttft": -0.5}),
        TrialRecord(1, {"max_num_batched_tokens": 8192, "max_num_seqs": 256}, RecordState.COMPLETE, 1200.0,
                    {"itl": 0.4, "ttft": -0.7}),
        TrialRecord(2, {"max_num_batched_tokens": 512, "max_num_seqs": 64}, RecordState.FAILED),
    ]  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_storages() -> None:
    """Each test starts like a new operator process (no cached storage)."""
    mirror._storages.clear()


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def check_mirrored(url: str, name: str = "default/chat") -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=url)
    trials = sorted(study.get_trials(), key=lambda t: t.user_attrs[NUMBER_ATTR])
    assert [t.user_attrs[NUMBER_ATTR] for t in trials] == [0, 1, 2]
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
    assert trials[0].params == {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
    assert trials[1].value == 1200.0
    assert trials[1].user_attrs["constraint_itl"] == pytest.approx(0.4)
    assert trials[1].user_attrs["feasible"] is False and trials[0].user_attrs["feasible"] is True
    # The list form optuna-dashboard shows, ITL first.
    assert trials[0].system_attrs["constraints"] == [pytest.approx(-0.2), pytest.approx(-0.5)]
    assert study.user_attrs["constraint_names"] == ["itl", "ttft"]
    assert "constraints" not in trials[2].system_attrs
    assert study.user_attrs["namespace"] == "default" and study.user_attrs["name"] == "chat"
    return trials


def test_mirror_is_complete_and_idempotent(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert mirror_trials("default", "chat", SPACE, records()[:2], url=url) == 2
    assert mirror_trials("default", "chat", SPACE, records(), url=url) == 1  # only the new one
    mirror._storages.clear()  # an operator restart re-mirrors the whole history
    assert mirror_trials("default", "chat", SPACE, records(), url=url) == 0
    check_mirrored(url)


def test_mirror_trial_with_extra_attributes_and_out_of_space_params(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    # Bounds changed since trial 3 ran: its budget lies outside today's space; a knob no longer tuned.
    params = {"max_num_batched_tokens": 16384, "max_num_seqs": 8, "long_prefill_token_threshold": 512}
    odd = TrialRecord(3, params, RecordState.COMPLETE, 5.0, {"itl": -0.1})
    assert (
        mirror_trials("prod", "code", SPACE, [odd], url=url, attrs={odd.number: {"verdict": "promoted"}}) == 1
    )
    assert mirror_trials("prod", "code", SPACE, [odd], url=url) == 0  # already there
    [trial] = optuna.load_study(study_name="prod/code", storage=url).get_trials()
    assert trial.params["max_num_batched_tokens"] == 16384 and trial.params["max_num_seqs"] == 8
    assert trial.user_attrs["verdict"] == "promoted"


def test_one_study_per_service(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    mirror_trials("default", "chat", SPACE, records(), url=url)
    mirror_trials("other", "chat", SPACE, records()[:1], url=url)
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(url))
    assert names == ["default/chat", "other/chat"]


def test_failures_are_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    url = "postgresql+psycopg://tuner:s3cret@127.0.0.1:1/optuna"
    with caplog.at_level(logging.WARNING, logger="chunkpilot.tuner.act.mirror"):
        assert mirror_trials("default", "chat", SPACE, records(), url=url) is None
        assert mirror_trials("default", "chat", SPACE, records()[:1], url=url) is None
        assert mirror_trials("default", "chat", SPACE, records(), url="nosuchdialect://x") is None
    text = caplog.text
    assert "default/chat" in text and "tuning continues" in text
    assert "s3cret" not in text and "tuner:***@127.0.0.1:1" in text


def test_environment_variable_enables_the_mirror(tmp_path: Path) -> None:
    def storage_url(environ: dict[str, str]) -> str | None:  # as the tuner's settings read it
        return TunerConfig.from_env(environ).optuna_storage

    assert storage_url({}) is None
    assert mirror_trials("default", "chat", SPACE, records()) == 0  # disabled: nothing to do
    assert storage_url({"CHUNKPILOT_OPTUNA_STORAGE": "  "}) is None
    url = storage_url({"CHUNKPILOT_OPTUNA_STORAGE": sqlite_url(tmp_path)})
    assert mirror_trials("default", "chat", SPACE, records(), url=url) == 3
    check_mirrored(sqlite_url(tmp_path))


def test_optuna_dashboard_opens_the_mirror(tmp_path: Path) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    url = sqlite_url(tmp_path)
    mirror_trials("default", "chat", SPACE, records(), url=url)
    app = optuna_dashboard.wsgi(optuna.storages.RDBStorage(url))

    def get(path: str) -> Any:
        status: list[str] = []
        environ = {
            "REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
            "SERVER_PORT": "80", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(),
            "wsgi.errors": sys.stderr,
        }  # fmt: skip
        body = b"".join(app(environ, lambda s, _headers, _exc=None: status.append(s)))
        assert status == ["200 OK"], body[:500]
        return json.loads(body)

    [summary] = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == "default/chat"
    trials = get(f"/api/studies/{summary['study_id']}")["trials"]
    assert [t["state"] for t in trials] == ["Complete", "Complete", "Fail"]
    assert trials[1]["values"] == [1200.0] and trials[1]["constraints"] == [0.4, -0.7]


def test_names_and_redaction() -> None:
    assert study_name("ns", "svc") == "ns/svc"
    assert redact("postgresql+psycopg://u:p@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert redact("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert redact("sqlite:///x.db") == "sqlite:///x.db"


@pytest.mark.postgres
def test_mirror_into_a_real_postgresql(postgres_url: str) -> None:
    assert mirror_trials("default", "chat", SPACE, records()[:1], url=postgres_url) == 1
    mirror._storages.clear()  # operator restart
    assert mirror_trials("default", "chat", SPACE, records(), url=postgres_url) == 2
    mirror._storages.clear()
    assert mirror_trials("default", "chat", SPACE, records(), url=postgres_url) == 0
    check_mirrored(postgres_url)
