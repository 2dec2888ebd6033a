"""Step telemetry of the Chunkpilot scheduler on vLLM: the ``chunkpilot:*`` metrics of the twin.

The scheduler runs in vLLM's engine-core process, but ``/metrics`` is served by the API-server
process. vLLM V1 (0.32/0.33) gives a plugin no channel between them: its stat loggers run in the API
server on a fixed ``SchedulerStats`` record, and a custom logger can only be passed to ``AsyncLLM``
programmatically, not to ``vllm serve``. Its ``/metrics`` does however read prometheus_client's
multiprocess directory when ``PROMETHEUS_MULTIPROC_DIR`` is set (the mode vLLM itself uses with
``--api-server-count`` > 1), and the engine-core process inherits that variable. So the metrics are
written here with prometheus_client and appear on the API server's ``/metrics`` next to vLLM's, with
no extra port; without the variable they could not be served, and the telemetry stays off (the tuner
then reports the twin unavailable).

Per step (``schedule()`` to ``update_from_output()`` of the same batch) it records the duration by
scheduled-token bucket and the batch composition (:class:`~chunkpilot.engine.sim.metrics.StepShape`);
per output, finer ITL and TTFT histograms than vLLM's, and per finished request finer
prompt- and generation-length histograms. Observations that fall in the same bucket are
added in one increment, so the cost per step is a few prometheus_client writes, not one per request;
the time spent here is itself exported (``chunkpilot:step_telemetry_seconds_total``).
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from chunkpilot.engine import metrics_names as names
from chunkpilot.engine.sim.metrics import StepShape
from chunkpilot.engine.sim.steptime import ForwardPass

logger = logging.getLogger("vllm.plugins.chunkpilot")

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

__all__ = ["MULTIPROC_ENV", "StepTelemetry", "step_shape", "telemetry_problem"]


def telemetry_problem(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the engine-core process cannot export metrics to ``/metrics`` (None: it can)."""
    directory = environ.get(MULTIPROC_ENV)
    if not directory:
        return f"{MULTIPROC_ENV} is not set, so the API server serves no metrics of the engine-core process"
    if not os.path.isdir(directory):
        return f"{MULTIPROC_ENV}={directory} is not a directory"
    return None


def _is_prefill(computed_before: int, request: Any) -> bool:
    prompt: int = request.num_prompt_tokens
    total: int = request.num_tokens
    return computed_before < max(prompt, total - 1)


def step_shape(output: Any, requests: Mapping[str, Any]) -> StepShape:
    """The composition of a batch vLLM just scheduled (``num_computed_tokens`` already advanced)."""
    prefill = decode = decoding = sampled = sequences = 0
    pairs = 0.0
    prefill_context = decode_context = 0
    drafts_by_request: Mapping[str, list[int]] = output.scheduled_spec_decode_tokens or {}
    for req_id, tokens in output.num_scheduled_tokens.items():
        request = requests.get(req_id)
        if request is None:
            continue
        sequences += 1
        end: int = request.num_computed_tokens
        before = end - tokens
        drafts = len(drafts_by_request.get(req_id, ()))
        if _is_prefill(before, request):
            prefill += tokens
            pairs += ForwardPass.prefill_pairs(tokens, before)
            prefill_context += end
        else:
            decode += tokens
            decoding += 1
            decode_context += end
        if end - drafts >= request.num_tokens:
            sampled += 1 + drafts
    return StepShape(
        prefill + decode,
        prefill,
        decode,
        sequences,
        decoding,
        sampled,
        pairs,
        prefill_context,
        decode_context,
    )


class _BucketedHistogram:
    """A labelled prometheus_client histogram that takes many observations of one bucket at once."""

    def __init__(self, metric: Any, buckets: tuple[float, ...]) -> None:
        self.metric = metric
        self.buckets = buckets

    @classmethod
    def create(
        cls, name: str, help_text: str, labels: list[str], buckets: tuple[float, ...], registry: Any
    ) -> _BucketedHistogram:
        """A new histogram ``name`` with ``buckets`` in ``registry``."""
        from prometheus_client import Histogram

        return cls(Histogram(name, help_text, labels, buckets=buckets, registry=registry), buckets)

    def add(self, child: Any, values: list[float]) -> None:
        counts: dict[int, int] = {}
        total = 0.0
        for value in values:
            slot = bisect.bisect_left(self.buckets, value)
            counts[slot] = counts.get(slot, 0) + 1
            total += value
        if not counts:
            return
        # prometheus_client keeps one value per bucket (non-cumulative) and the sum; incrementing
        # them directly is what observe() does, once per distinct bucket instead of per value.
        slots = getattr(child, "_buckets", None)
        if slots is None or len(slots) != len(self.buckets) + 1:
            for value in values:
                child.observe(value)
            return
        for slot, count in counts.items():
            slots[slot].inc(count)
        child._sum.inc(total)


class StepTelemetry:
    """The ``chunkpilot:*`` metrics of one engine-core process (prometheus_client, multiprocess)."""

    def __init__(
        self, model_name: str, engine: str = names.ENGINE_LABEL_VALUE, *, precreate_tokens: int = 0
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        # Private: in multiprocess mode the files are what the API server reads; tests render it.
        registry = self.registry = CollectorRegistry()
        base = [names.LABEL_MODEL_NAME, names.LABEL_ENGINE]
        self._base = {names.LABEL_MODEL_NAME: model_name, names.LABEL_ENGINE: engine}
        self._duration = Histogram(
            names.STEP_DURATION,
            "Engine step duration in seconds, by scheduled-token bucket.",
            [*base, names.LABEL_SCHEDULED_TOKENS],
            buckets=names.STEP_DURATION_BUCKETS,
            registry=registry,
        )
        self._counters = {
            field: Counter(
                metric.removesuffix("_total"),
                names.STEP_COUNTERS[metric],
                [*base, names.LABEL_SCHEDULED_TOKENS],
                registry=registry,
            )
            for field, metric in names.STEP_SHAPE_FIELDS.items()
        }
        self._itl = _BucketedHistogram.create(
            names.FINE_INTER_TOKEN_LATENCY,
            "Inter-token latency in seconds (fine buckets).",
            base,
            names.FINE_ITL_BUCKETS,
            registry,
        )
        self._ttft = _BucketedHistogram.create(
            names.FINE_TIME_TO_FIRST_TOKEN,
            "Time to first token in seconds (fine buckets).",
            base,
            names.FINE_TTFT_BUCKETS,
            registry,
        )

        def own_counter(name: str, help_text: str) -> Any:
            """This process's child of a new counter ``name`` (without prometheus_client's ``_total``)."""
            return Counter(name.removesuffix("_total"), help_text, base, registry=registry).labels(
                **self._base
            )

        self._cost = own_counter(
            names.TELEMETRY_SECONDS,
            "Seconds the Chunkpilot plugin spent recording step telemetry (its overhead).",
        )
        self._pending_cost_s = 0.0
        self._product = own_counter(
            names.REQUEST_TOKENS_PRODUCT, "Sum of prompt tokens x generated tokens over finished requests."
        )
        self._lengths = {
            name: _BucketedHistogram.create(
                name, help_text, base, names.FINE_REQUEST_TOKENS_BUCKETS, registry
            )
            for name, help_text in (
                (names.FINE_REQUEST_PROMPT_TOKENS, "Prompt tokens of finished requests (fine buckets)."),
                (
                    names.FINE_REQUEST_GENERATION_TOKENS,
                    "Generated tokens of finished requests (fine buckets).",
                ),
            )
        }
        self._length_children = {
            name: histogram.metric.labels(**self._base) for name, histogram in self._lengths.items()
        }
        self._itl_child = self._itl.metric.labels(**self._base)
        self._ttft_child = self._ttft.metric.labels(**self._base)
        self._children: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._started: dict[int, tuple[float, StepShape]] = {}
        self._last_token_s: dict[str, float] = {}
        self._arrival_s: dict[str, float] = {}
        self._prompt_tokens: dict[str, int] = {}
        self._generated: dict[str, int] = {}
        # Buckets a step can reach are exported at zero from the start, so that Prometheus'
        # increase() counts a fresh engine's first steps (a series born non-zero loses its first value).
        if precreate_tokens > 0:
            last = names.step_token_bucket(precreate_tokens)
            for bound in names.STEP_TOKEN_BUCKETS:
                self._bucket(str(bound))
                if str(bound) == last:
                    break

    def _bucket(self, label: str) -> tuple[Any, dict[str, Any]]:
        children = self._children.get(label)
        if children is None:
            labels = {**self._base, names.LABEL_SCHEDULED_TOKENS: label}
            children = (
                self._duration.labels(**labels),
                {field: counter.labels(**labels) for field, counter in self._counters.items()},
            )
            self._children[label] = children
        return children

    # -- hooks ---------------------------------------------------------------------------------
    def scheduled(self, started_s: float, output: Any, requests: Mapping[str, Any]) -> None:
        """After ``schedule()`` returned ``output``, which began at ``started_s`` (perf_counter)."""
        if not output.total_num_scheduled_tokens:
            return
        begin = time.perf_counter()
        self._started[id(output)] = (started_s, step_shape(output, requests))
        arrivals = self._arrival_s
        for req_id in output.num_scheduled_tokens:
            if req_id not in arrivals:
                request = requests.get(req_id)
                if request is not None:
                    arrivals[req_id] = float(request.arrival_time)
                    self._prompt_tokens[req_id] = int(request.num_prompt_tokens)
        self._pending_cost_s += time.perf_counter() - begin

    def finished(self, output: Any, engine_core_outputs: Any) -> None:
        """After ``update_from_output(output, ...)`` returned ``engine_core_outputs``."""
        entry = self._started.pop(id(output), None)
        if entry is None:
            return
        started, shape = entry
        begin = time.perf_counter()
        duration, children = self._bucket(names.step_token_bucket(shape.tokens))
        duration.observe(begin - started)
        for field, child in children.items():
            amount = getattr(shape, field)
            if amount:
                child.inc(amount)
        now = time.time()  # the clock of vLLM's arrival times
        itl: list[float] = []
        ttft: list[float] = []
        prompts: list[float] = []
        generations: list[float] = []
        for outputs in _core_outputs(engine_core_outputs):
            for out in outputs:
                req_id = out.request_id
                if out.new_token_ids:
                    self._generated[req_id] = self._generated.get(req_id, 0) + len(out.new_token_ids)
                    last = self._last_token_s.get(req_id)
                    if last is None:
                        arrival = self._arrival_s.get(req_id)
                        if arrival is not None:
                            ttft.append(now - arrival)
                    else:
                        itl.append(now - last)
                    self._last_token_s[req_id] = now
                if out.finish_reason is not None:
                    prompt = self._prompt_tokens.get(req_id)
                    if prompt is not None:
                        prompts.append(prompt)
                        generations.append(self._generated.get(req_id, 0))
                    self.forget((req_id,))
        self._itl.add(self._itl_child, itl)
        self._ttft.add(self._ttft_child, ttft)
        for name, values in (
            (names.FINE_REQUEST_PROMPT_TOKENS, prompts),
            (names.FINE_REQUEST_GENERATION_TOKENS, generations),
        ):
            self._lengths[name].add(self._length_children[name], values)
        if prompts:
            self._product.inc(sum(p * g for p, g in zip(prompts, generations, strict=True)))
        self._cost.inc(self._pending_cost_s + time.perf_counter() - begin)
        self._pending_cost_s = 0.0

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the state of aborted requests."""
        for req_id in request_ids:
            self._last_token_s.pop(req_id, None)
            self._arrival_s.pop(req_id, None)
            self._prompt_tokens.pop(req_id, None)
            self._generated.pop(req_id, None)


def _core_outputs(engine_core_outputs: Any) -> Iterable[Any]:
    """The ``EngineCoreOutput`` lists of ``update_from_output``'s result (one per client)."""
    if isinstance(engine_core_outputs, Mapping):
        for value in engine_core_outputs.values():
            yield getattr(value, "outputs", ())
