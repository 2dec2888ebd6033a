"""Prometheus configuration and file_sd rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunkpilot.devcluster.prometheus import TargetGroup, render_config, render_file_sd


def test_config_reads_targets_from_the_file(tmp_path: Path) -> None:
    config = render_config(tmp_path / "targets.json", scrape_interval="1s", job="engines")
    job = config["scrape_configs"][0]
    assert job["job_name"] == "engines"
    assert job["scrape_interval"] == "1s"
    assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "targets.json")]


def test_config_rejects_a_bad_interval(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scrape_interval"):
        render_config(tmp_path / "t.json", scrape_interval="fast")


def test_file_sd_carries_labels_and_metrics_path() -> None:
    groups = [TargetGroup(["127.0.0.1:8000"], {"track": "canary"}, metrics_path="/stats")]
    assert render_file_sd(groups) == [
        {"targets": ["127.0.0.1:8000"], "labels": {"track": "canary", "__metrics_path__": "/stats"}}
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"targets": ["http://x:1"]}, "targets"),
        ({"targets": ["x:1"], "metrics_path": "metrics"}, "metrics_path"),
        ({"targets": ["x:1"], "labels": {"__name__": "x"}}, "labels"),
    ],
)
def test_target_group_names_the_bad_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        TargetGroup(**kwargs)  # type: ignore[arg-type]
