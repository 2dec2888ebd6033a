"""Prometheus in the tests: exposition text as the fake engines serve it on ``/metrics``, and queries."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from chunkpilot.devcluster.ports import LOOPBACK
from chunkpilot.devcluster.prometheus import PrometheusServer
from chunkpilot.engine.metrics_names import (
    FINE_INTER_TOKEN_LATENCY,
    FINE_ITL_BUCKETS,
    FINE_TIME_TO_FIRST_TOKEN,
    FINE_TTFT_BUCKETS,
    INTER_TOKEN_LATENCY,
    ITL_BUCKETS,
    TIME_TO_FIRST_TOKEN,
    TTFT_BUCKETS,
    tuner_metrics,
)


def histogram_lines(family: str, les: Iterable[str], value: float, count: float) -> list[str]:
    """The exposition lines of histogram ``family`` after ``count`` observations, every one ``value``.

    ``les`` are its buckets' upper bounds as written (``+Inf`` last).
    """
    lines = [f"# TYPE {family} histogram"]
    lines += [f'{family}_bucket{{le="{le}"}} {count if float(le) >= value else 0.0}' for le in les]
    return [*lines, f"{family}_count {count}", f"{family}_sum {count * value}"]


def query_value(prometheus: PrometheusServer, promql: str) -> float:
    """The first sample of an instant query; 0 while the query has no result."""
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if result else 0.0


class ExpositionServer:
    """A real HTTP /metrics server for Prometheus to scrape: ``render(path, elapsed_s)`` is the text
    of one scrape path (None: 404)."""

    def __init__(self, render: Callable[[str, float], str | None]) -> None:
        start = time.monotonic()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                text = render(self.path, time.monotonic() - start)
                if text is None:
                    self.send_error(404)
                    return
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.address = f"{LOOPBACK}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


class LatencyExporter(ExpositionServer):
    """Two scrape paths of engines whose every token takes 27 ms and every first token 290 ms:
    ``/plugin`` exports vLLM's histograms and Chunkpilot's fine ones, ``/stock`` vLLM's only."""

    ITL_S: Final = 0.027
    TTFT_S: Final = 0.29
    TOKENS_PER_S: Final = 100.0
    REQUESTS_PER_S: Final = 5.0

    def __init__(self) -> None:
        own = (
            (INTER_TOKEN_LATENCY, ITL_BUCKETS, self.ITL_S, self.TOKENS_PER_S),
            (TIME_TO_FIRST_TOKEN, TTFT_BUCKETS, self.TTFT_S, self.REQUESTS_PER_S),
        )
        fine = (
            (FINE_INTER_TOKEN_LATENCY, FINE_ITL_BUCKETS, self.ITL_S, self.TOKENS_PER_S),
            (FINE_TIME_TO_FIRST_TOKEN, FINE_TTFT_BUCKETS, self.TTFT_S, self.REQUESTS_PER_S),
        )
        paths = {"/plugin": own + fine, "/stock": own}
        requests_per_s = self.REQUESTS_PER_S

        def render(path: str, elapsed: float) -> str | None:
            if path not in paths:
                return None
            success = tuner_metrics("vllm").request_success
            lines = [f"# TYPE {success} counter", f"{success} {requests_per_s * elapsed}"]
            for family, buckets, value, rate in paths[path]:
                lines += histogram_lines(
                    family, (*(f"{b:g}" for b in buckets), "+Inf"), value, rate * elapsed
                )
            return "\n".join(lines) + "\n"

        super().__init__(render)
