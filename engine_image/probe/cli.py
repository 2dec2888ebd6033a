"""``chunkpilot probe``: measure a step-time profile, publish it to a ConfigMap, or report on one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chunkpilot.engine.probe.fit import RooflineFit, first_tokens_where
from chunkpilot.engine.probe.profile import (
    EfficiencyFit,
    ProfileError,
    StepProfile,
    load_profile,
    save_profile,
)
from chunkpilot.engine.probe.roofline import ModelShapeError, linear_cost
from chunkpilot.engine.probe.runner import DEFAULT_TOKENS, DTYPE_BYTES, ProbeRequest, ProbeRequestError
from chunkpilot.engine.sim.profiles.loader import ProfileError as SimProfileError
from chunkpilot.engine.sim.profiles.loader import load_accelerator

__all__ = ["register"]


def _token_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,2,4,8, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive integers, got {text!r}")
    return values


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``probe`` (and its ``publish`` and ``report`` sub-commands)."""
    parser = subparsers.add_parser(
        "probe",
        help="measure the accelerator's step-time curve for a model and fit the roofline",
        description=(
            "Time one layer shard's projections (QKV, O, gated MLP) and attention (prefill with context, "
            "decode against a KV cache) over token counts, fit compute/bandwidth efficiencies and a fixed "
            "overhead, and write a step profile for the simulator (--step-profile) and the tuner."
        ),
    )
    parser.add_argument(
        "--model", help="built-in model profile (llama-3.1-8b), a Hugging Face id alias, or a config.json"
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="probe one shard of this TP split"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *DTYPE_BYTES),
        help="auto: bfloat16 on cuda, float32 on cpu",
    )
    parser.add_argument(
        "--tokens",
        type=_token_list,
        default=DEFAULT_TOKENS,
        help="comma-separated token counts (default 1,2,4,...,16384)",
    )
    parser.add_argument(
        "--itl-target-ms", type=float, help="record the largest token budget meeting this ITL"
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=2048,
        help="cached tokens before each prefill chunk, and KV length of each decode sequence (default 2048)",
    )
    parser.add_argument(
        "--max-decode-sequences",
        type=int,
        default=512,
        help="time decode attention for token counts up to this many sequences (default 512)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls before timing (default 3)")
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed repeats; the median is kept (default 7)"
    )
    parser.add_argument(
        "--min-repeat-ms", type=float, default=2.0, help="loop short calls to last this long per repeat"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: torch's choice; 1 is steadiest on a busy host)",
    )
    parser.add_argument(
        "--accelerator", help="accelerator name recorded in the profile (default: detected; cpu on the CPU)"
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="peak FLOP/s (in TFLOP/s) the efficiencies are relative to"
    )
    parser.add_argument(
        "--peak-bandwidth-gbs", type=float, help="peak memory bandwidth in GB/s (with --peak-tflops)"
    )
    parser.add_argument(
        "--measure-peaks",
        action="store_true",
        help="on cuda, measure peaks with a GEMM and a copy instead of using the datasheet",
    )
    parser.add_argument("--out", type=Path, help="where to write the profile JSON")
    parser.set_defaults(func=_run)

    commands = parser.add_subparsers(dest="probe_command", metavar="SUBCOMMAND")
    publish = commands.add_parser("publish", help="store a profile in a ConfigMap (used by the probe Job)")
    publish.add_argument(
        "--file", type=Path, default=Path("/profile/profile.json"), help="profile JSON to publish"
    )
    publish.add_argument(
        "--configmap", required=True, help="ConfigMap name (chunkpilot-profile-<accelerator>-<model>-tp<N>)"
    )
    publish.add_argument("--namespace", help="namespace (default: the pod's own, else default)")
    publish.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, else ~/.kube/config)"
    )
    publish.set_defaults(func=_publish)

    report = commands.add_parser(
        "report", help="compare a profile's measurements with the fitted and datasheet rooflines"
    )
    report.add_argument("file", type=Path, help="profile JSON")
    report.add_argument(
        "--accelerator", help="datasheet to compare with (default: the profile's accelerator)"
    )
    report.add_argument(
        "--itl-target-ms",
        type=float,
        action="append",
        default=[],
        help="print the feasible budget (repeatable)",
    )
    report.set_defaults(func=_report)

    torch_env = commands.add_parser(
        "torch-env",
        help="install torch for CPU runs into a cache (not the project environment); print its path",
        description=(
            "Install the probe extra's torch once under ~/.cache/chunkpilot/torch (override with "
            "CHUNKPILOT_CACHE_DIR) and print the directory to put first on PYTHONPATH, e.g. "
            "PYTHONPATH=$(chunkpilot probe torch-env) chunkpilot probe --model llama-3.1-8b --out p.json"
        ),
    )
    torch_env.set_defaults(func=_torch_env)


def _run(args: argparse.Namespace) -> int:
    if args.model is None or args.out is None:
        print(
            "chunkpilot probe: --model and --out are required (e.g. --model llama-3.1-8b --out profile.json)",
            file=sys.stderr,
        )
        return 2
    request = ProbeRequest(
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        device=args.device,
        dtype=args.dtype,
        tokens=args.tokens,
        itl_target_ms=args.itl_target_ms,
        context_tokens=args.context_tokens,
        max_decode_sequences=args.max_decode_sequences,
        warmup=args.warmup,
        repeats=args.repeats,
        min_repeat_ms=args.min_repeat_ms,
        accelerator=args.accelerator,
        peak_tflops=args.peak_tflops,
        peak_bandwidth_gbs=args.peak_bandwidth_gbs,
        measure_peaks=args.measure_peaks,
        threads=args.threads,
    )
    from chunkpilot.engine.probe.fit import FitError
    from chunkpilot.engine.probe.runner import run_probe

    try:
        profile = run_probe(request, _progress)
    except (ProbeRequestError, ModelShapeError, SimProfileError, FitError) as exc:
        print(f"chunkpilot probe: {exc}", file=sys.stderr)
        return 2
    path = save_profile(profile, args.out)
    _progress(f"wrote {path}")
    print(format_report(profile))
    return 0


def _torch_env(_args: argparse.Namespace) -> int:
    from chunkpilot.engine.probe.torchenv import TorchEnvError, ensure_torch

    try:
        path = ensure_torch(_progress)
    except TorchEnvError as exc:
        print(f"chunkpilot probe torch-env: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _load_or_say(path: Path, command: str) -> StepProfile | None:
    """The profile at ``path``, or None after saying on stderr why it cannot be read."""
    try:
        return load_profile(path)
    except ProfileError as exc:
        print(f"chunkpilot probe {command}: {exc}", file=sys.stderr)
        return None


def _publish(args: argparse.Namespace) -> int:
    from chunkpilot.engine.probe.kube import api_client, in_cluster_namespace, publish_profile
    from kubernetes import client

    profile = _load_or_say(args.file, "publish")
    if profile is None:
        return 2
    namespace = args.namespace or in_cluster_namespace()
    outcome = publish_profile(
        profile, args.configmap, namespace, client.CoreV1Api(api_client(args.kubeconfig))
    )
    _progress(f"{outcome} ConfigMap {namespace}/{args.configmap}")
    return 0


def _datasheet_fit(profile: StepProfile, accelerator: str | None) -> RooflineFit | None:
    """The plain datasheet roofline (efficiency 1, no overhead) of the named or recorded accelerator."""
    name = accelerator or profile.accelerator
    try:
        sheet = load_accelerator(name)
    except SimProfileError:
        return None
    return RooflineFit(sheet.peak_flops, sheet.hbm_bytes_per_s, 1.0, 1.0, 0.0, 0.0, 0, 0)


def _datasheet_knee_note(profile: StepProfile, sheet: RooflineFit | None) -> str:
    """`` (datasheet roofline: N tokens)``: where the plain datasheet roofline turns compute-bound."""
    if sheet is None:
        return ""
    linears = profile.shard.linears

    def compute_bound(tokens: int) -> bool:
        return sheet.is_compute_bound(*linear_cost(linears, tokens, profile.dtype_bytes))

    return f" (datasheet roofline: {first_tokens_where(compute_bound, 1 << 20)} tokens)"


def _fit_line(label: str, fit: EfficiencyFit) -> str:
    return (
        f"{label}: e_c={fit.compute_efficiency:.3f} e_b={fit.bandwidth_efficiency:.3f} "
        f"overhead={fit.overhead_ms:.4g} ms rms={fit.rms_relative_error:.1%} "
        f"({fit.bandwidth_bound_points} bandwidth-bound, {fit.compute_bound_points} compute-bound points)"
    )


def format_report(
    profile: StepProfile, accelerator: str | None = None, itl_targets: tuple[float, ...] = ()
) -> str:
    """A plain-text table: measured vs fitted vs datasheet roofline per token count (one layer, one shard)."""
    fit = profile.linear_fit.to_fit(profile.peaks)
    sheet = _datasheet_fit(profile, accelerator)
    peaks = profile.peaks
    lines = [
        f"{profile.model} tp={profile.tensor_parallel_size} {profile.dtype} "
        f"on {profile.device_name or profile.accelerator} [{profile.accelerator}]",
        f"peaks {peaks.flops_per_s / 1e12:.4g} TFLOP/s, {peaks.bandwidth_bytes_per_s / 1e9:.4g} GB/s "
        f"({peaks.source.value})",
        _fit_line("linear fit", profile.linear_fit),
        _fit_line("attention fit", profile.attention_fit),
        f"knee: {profile.knee_tokens} tokens" + _datasheet_knee_note(profile, sheet),
        "",
        "linear layers, ms per layer (error = model / measured - 1)",
        f"{'tokens':>7} {'measured':>10} {'fitted':>10} {'err':>7} {'datasheet':>10} {'err':>7}",
    ]
    for p in profile.points:
        fitted = fit.predict_ms(p.linear_flops, p.linear_bytes)
        row = f"{p.tokens:>7} {p.linear_ms:>10.4g} {fitted:>10.4g} {fitted / p.linear_ms - 1:>+7.1%}"
        if sheet is not None:
            roof = sheet.predict_ms(p.linear_flops, p.linear_bytes)
            row += f" {roof:>10.4g} {roof / p.linear_ms - 1:>+7.1%}"
        lines.append(row)
    if sheet is None:
        lines.append(
            f"(no datasheet for accelerator {accelerator or profile.accelerator!r}; pass --accelerator)"
        )
    targets = itl_targets or ((profile.itl_target_ms,) if profile.itl_target_ms is not None else ())
    for target in targets:
        lines.append(f"ITL target {target:g} ms: feasible token budget {profile.itl_feasible_budget(target)}")
    return "\n".join(lines)


def _report(args: argparse.Namespace) -> int:
    profile = _load_or_say(args.file, "report")
    if profile is None:
        return 2
    print(format_report(profile, args.accelerator, tuple(args.itl_target_ms)))
    return 0
