"""``chunkpilot twin work``: rank on the twin from a request file (what a twin Job runs).

It reads a ``RankingRequest`` (:mod:`chunkpilot.tuner.twin.wire`), ranks as the operator would and
writes the ``RankingResult`` to a file (``--out``) and/or into an annotation of its Job
(``--result-job``, which the operator reads). Exit status: 0 done, 1 the ranking or the write
failed (the Job retries), 2 the request is unusable (retrying cannot help; the message says why).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from chunkpilot.tuner.twin import jobs
from chunkpilot.tuner.twin.wire import WireError, decode_request, encode_result, rank

#: Tries of the result's write, :data:`PUBLISH_RETRY_S` apart.
PUBLISH_ATTEMPTS = 5
PUBLISH_RETRY_S = 2.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``twin`` and its ``work`` sub-command."""
    parser = subparsers.add_parser(
        "twin", help="the service twin's work outside the operator (what a twin Job runs)"
    )
    commands = parser.add_subparsers(dest="twin_command", metavar="SUBCOMMAND", required=True)
    work = commands.add_parser(
        "work", help="rank configurations on the twin from a request file (what a twin Job runs)"
    )
    work.add_argument("--request", type=Path, required=True, help="the RankingRequest JSON")
    work.add_argument("--out", type=Path, help="write the RankingResult JSON here")
    work.add_argument("--result-job", help="write the result into this Job's annotation (the Job it runs in)")
    work.add_argument("--namespace", help="the Job's namespace (default: the pod's own)")
    work.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, else ~/.kube/config)")
    work.set_defaults(func=_work)


def _say(message: str) -> None:
    print(f"chunkpilot twin work: {message}", file=sys.stderr, flush=True)


def _work(args: argparse.Namespace) -> int:
    try:
        request = decode_request(args.request.read_bytes())
    except OSError as error:
        _say(f"cannot read the request: {error}")
        return 2
    except WireError as error:
        _say(f"{args.request}: {error}")
        return 2
    _say(
        f"ranking twin {request.key}: up to {request.cpu_budget_s:.0f} CPU-s"
        + (f", {request.max_evaluations} evaluations" if request.max_evaluations else "")
    )
    started = time.process_time()
    result = rank(request)
    _say(
        f"ranked {len(result.ranked)} configurations in {result.evaluations} evaluations, "
        f"{time.process_time() - started:.1f} CPU-s, {result.wall_seconds:.1f} s"
    )
    text = encode_result(result)
    if args.out:
        args.out.write_text(text)
        _say(f"wrote {args.out}")
    if args.result_job:
        return _publish(args, text)
    return 0


def _publish(args: argparse.Namespace, text: str) -> int:
    """Patch the result into the Job's annotation; a refusal is retried briefly (the Job's Role is
    created just after the Job, so a quick first pod may be early)."""
    from chunkpilot.engine.probe.kube import api_client, in_cluster_namespace
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    namespace = args.namespace or in_cluster_namespace()
    api = client.BatchV1Api(api_client(args.kubeconfig))
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            api.patch_namespaced_job(args.result_job, namespace, jobs.result_patch(text))
        except ApiException as error:
            if error.status in (401, 403) and attempt + 1 < PUBLISH_ATTEMPTS:
                time.sleep(PUBLISH_RETRY_S)
                continue
            where = f"Job {namespace}/{args.result_job}"
            _say(f"cannot write the result into {where}: {error.status} {error.reason}")
            return 1
        break
    _say(f"wrote the result into Job {namespace}/{args.result_job}")
    return 0
