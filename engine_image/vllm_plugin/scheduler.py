"""Chunkpilot's vLLM V1 scheduler: partial-prefill lanes, live limits and a step log.

Select it with ``--scheduler-cls chunkpilot.engine.vllm_plugin.scheduler.ChunkpilotScheduler``.
It wraps vLLM's own ``schedule()`` rather than re-implementing it:

* **Partial-prefill lanes.** Before each step it decides which prefills may run
  (:func:`chunkpilot.engine.vllm_plugin.lanes.plan_lanes`), hides the others
  from the running list and the waiting queue for the duration of the step,
  and caps each prefill's chunk at ``budget // prefills`` while several share
  the step, so a short prompt is not starved by a long one's chunk.
* **Live limits.** It polls the control file (one ``stat`` per step) and applies
  lowered values of the token budget and the running-request limits. Raises
  above the start-up values are refused. Limits reset on restart.
* **Step log.** With ``step_log`` set, one JSON line per step records its
  composition (for tests and debugging; off in production).
* **Step telemetry.** With ``PROMETHEUS_MULTIPROC_DIR`` set, every step's
  duration and composition, and finer ITL/TTFT histograms, go to vLLM's
  ``/metrics`` (:mod:`chunkpilot.engine.vllm_plugin.telemetry`).

When vLLM enables async scheduling, instantiating ``ChunkpilotScheduler``
yields :class:`ChunkpilotAsyncScheduler`, the same logic over vLLM's
``AsyncScheduler``, so one ``--scheduler-cls`` value serves both modes.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import IO, Any

from chunkpilot.engine.live_adjust import LiveLimits
from chunkpilot.engine.vllm_plugin.config import (
    PluginConfig,
    applied_file,
    load_plugin_config,
    write_json_atomic,
)
from chunkpilot.engine.vllm_plugin.lanes import PrefillCandidate, plan_lanes, reinsert_in_order
from chunkpilot.engine.vllm_plugin.telemetry import StepTelemetry, telemetry_problem
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

# A child of vLLM's logger, so messages share its handlers and format.
logger = logging.getLogger("vllm.plugins.chunkpilot")

# Waiting requests examined per step when looking for a free lane.
WAITING_SCAN_LIMIT = 512


def _is_prefilling(request: Any) -> bool:
    """True while the request still has prompt (or, after preemption, recomputed) tokens to run."""
    computed: int = request.num_computed_tokens
    prompt: int = request.num_prompt_tokens
    total: int = request.num_tokens
    return computed < max(prompt, total - 1)


class _ChunkpilotMixin:
    """The plugin's behaviour, layered over vLLM's ``Scheduler`` or ``AsyncScheduler``."""

    # Attributes of vLLM's Scheduler this mixin reads or adjusts.
    vllm_config: Any
    scheduler_config: Any
    running: list[Any]
    waiting: Any
    kv_holding_waiting: Any
    requests: dict[str, Any]
    policy: Any
    max_model_len: int
    max_num_scheduled_tokens: int
    max_num_running_reqs: int
    max_num_active_reqs: int
    num_waiting_for_streaming_input: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        additional = self.vllm_config.additional_config
        self.cp_config: PluginConfig = load_plugin_config(
            additional if isinstance(additional, Mapping) else None
        )
        self.cp_lanes = self.cp_config.partial_prefill_limits(self.max_model_len)
        self.cp_startup = LiveLimits(
            max_num_batched_tokens=self.max_num_scheduled_tokens,
            max_num_seqs=self.max_num_running_reqs,
            max_num_active_seqs=self.max_num_active_reqs,
        )
        self.cp_live = self.cp_startup
        self.cp_step = 0
        self.cp_step_log: IO[str] | None = None
        if self.cp_config.step_log:
            self.cp_step_log = open(self.cp_config.step_log, "a", buffering=1)  # noqa: SIM115
        self.cp_control_seen: tuple[int, int] | None = None
        self.cp_generation = 0
        if self.cp_config.control_file:
            # A control file left from an earlier run is ignored: limits reset on restart.
            self.cp_control_seen = self._cp_control_stat()
            self._cp_report(error=None)
        self.cp_telemetry: StepTelemetry | None = None
        problem = telemetry_problem()
        if problem is None:
            model_config = getattr(self.vllm_config, "model_config", None)
            parallel = getattr(self.vllm_config, "parallel_config", None)
            self.cp_telemetry = StepTelemetry(
                str(getattr(model_config, "served_model_name", None) or "model"),
                str(getattr(parallel, "data_parallel_rank", 0) or 0),
                precreate_tokens=self.max_num_scheduled_tokens,
            )
        logger.info(
            "Chunkpilot scheduler (%s): partial-prefill lanes %s, live limits %s, step log %s, "
            "step telemetry %s",
            type(self).__name__,
            self.cp_lanes or "off",
            "via " + self.cp_config.control_file if self.cp_config.control_file else "off",
            self.cp_config.step_log or "off",
            "on" if problem is None else f"off ({problem})",
        )

    # -- live limits -----------------------------------------------------------------
    def _cp_control_stat(self) -> tuple[int, int] | None:
        assert self.cp_config.control_file is not None
        try:
            st = os.stat(self.cp_config.control_file)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def _cp_report(self, error: str | None) -> None:
        assert self.cp_config.control_file is not None
        write_json_atomic(
            applied_file(self.cp_config.control_file),
            {
                "generation": self.cp_generation,
                "step": self.cp_step,
                "pid": os.getpid(),
                "time": time.time(),
                "startup": self.cp_startup.to_json(),
                "applied": self.cp_live.to_json(),
                "error": error,
            },
        )

    def _cp_poll_control(self) -> None:
        if not self.cp_config.control_file:
            return
        seen = self._cp_control_stat()
        if seen is None or seen == self.cp_control_seen:
            return
        self.cp_control_seen = seen
        error = None
        try:
            with open(self.cp_config.control_file) as handle:
                data = json.load(handle)
            self.cp_generation = int(data["generation"])
            requested = LiveLimits.from_json(data["limits"])
            raised = [
                name for name, value in requested.to_json().items() if value > getattr(self.cp_startup, name)
            ]
            if raised:
                error = f"refused: {raised} above the start-up values {self.cp_startup.to_json()}"
            else:
                self._cp_apply(requested)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            error = f"unreadable control file: {exc}"
        if error:
            logger.warning("Chunkpilot live limits: %s", error)
        self._cp_report(error)

    def _cp_apply(self, limits: LiveLimits) -> None:
        self.cp_live = limits
        # vLLM reads both attributes at the start of every step. The running
        # list's slot count (max_num_running_reqs) stays: buffers are sized by it.
        self.max_num_scheduled_tokens = limits.max_num_batched_tokens
        self.max_num_active_reqs = min(limits.max_num_seqs, limits.max_num_active_seqs)
        logger.info("Chunkpilot live limits applied: %s", limits)

    # -- the step --------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        output = self._cp_schedule(*args, **kwargs)
        if self.cp_telemetry is not None:
            self.cp_telemetry.scheduled(started, output, self.requests)
        return output

    def update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, *args, **kwargs)  # type: ignore[misc]
        if self.cp_telemetry is not None:
            self.cp_telemetry.finished(scheduler_output, outputs)
        return outputs

    def finish_requests(self, request_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if self.cp_telemetry is not None:
            self.cp_telemetry.forget(
                [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            )
        return super().finish_requests(request_ids, *args, **kwargs)  # type: ignore[misc]

    def _cp_schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._cp_poll_control()
        self.cp_step += 1
        if self.cp_lanes is None and self.cp_step_log is None:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]

        running_before = {r.request_id for r in self.running}
        prefilling_before = {r.request_id for r in self.running if _is_prefilling(r)}
        if self.cp_lanes is None:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        else:
            output = self._cp_schedule_with_lanes(*args, **kwargs)
        if self.cp_step_log is not None:
            self._cp_log_step(output, running_before, prefilling_before)
        return output

    def _cp_schedule_with_lanes(self, *args: Any, **kwargs: Any) -> Any:
        lanes = self.cp_lanes
        assert lanes is not None
        candidates: list[PrefillCandidate[Any]] = [
            PrefillCandidate(r, r.num_prompt_tokens, True) for r in self.running if _is_prefilling(r)
        ]
        for index, request in enumerate(self.waiting):
            if index >= WAITING_SCAN_LIMIT:
                break
            candidates.append(PrefillCandidate(request, request.num_prompt_tokens, False))
        plan = plan_lanes(candidates, lanes, self.max_num_scheduled_tokens)

        original_running = list(self.running)
        hidden_running = [c.key for c in candidates if c.started and c.key not in plan.allowed]
        allowed_waiting = [c.key for c in candidates if not c.started and c.key in plan.allowed]
        original_waiting = self.waiting
        swap_waiting = len(allowed_waiting) < len(original_waiting)
        saved_active = self.max_num_active_reqs
        saved_config = self.scheduler_config

        if hidden_running:
            hidden_ids = {id(r) for r in hidden_running}
            self.running = [r for r in self.running if id(r) not in hidden_ids]
            # Hidden requests keep their slots: admit no one into them.
            self.max_num_active_reqs = max(0, saved_active - len(hidden_running))
        if swap_waiting:
            self.waiting = create_request_queue(self.policy)
            for request in allowed_waiting:
                self.waiting.add_request(request)
        if plan.chunk_cap:
            capped = copy.copy(saved_config)
            threshold = saved_config.long_prefill_token_threshold
            capped.long_prefill_token_threshold = (
                min(threshold, plan.chunk_cap) if threshold > 0 else plan.chunk_cap
            )
            self.scheduler_config = capped
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.scheduler_config = saved_config
            self.max_num_active_reqs = saved_active
            if hidden_running:
                self.running = reinsert_in_order(
                    original_running, self.running, hidden_running, new_first=False
                )
            if swap_waiting:
                leftover = list(self.waiting)
                allowed_ids = {id(r) for r in allowed_waiting}
                leftover_ids = {id(r) for r in leftover}
                admitted = [r for r in allowed_waiting if id(r) not in leftover_ids]
                if admitted:
                    original_waiting.remove_requests(admitted)
                # Requests preempted during the step were put in front of the queue.
                for request in reversed([r for r in leftover if id(r) not in allowed_ids]):
                    original_waiting.prepend_request(request)
                self.waiting = original_waiting

    def _cp_log_step(self, output: Any, running_before: set[str], prefilling_before: set[str]) -> None:
        assert self.cp_step_log is not None
        prefills = []
        decodes = 0
        for req_id, tokens in output.num_scheduled_tokens.items():
            if req_id in prefilling_before or req_id not in running_before:
                request = self.requests.get(req_id)
                prompt = request.num_prompt_tokens if request is not None else -1
                is_long = self.cp_lanes.is_long(prompt) if self.cp_lanes else None
                prefills.append({"id": req_id, "tokens": tokens, "prompt": prompt, "long": is_long})
            else:
                decodes += 1
        record = {
            "step": self.cp_step,
            "time": time.time(),
            "budget": self.max_num_scheduled_tokens,
            "total": output.total_num_scheduled_tokens,
            "decodes": decodes,
            "prefills": prefills,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "lanes": None
            if self.cp_lanes is None
            else [
                self.cp_lanes.max_num_partial_prefills,
                self.cp_lanes.max_long_partial_prefills,
                self.cp_lanes.long_prefill_threshold,
            ],
        }
        self.cp_step_log.write(json.dumps(record) + "\n")

    def shutdown(self) -> None:
        if self.cp_step_log is not None:
            self.cp_step_log.close()
            self.cp_step_log = None
        super().shutdown()  # type: ignore[misc]


class ChunkpilotScheduler(_ChunkpilotMixin, Scheduler):  # type: ignore[misc]  # vLLM is untyped here
    """vLLM V1 scheduler with Chunkpilot's partial-prefill lanes and live limits."""

    def __new__(cls, *args: Any, **kwargs: Any) -> ChunkpilotScheduler:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        scheduler_config = getattr(vllm_config, "scheduler_config", None)
        if cls is ChunkpilotScheduler and getattr(scheduler_config, "async_scheduling", False):
            cls = ChunkpilotAsyncScheduler
        instance: ChunkpilotScheduler = object.__new__(cls)
        return instance


class ChunkpilotAsyncScheduler(ChunkpilotScheduler, AsyncScheduler):  # type: ignore[misc]
    """The same behaviour over vLLM's ``AsyncScheduler`` (chosen automatically)."""
