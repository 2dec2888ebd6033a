"""Run the demo: local stack up, service applied, trace replayed, tuning watched, report written.

The steps are the ones a user would take by hand on a real cluster; the demo only strings them
together and shows them. Everything it starts lives inside one :class:`LocalStack`, so leaving —
at the end, on an error or on Ctrl-C — stops every process, newest first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.live import Live
from rich.panel import Panel

from chunkpilot.api import InferenceService, TuningTrial
from chunkpilot.demo.live import Outcome, assess, condition, render_view
from chunkpilot.demo.scenario import DEMO_NAMESPACE, DemoScenario, build_inferenceservice
from chunkpilot.demo.surge import Surge
from chunkpilot.localrun.stack import LocalStack, StackOptions, print_progress, sigterm_as_interrupt
from chunkpilot.report.history import load_history, trial_rows
from chunkpilot.report.render import render_table, write_report
from chunkpilot.report.timeline import ReplicaSample, Timeline, count_runs, read_timeline, timeline_queries

GROUP, VERSION, PLURAL = "chunkpilot.io", "v1alpha1", "inferenceservices"
#: How long the service may take to become Ready after it is applied.
READY_TIMEOUT_S = 180.0
POLL_S = 1.0


@dataclass
class Recording:
    """What the demo saw over time: when the load began and the service's replica counts."""

    started_at: float | None = None
    samples: list[ReplicaSample] = field(default_factory=list)

    def sample(self, service: InferenceService) -> None:
        status = service.status
        scaling = status.scaling if status else None
        self.samples.append(
            ReplicaSample(
                time.time(),
                status.stable_replicas if status else None,
                scaling.desired_replicas if scaling else None,
            )
        )

    def timeline(self, stack: LocalStack, scenario: DemoScenario) -> Timeline | None:
        """The run's timeline from Prometheus and the samples; None before the load began."""
        if self.started_at is None or stack.prometheus is None or time.time() - self.started_at < 20:
            return None
        queries = timeline_queries(
            scenario.name, DEMO_NAMESPACE, scenario.engine, scenario.itl_quantile, scenario.ttft_quantile
        )
        return read_timeline(
            stack.prometheus.query_range, queries, self.started_at, time.time(), self.samples
        )


@dataclass(frozen=True)
class DemoResult:
    """What the demo achieved; ``exit_code`` is 0 when a promoted config meets both SLOs."""

    outcome: Outcome | None
    report: Path | None
    interrupted: bool
    failure: str | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.failure is not None:
            return 1
        return 0 if self.outcome is not None and self.outcome.meets_slos else 1


def apply_service(api_client: Any, manifest: dict[str, Any]) -> None:
    """Create the InferenceService, or replace the spec of one left from an earlier run."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api_client)
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    except ApiException as error:
        if error.status != 409:
            raise
        current = cast(
            dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )
        manifest = {
            **manifest,
            "metadata": {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, manifest)


def set_scaling_mode(api_client: Any, name: str, mode: str) -> None:
    """Turn the replica planner of the demo's service to ``mode`` (``kubectl patch`` would do the same)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    patch = {"spec": {"scaling": {"mode": mode}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, DEMO_NAMESPACE, PLURAL, name, patch)


def wait_until_ready(
    read: Callable[[], InferenceService], timeout_s: float, progress: Callable[[str], None]
) -> None:
    """Poll until the service's ``Ready`` condition is True; raise TimeoutError with its last state."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        service = read()
        status, reason, message = condition(service, "Ready")
        if status == "True":
            return
        state = f"Ready={status or 'Unknown'} {reason} {message}".strip()
        if state != last:
            progress(f"waiting for the service: {state}")
            last = state
        time.sleep(POLL_S)
    raise TimeoutError(f"the service did not become Ready within {timeout_s:.0f}s (last: {last})")


def watch_commands(kubeconfig: Path, name: str) -> str:
    """The commands that show the demo from another shell."""
    return (
        f"export KUBECONFIG={kubeconfig}\n"
        f"kubectl get inferenceservices,tuningtrials -n {DEMO_NAMESPACE} -w\n"
        f"kubectl describe inferenceservice {name} -n {DEMO_NAMESPACE}\n"
        f"kubectl get deployments,pods -n {DEMO_NAMESPACE} -L chunkpilot.io/track,chunkpilot.io/config-hash\n"
        f"kubectl chunkpilot status {name}\n"
        f"kubectl chunkpilot trials {name}"
    )


def run_demo(
    scenario: DemoScenario, *, state_dir: Path, report_dir: Path, console: Console | None = None
) -> DemoResult:
    """Run the whole demo and tear everything down; never leaves a process behind."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=140)  # logs and pipes: room for the trial table
    progress = print_progress("demo")
    options = StackOptions(
        state_dir=state_dir,
        nodes=scenario.nodes,
        accelerator=scenario.accelerator,
        time_scale=scenario.time_scale,
    )
    outcome: Outcome | None = None
    report: Path | None = None
    recording = Recording()
    interrupted = False
    failure: str | None = None
    try:
        with sigterm_as_interrupt(), LocalStack(options, progress=progress) as stack:
            api_client = stack.control_plane.api_client() if stack.control_plane else None
            assert api_client is not None
            try:
                outcome = _drive(scenario, stack, api_client, recording, console, progress)
                report = _write_report(api_client, scenario, report_dir, console, stack, recording)
            except KeyboardInterrupt:
                interrupted = True
                progress("interrupted: writing the report, then tearing down")
                report = _write_report(api_client, scenario, report_dir, console, stack, recording)
            except (RuntimeError, TimeoutError) as error:
                failure = str(error)
                console.print(f"[red]the demo failed: {failure}[/]")
                console.print(f"logs: {state_dir} (operator.log, engines/, cluster/logs/)")
                report = _write_report(api_client, scenario, report_dir, console, stack, recording)
            finally:
                api_client.close()
            progress("tearing down the local stack")
    except KeyboardInterrupt:
        interrupted = True
    _print_summary(console, scenario, outcome, report, interrupted, recording)
    return DemoResult(outcome=outcome, report=report, interrupted=interrupted, failure=failure)


def _drive(
    scenario: DemoScenario,
    stack: LocalStack,
    api_client: Any,
    recording: Recording,
    console: Console,
    progress: Callable[[str], None],
) -> Outcome:
    name = scenario.name
    console.print(
        Panel(watch_commands(stack.kubeconfig, name), title="Watch from another shell", expand=False)
    )
    progress(
        f"applying InferenceService {name}: {scenario.model} on a simulated {scenario.accelerator}, "
        f"budget {scenario.budget}, SLO ITL p{scenario.itl_quantile * 100:g} <= {scenario.itl_max_ms:g} ms, "
        f"TTFT p{scenario.ttft_quantile * 100:g} <= {scenario.ttft_max_ms:g} ms"
    )
    apply_service(api_client, build_inferenceservice(scenario))

    def read() -> InferenceService:
        stack.check_operator()
        return load_history(api_client, DEMO_NAMESPACE, name)[0]

    wait_until_ready(read, READY_TIMEOUT_S, progress)
    progress("service Ready: replaying the trace")
    recording.started_at = time.time()
    stack.start_load(
        name,
        scenario.trace,
        namespace=DEMO_NAMESPACE,
        rate=scenario.rate,
        duration_s=scenario.timeout_s + 60,
        max_prompt_tokens=scenario.max_prompt_tokens,
    )
    deadline = time.monotonic() + scenario.timeout_s
    service, trials = load_history(api_client, DEMO_NAMESPACE, name)
    outcome = assess(service, trials)
    surge = Surge(scenario)
    # On a terminal the view refreshes in place; in a log, each trial transition is one line.
    live = Live(
        render_view(service, trials, datetime.now(UTC), surge.describe(time.time())),
        console=console,
        refresh_per_second=2,
    )
    seen: set[str] = set()
    said = surge.phase
    with live if console.is_terminal else contextlib.nullcontext():
        while (not outcome.finished or surge.busy) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            stack.check_operator()
            service, trials = _read_quietly(api_client, name, service, trials)
            outcome = assess(service, trials)
            recording.sample(service)
            now = time.time()
            extra = surge.step(now, service, outcome.finished)
            if extra is not None:
                if not surge.ramped:  # the surge begins: the planner acts from now on
                    set_scaling_mode(api_client, name, "Auto")
                stack.start_load(
                    name,
                    scenario.trace,
                    namespace=DEMO_NAMESPACE,
                    rate=extra.rate,
                    duration_s=extra.duration_s,
                    max_prompt_tokens=scenario.max_prompt_tokens,
                    seed=2 if surge.ramped else 1,
                )
            if console.is_terminal:
                live.update(render_view(service, trials, datetime.now(UTC), surge.describe(now)))
            else:
                for line in transition_lines(trials, seen):
                    progress(line)
            if surge.phase is not said and not console.is_terminal:
                progress(surge.describe(now))
            said = surge.phase
    if not outcome.finished or surge.busy:
        why = outcome.reason if not outcome.finished else surge.describe(time.time())
        progress(f"stopping after --timeout {scenario.timeout_s:.0f}s: {why}")
    return outcome


def transition_lines(trials: list[TuningTrial], seen: set[str]) -> list[str]:
    """One line per trial phase not reported before (``seen`` remembers what was)."""
    lines = []
    for row in trial_rows(trials):
        key = f"{row.number}/{row.phase}"
        if key in seen:
            continue
        seen.add(key)
        measured = "" if row.itl_ms is None else f" ITL {row.itl_ms:.0f} ms, TTFT {row.ttft_ms or 0:.0f} ms"
        verdict = f" -> {row.verdict}" if row.verdict else ""
        lines.append(f"trial {row.number} {row.params}: {row.phase}{measured}{verdict}")
    return lines


def _read_quietly(
    api_client: Any, name: str, service: InferenceService, trials: list[TuningTrial]
) -> tuple[InferenceService, list[TuningTrial]]:
    """Read the latest state; on a transient API error keep showing the previous one."""
    try:
        return load_history(api_client, DEMO_NAMESPACE, name)
    except Exception:  # the view must survive a slow or restarting API server
        return service, trials


def _write_report(
    api_client: Any,
    scenario: DemoScenario,
    report_dir: Path,
    console: Console,
    stack: LocalStack,
    recording: Recording,
) -> Path | None:
    try:
        service, trials = load_history(api_client, DEMO_NAMESPACE, scenario.name)
    except Exception as error:  # the stack may already be failing; say so and go on tearing down
        console.print(f"[red]could not read the trial history for the report: {error}[/]")
        return None
    rows = trial_rows(trials)
    console.print(render_table(service, rows))
    try:
        timeline = recording.timeline(stack, scenario)
    except Exception as error:  # Prometheus failing too: the report goes without its timeline
        console.print(f"[yellow]the report has no timeline: Prometheus did not answer ({error})[/]")
        timeline = None
    try:
        return write_report(service, rows, report_dir / scenario.name, timeline)
    except (OSError, ValueError) as error:
        console.print(f"[red]could not write the report to {report_dir / scenario.name}: {error}[/]")
        return None


def _print_summary(
    console: Console,
    scenario: DemoScenario,
    outcome: Outcome | None,
    report: Path | None,
    interrupted: bool,
    recording: Recording,
) -> None:
    lines: list[str] = []
    if interrupted:
        lines.append("Interrupted; every process the demo started has been stopped.")
    if outcome is not None:
        promoted = outcome.promoted
        if promoted is not None:
            params = promoted.spec.params
            canary = promoted.status.canary if promoted.status else None
            measured = ""
            if canary is not None and canary.itl_ms is not None and canary.ttft_ms is not None:
                measured = (
                    f": ITL p{scenario.itl_quantile * 100:g} {canary.itl_ms:.0f} ms"
                    f" (target {scenario.itl_max_ms:g}), TTFT p{scenario.ttft_quantile * 100:g}"
                    f" {canary.ttft_ms:.0f} ms (target {scenario.ttft_max_ms:g})"
                )
            lines.append(
                f"Promoted trial {promoted.spec.number}: budget {scenario.budget}"
                f" -> {params.max_num_batched_tokens}, "
                f"max-num-seqs {params.max_num_seqs}{measured}."
            )
            lines.append(
                "Both SLOs met." if outcome.meets_slos else "The promoted config does not meet both SLOs."
            )
        elif outcome.infeasible:
            lines.append(f"No configuration meets both SLOs: {outcome.reason}")
        else:
            lines.append(f"No configuration was promoted ({outcome.trials_finished} trials finished).")
    if scenario.scales and recording.samples:
        lines.append(
            f"Stable replicas over the run: {count_runs([s.replicas for s in recording.samples])} "
            f"(desired: {count_runs([s.desired for s in recording.samples])})."
        )
    if report is not None:
        lines.append(f"Report: {report}")
    console.print(
        Panel("\n".join(lines) or "The demo did not get as far as tuning.", title="Summary", expand=False)
    )


__all__ = [
    "DemoResult",
    "apply_service",
    "run_demo",
    "set_scaling_mode",
    "wait_until_ready",
    "watch_commands",
]
