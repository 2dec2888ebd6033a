"""Prometheus in the tests: exposition text as the fake engines serve it on ``/metrics``, and queries."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from chunkpilot.devcluster.ports import LOOPBACK
from chunkpilot.devcluster.prometheus import PrometheusServer


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
