"""The engine argument vectors the operator renders are accepted by the real vLLM parser.

Every example in ``examples/`` is rendered with the operator's renderer and the
vector is checked by vLLM's own ``vllm serve`` parser, engine-argument
conversion and scheduler validation (:mod:`chunkpilot.engine.vllm_plugin.argcheck`),
inside the vLLM CPU environment.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chunkpilot.engine.vllm_plugin.env import EngineEnv
from chunkpilot.engine.vllm_plugin.render import SCHEDULER_CLS, PluginSettings, engine_image, plugin_args
from chunkpilot.operator.builders import render_for
from chunkpilot.operator.engines import EngineRender, render_engine
from chunkpilot.operator.engines.kvtransfer import SIM_BANDWIDTH_FLAG, SIM_LATENCY_FLAG
from chunkpilot.operator.engines.versions import EngineVersion
from chunkpilot.operator.engines.vllm import V0_REMOVED, vllm_args

from chunkpilot.api import EngineKind, InferenceService, PoolRole, options
from chunkpilot.api.options import PLUGIN_SECTION
from chunkpilot.localrun.podspec import strip_flags
from chunkpilot.testing.extra_args import ALLOWED, REFUSED
from chunkpilot.testing.processes import captured, json_through

# The first test also waits for the environment build (minutes, once) and the server start.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]


def _speaks_vllm(path: Path) -> bool:
    """vLLM and simulator examples (SGLang's and TensorRT-LLM's have their own parser tiers)."""
    kind = (yaml.safe_load(path.read_text())["spec"].get("engine") or {}).get("kind", "vllm")
    return kind in ("vllm", "sim")


EXAMPLES = [path for path in sorted((ROOT / "examples").glob("*.yaml")) if _speaks_vllm(path)]
#: Flags only the simulator takes; the rest of its vector is vLLM's.
SIM_ONLY_FLAGS = ("--gpu", SIM_BANDWIDTH_FLAG, SIM_LATENCY_FLAG)


def pool_vectors() -> dict[str, list[str]]:
    """The vLLM vector of each pool of every disaggregated example, named ``<file>#<role>``."""
    vectors: dict[str, list[str]] = {}
    for path in EXAMPLES:
        service = InferenceService.from_manifest(yaml.safe_load(path.read_text()))
        if not service.spec.disaggregated:
            continue
        for role in PoolRole:
            args = list(render_for(service, role=role).args)
            vectors[f"{path.name}#{role.value}"] = (
                args if service.spec.engine.kind == EngineKind.VLLM else strip_flags(args, SIM_ONLY_FLAGS)
            )
    return vectors


POOLS = pool_vectors()


def check(env: EngineEnv, vectors: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Run vLLM's parser over ``vectors`` in the engine environment."""
    results: dict[str, dict[str, Any]] = json_through(
        [str(env.python), "-m", "chunkpilot.engine.vllm_plugin.argcheck"], vectors
    )
    return results


def rendered_vectors() -> tuple[dict[str, list[str]], dict[str, EngineVersion]]:
    """The vLLM argument vector of every example (for the simulator: its vLLM part)."""
    vectors: dict[str, list[str]] = {}
    versions: dict[str, EngineVersion] = {}
    for path in EXAMPLES:
        service = InferenceService.from_manifest(yaml.safe_load(path.read_text()))
        spec = service.spec
        rendered = render_engine(spec)
        assert isinstance(rendered, EngineRender), f"{path.name}: {rendered}"
        version = EngineVersion.parse(spec.engine.version)
        if spec.engine.kind == EngineKind.VLLM:
            assert rendered.command == ["vllm", "serve"]
            vectors[path.name] = list(rendered.args)
        else:
            # The simulator takes the same vLLM vector followed by its own flags.
            vectors[path.name] = vllm_args(spec, version)
            assert (
                rendered.args[: len(vectors[path.name]) - len(spec.engine.extra_args)]
                == (vectors[path.name][: len(vectors[path.name]) - len(spec.engine.extra_args)])
            )
        versions[path.name] = version
    return vectors, versions


@pytest.fixture(scope="module")
def results(vllm_env: EngineEnv) -> dict[str, dict[str, Any]]:
    vectors, _ = rendered_vectors()
    vectors.update(POOLS)
    # The operator's rendering for partial-prefill limits on a V1 release with the engine image.
    manifest = yaml.safe_load((ROOT / "examples" / "llama-70b-vllm.yaml").read_text())
    manifest["spec"]["engine"].update(
        {"maxNumPartialPrefills": 4, "maxLongPartialPrefills": 1, "image": engine_image("0.33.0")}
    )
    rendered = render_engine(InferenceService.from_manifest(manifest).spec)
    assert isinstance(rendered, EngineRender), rendered
    vectors["operator-partial-prefill-plugin"] = list(rendered.args)
    # A team's own image with the plugin installed, declared in the spec: rendered the same way.
    manifest["spec"]["engine"].update({"image": "registry.internal/ml/vllm:custom", "pluginInstalled": True})
    own = render_engine(InferenceService.from_manifest(manifest).spec)
    assert isinstance(own, EngineRender), own
    vectors["own-image-with-plugin"] = list(own.args)
    settings = PluginSettings(max_num_partial_prefills=4, max_long_partial_prefills=1, live_adjust=True)
    vectors["plugin-partial-prefill"] = [
        "org/model",
        "--max-num-batched-tokens",
        "2048",
        *plugin_args(settings),
    ]
    vectors["bad-budget-below-max-num-seqs"] = [
        "org/model",
        "--max-num-batched-tokens",
        "64",
        "--max-num-seqs",
        "256",
    ]
    vectors["bad-unknown-flag"] = ["org/model", "--max-num-partial-prefill", "2"]
    vectors["bad-plugin-config"] = [
        "org/model", "--scheduler-cls", SCHEDULER_CLS, "--additional-config", '{"chunkpilot": {"lanes": 2}}'
    ]  # fmt: skip
    return check(vllm_env, vectors)


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("name", [p.name for p in EXAMPLES])
def test_example_argv_is_accepted_by_vllm(results: dict[str, dict[str, Any]], name: str) -> None:
    _, versions = rendered_vectors()
    result = results[name]
    if versions[name] < V0_REMOVED:
        # Rendered for a V0 release: its partial-prefill flags are gone from the V1 parser,
        # which is why the renderer is version-aware (and the plugin exists).
        assert not result["ok"]
        assert "--max-num-partial-prefills" in json.dumps(result["error"])
    else:
        assert result["ok"], result


def test_disaggregated_examples_are_found() -> None:
    assert any(name.startswith("disaggregated-llama-70b-vllm.yaml#") for name in POOLS)
    assert any(name.startswith("disaggregated-sim.yaml#") for name in POOLS)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool_argv_is_accepted_by_vllm(results: dict[str, dict[str, Any]], name: str) -> None:
    file, _, role = name.partition("#")
    service = InferenceService.from_manifest(yaml.safe_load((ROOT / "examples" / file).read_text()))
    result = results[name]
    assert result["ok"], result
    config = service.spec.pool_config(role)
    assert (result["max_num_batched_tokens"], result["max_num_seqs"]) == (
        config.max_num_batched_tokens,
        config.max_num_seqs,
    )


def test_pools_select_a_kv_connector_vllm_registers(vllm_env: EngineEnv) -> None:
    """vLLM's parser reads the pools' --kv-transfer-config, and its factory knows the connector."""
    script = """
import json, sys
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = {}
for name, argv in json.load(sys.stdin).items():
    namespace = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    config = AsyncEngineArgs.from_cli_args(namespace).kv_transfer_config
    out[name] = [config.kv_connector, config.kv_role, config.is_kv_producer, config.is_kv_consumer,
                 config.kv_connector in KVConnectorFactory._registry]
print(json.dumps(out))
"""
    proc = captured([str(vllm_env.python), "-c", script], input=json.dumps(POOLS), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == {name: ["NixlConnector", "kv_both", True, True, True] for name in POOLS}


@pytest.mark.parametrize(
    "name", ["plugin-partial-prefill", "operator-partial-prefill-plugin", "own-image-with-plugin"]
)
def test_plugin_arguments_select_the_chunkpilot_scheduler(
    results: dict[str, dict[str, Any]], name: str
) -> None:
    result = results[name]
    assert result["ok"], result
    assert result["scheduler_cls"] == SCHEDULER_CLS
    assert result["plugin"] == {"max_num_partial_prefills": 4, "max_long_partial_prefills": 1}


@pytest.mark.parametrize(
    ("name", "stage", "fragment"),
    [
        ("bad-budget-below-max-num-seqs", "engine-args", "max_num_batched_tokens"),
        ("bad-unknown-flag", "parse", "--max-num-partial-prefill"),
        ("bad-plugin-config", "plugin", "unknown chunkpilot key(s) ['lanes']"),
    ],
)
def test_the_check_rejects_bad_vectors(
    results: dict[str, dict[str, Any]], name: str, stage: str, fragment: str
) -> None:
    result = results[name]
    assert not result["ok"]
    assert result["stage"] == stage
    assert fragment in json.dumps(result["error"]), result


def test_one_scheduler_class_serves_both_scheduling_modes(vllm_env: EngineEnv) -> None:
    # The CPU platform turns async scheduling off, so the dispatch is checked directly.
    script = """
from types import SimpleNamespace as NS
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from chunkpilot.engine.vllm_plugin.scheduler import ChunkpilotAsyncScheduler, ChunkpilotScheduler
new = ChunkpilotScheduler.__new__
on = new(ChunkpilotScheduler, vllm_config=NS(scheduler_config=NS(async_scheduling=True)))
off = new(ChunkpilotScheduler, NS(scheduler_config=NS(async_scheduling=False)))
print(type(on).__name__, isinstance(on, AsyncScheduler), type(off).__name__, isinstance(off, AsyncScheduler))
"""
    proc = subprocess.run(
        [str(vllm_env.python), "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ChunkpilotAsyncScheduler", "True", "ChunkpilotScheduler", "False"]


# --------------------------------------------------------------------------- extraArgs


def _dest(option: str) -> str:
    """argparse's destination of ``option`` (of a JSON sub-option: its option's)."""
    return option.lstrip("-").partition(".")[0].replace("-", "_")


_BASE = ["org/model", "--max-num-batched-tokens", "2048", "--max-num-seqs", "64", "--port", "8000"]


@pytest.fixture(scope="module")
def extra_args_results(vllm_env: EngineEnv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = tmp_path_factory.mktemp("extra-args") / "engine.yaml"
    # The command line wins over the file; the file sets what the command line does not.
    config.write_text("max_num_scheduled_tokens: 4096\n")
    vectors = {"base": _BASE, "allowed": [*_BASE, *ALLOWED["vllm"]]}
    for index, (tokens, _) in enumerate(REFUSED["vllm"]):
        vectors[f"refused-{index}"] = [*_BASE, *(str(config) if t == "engine.yaml" else t for t in tokens)]
    return check(vllm_env, vectors)


def _changed(results: dict[str, Any], name: str) -> set[str]:
    base = results["base"]["namespace"]
    assert "namespace" in results[name], results[name]
    return {dest for dest, value in results[name]["namespace"].items() if base.get(dest) != value}


GUARDED_DESTS = {_dest(option) for option in options.guarded("vllm")}


@pytest.mark.parametrize("index", range(len(REFUSED["vllm"])), ids=lambda i: " ".join(REFUSED["vllm"][i][0]))
def test_each_refused_variant_is_read_by_vllm_as_a_managed_option(
    extra_args_results: dict[str, Any], index: int
) -> None:
    tokens, said = REFUSED["vllm"][index]
    result = extra_args_results[f"refused-{index}"]
    assert options.extra_args_problems("vllm", tokens)
    if said == "ambiguous":
        assert not result["ok"] and "ambiguous" in json.dumps(result["error"]), result
    elif PLUGIN_SECTION in said:
        assert PLUGIN_SECTION in json.dumps(result["namespace"]["additional_config"]), result
    else:
        assert _changed(extra_args_results, f"refused-{index}") & GUARDED_DESTS, result


def test_the_allowed_variants_leave_every_managed_option_alone(extra_args_results: dict[str, Any]) -> None:
    changed = _changed(extra_args_results, "allowed")
    assert {"seed", "enforce_eager", "dtype", "max_num_queued_reqs"} <= changed
    assert not changed & GUARDED_DESTS, changed & GUARDED_DESTS
    assert options.extra_args_problems("vllm", ALLOWED["vllm"]) == []
