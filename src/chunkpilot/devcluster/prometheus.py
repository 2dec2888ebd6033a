"""A real Prometheus server on loopback whose scrape targets can be changed at runtime.

The generated configuration has one scrape job that reads its targets from a ``file_sd`` file;
:meth:`PrometheusServer.set_targets` rewrites that file atomically and Prometheus picks the change
up through its file watcher. The binary comes from the distribution package (``/usr/bin/prometheus``
on Debian), installed on demand with ``apt-get`` when running as root.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chunkpilot.devcluster import processes
from chunkpilot.devcluster.debian import locate_or_install
from chunkpilot.devcluster.ports import LOOPBACK, free_port
from chunkpilot.devcluster.processes import ManagedProcess

PROMETHEUS_ENV = "CHUNKPILOT_PROMETHEUS"
DEBIAN_PACKAGE = "prometheus"
_DURATION = re.compile(r"^[0-9]+(ms|s|m|h)$")
_ADDRESS = re.compile(r"^[^\s/:]+:[0-9]{1,5}$")


class PrometheusError(RuntimeError):
    """Prometheus could not be found, started or queried."""


@dataclass(frozen=True)
class TargetGroup:
    """A ``file_sd`` target group: ``host:port`` addresses sharing labels and a metrics path."""

    targets: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"

    def __post_init__(self) -> None:
        for target in self.targets:
            if not _ADDRESS.match(target):
                raise ValueError(f"targets: {target!r} is not a host:port address (e.g. 127.0.0.1:8000)")
        if not self.metrics_path.startswith("/"):
            raise ValueError(f"metrics_path: must start with '/', got {self.metrics_path!r}")
        for name in self.labels:
            if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", name) or name.startswith("__"):
                raise ValueError(f"labels: {name!r} is not a valid Prometheus label name")


def render_config(targets_file: Path, scrape_interval: str = "1s", job: str = "chunkpilot") -> dict[str, Any]:
    """The Prometheus configuration: one job whose targets come from ``targets_file``."""
    if not _DURATION.match(scrape_interval):
        raise ValueError(f"scrape_interval: expected a duration such as 1s or 500ms, got {scrape_interval!r}")
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            },
        ],
    }


def render_file_sd(groups: Sequence[TargetGroup]) -> list[dict[str, Any]]:
    """The ``file_sd`` document for ``groups`` (the metrics path travels as ``__metrics_path__``)."""
    return [
        {
            "targets": list(group.targets),
            "labels": {**group.labels, "__metrics_path__": group.metrics_path},
        }
        for group in groups
    ]


def locate_prometheus() -> Path | None:
    """The binary: ``$CHUNKPILOT_PROMETHEUS``, ``prometheus`` on PATH, or ``/usr/bin/prometheus``."""
    for candidate in (os.environ.get(PROMETHEUS_ENV), shutil.which("prometheus"), "/usr/bin/prometheus"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def ensure_prometheus(progress: Callable[[str], None] = lambda _: None) -> Path:
    """The prometheus binary, installing the distribution package when missing (root only)."""
    return locate_or_install(
        locate_prometheus,
        DEBIAN_PACKAGE,
        progress,
        not_installed=PrometheusError(
            "Prometheus is not installed: install the `prometheus` package (Debian/Ubuntu: "
            f"`sudo apt-get install -y {DEBIAN_PACKAGE}`) or point {PROMETHEUS_ENV} at a prometheus binary"
        ),
        error=PrometheusError,
        installed_nothing=f"the {DEBIAN_PACKAGE} package installed no prometheus binary on PATH",
    )


class PrometheusServer:
    """One Prometheus process with a runtime-editable set of scrape targets."""

    def __init__(
        self,
        state_dir: Path,
        binary: Path | None = None,
        scrape_interval: str = "1s",
        job: str = "chunkpilot",
        startup_timeout: float = 60.0,
        basic_auth: tuple[str, str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``basic_auth``: ``(user, password, bcrypt hash of the password)``: every request to this
        Prometheus must then carry them (its ``--web.config.file``). ``tls``: ``(certificate, key)``
        files: it then serves HTTPS only."""
        self.basic_auth = basic_auth
        self.tls = tls
        self.state_dir = state_dir
        self.binary = binary
        self.scrape_interval = scrape_interval
        self.job = job
        self.startup_timeout = startup_timeout
        self.targets_file = state_dir / "targets.json"
        self.config_file = state_dir / "prometheus.yml"
        self.port: int | None = None
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:41234``."""
        if self.port is None:
            raise PrometheusError("Prometheus is not started")
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}"

    def start(self) -> PrometheusServer:
        """Write the configuration, start Prometheus and wait until ``/-/ready`` answers."""
        binary = self.binary or ensure_prometheus()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            yaml.safe_dump(render_config(self.targets_file, self.scrape_interval, self.job))
        )
        self.set_target_groups([])
        self.port = free_port()
        web: list[str] = []
        settings: dict[str, object] = {}
        if self.basic_auth is not None:
            user, _password, hashed = self.basic_auth
            settings["basic_auth_users"] = {user: hashed}
        if self.tls is not None:
            certificate, key = self.tls
            settings["tls_server_config"] = {"cert_file": str(certificate), "key_file": str(key)}
        if settings:
            web_config = self.state_dir / "web.yml"
            web_config.write_text(yaml.safe_dump(settings))
            web = [f"--web.config.file={web_config}"]
        self._process = ManagedProcess(
            name="prometheus",
            argv=[
                str(binary),
                *web,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.state_dir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}",
                "--storage.tsdb.retention.time=2h",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log_path=self.state_dir / "prometheus.log",
            cwd=self.state_dir,
        ).start()
        process = self._process
        processes.start_or_undo(
            lambda: process.wait_until(
                lambda: processes.http_ok(
                    f"{self.url}/-/ready",
                    processes.insecure_tls_context() if self.tls else None,
                    headers=self._authorization(),
                ),
                self.startup_timeout,
                "GET /-/ready",
            ),
            self.stop,
        )
        return self

    def _authorization(self) -> dict[str, str]:
        if self.basic_auth is None:
            return {}
        user, password, _hashed = self.basic_auth
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def stop(self) -> None:
        """Stop Prometheus (its data folder stays for inspection)."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def set_target_groups(self, groups: Sequence[TargetGroup]) -> None:
        """Replace every scrape target (atomic rename, so Prometheus never reads a partial file)."""
        partial = self.targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(render_file_sd(groups), indent=2))
        partial.replace(self.targets_file)

    def set_targets(
        self, targets: Sequence[str], labels: Mapping[str, str] | None = None, metrics_path: str = "/metrics"
    ) -> None:
        """Replace every scrape target with ``targets`` (``host:port``), all sharing ``labels``."""
        groups = [TargetGroup(list(targets), dict(labels or {}), metrics_path)] if targets else []
        self.set_target_groups(groups)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        request = urllib.request.Request(f"{self.url}{path}{query}", headers=self._authorization())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            raise PrometheusError(
                f"GET {path} failed: {error.code} {error.read().decode(errors='replace')}"
            ) from error
        if body.get("status") != "success":
            raise PrometheusError(f"GET {path} failed: {body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Run an instant query and return the result vector (``[{"metric": {...}, "value": [t, "v"]}]``).

        ``at``: the evaluation time (Unix seconds; default now). Queries whose results are combined
        take one ``at``: a range function such as ``increase()`` extrapolates differently at another.
        """
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        data = self._get("/api/v1/query", params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """Run a range query (Unix seconds) and return its matrix (``[{"metric": {...}, "values": [[t,
        "v"], ...]}]``)."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        data = self._get("/api/v1/query_range", params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        """The active targets as Prometheus reports them (``labels``, ``health``, ``lastError`` …)."""
        data = self._get("/api/v1/targets", {"state": "active"})
        targets: list[dict[str, Any]] = data["activeTargets"]
        return targets

    def target_health(self, address: str) -> str | None:
        """``up``, ``down`` or ``unknown`` for the target at ``address``; ``None`` if it is not active."""
        for target in self.active_targets():
            if target.get("labels", {}).get("instance") == address:
                return str(target.get("health"))
        return None

    def wait_for_target_up(self, address: str, timeout: float = 30.0) -> None:
        """Wait until ``address`` has been scraped successfully; the error names its last scrape error."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            for target in self.active_targets():
                if target.get("labels", {}).get("instance") == address:
                    last = target
                    if target.get("health") == "up":
                        return
            time.sleep(0.25)
        detail = (
            f"health={last.get('health')}, lastError={last.get('lastError')!r}" if last else "not discovered"
        )
        raise PrometheusError(f"scrape target {address} not up within {timeout:.0f}s ({detail})")
