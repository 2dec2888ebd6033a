"""``chunkpilot twin work``: rank on the twin from a request file (what a twin Job runs).

It reads a ``RankingRequest`` (:mod:`chunkpilot.tuner.twin.wire`), ranks as the operator would and
writes the ``RankingResult`` to a file (``--out``) and/or to the result ConfigMap of its Job
(``--result-configmap``, owned by the Job named in ``CHUNKPILOT_TWIN_JOB_NAME`` /
``CHUNKPILOT_TWIN_JOB_UID``). Exit status: 0 done (also when the result already exists), 1 the
ranking or the write failed (the Job retries), 2 the request is unusable (retrying cannot help, but
the Job cannot tell; the operator reads the message).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from chunkpilot.tuner.twin import jobs
from chunkpilot.tuner.twin.wire import WireError, decode_request, encode_result, rank


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``twin`` and its ``work`` sub-command."""
    parser = subparsers.add_parser("twin", help="the service twin's work outside the operator")
    commands = parser.add_subparsers(dest="twin_command", metavar="SUBCOMMAND", required=True)
    work = commands.add_parser(
        "work", help="rank configurations on the twin from a request file (what a twin Job runs)"
    )
    work.add_argument("--request", type=Path, required=True, help="the RankingRequest JSON")
    work.add_argument("--out", type=Path, help="write the RankingResult JSON here")
    work.add_argument(
        "--result-configmap", help="create this ConfigMap with the result (owned by the Job it runs in)"
    )
    work.add_argument("--namespace", help="the ConfigMap's namespace (default: the pod's own)")
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
    if args.result_configmap:
        return _publish(args, text)
    return 0


def _publish(args: argparse.Namespace, text: str) -> int:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    job, uid = os.environ.get(jobs.ENV_JOB_NAME, ""), os.environ.get(jobs.ENV_JOB_UID, "")
    if not job or not uid:
        _say(f"{jobs.ENV_JOB_NAME} and {jobs.ENV_JOB_UID} name the Job that owns the result; set both")
        return 2
    api_client: Any = None
    if args.kubeconfig:
        api_client = config.new_client_from_config(config_file=str(args.kubeconfig))  # type: ignore[no-untyped-call]  # untyped in the client
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]  # untyped in the client
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]  # untyped in the client
    namespace = args.namespace or _pod_namespace()
    body = jobs.build_result_configmap(job, namespace, uid, text)
    body["metadata"]["name"] = args.result_configmap
    try:
        client.CoreV1Api(api_client).create_namespaced_config_map(namespace, body)  # type: ignore[arg-type]  # a dict body is accepted
    except ApiException as error:
        if error.status == 409:
            _say(f"ConfigMap {namespace}/{args.result_configmap} already holds a result; kept")
            return 0
        _say(f"cannot create ConfigMap {namespace}/{args.result_configmap}: {error.status} {error.reason}")
        return 1
    _say(f"created ConfigMap {namespace}/{args.result_configmap}")
    return 0


def _pod_namespace() -> str:
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    except OSError:
        return "default"
