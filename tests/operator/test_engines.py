"""Engine renderers: version-aware vLLM flags, refused knobs, simulator flags."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from chunkpilot.operator.engines import (
    EngineRender,
    EngineVersion,
    UnsupportedEngineVersion,
    UnsupportedKnob,
    default_image,
    honours_partial_prefills,
    render_engine,
)
from chunkpilot.operator.engines.common import TERMINATION_GRACE_MARGIN_S
from chunkpilot.operator.engines.vllm import KNOB_RULES

from chunkpilot.api import InferenceServiceSpec
from chunkpilot.api.engines import image_path, image_repository, with_registry
from chunkpilot.api.knobs import KNOBS, VLLM, KnobSpec
from chunkpilot.testing.argv import flag as flag_value


def spec(**engine: Any) -> InferenceServiceSpec:
    model = engine.pop("model", {"name": "meta-llama/Llama-3.1-8B-Instruct"})
    return InferenceServiceSpec.model_validate({"model": model, "engine": engine})


def rendered(**engine: Any) -> EngineRender:
    result = render_engine(spec(**engine))
    assert isinstance(result, EngineRender), result
    return result


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.33.0", (0, 33, 0)), ("v0.8.5", (0, 8, 5)), ("0.10", (0, 10, 0)), ("0.8.5.post1", (0, 8, 5))],
)
def test_version_parsing(text: str, expected: tuple[int, int, int]) -> None:
    assert EngineVersion.parse(text) == EngineVersion(*expected)


def test_version_ordering_is_numeric() -> None:
    assert EngineVersion.parse("0.10.0") > EngineVersion.parse("0.9.2")


UPSTREAM_0_33 = "vllm/vllm-openai:v0.33.0"
ENGINE_IMAGE_0_33 = "ghcr.io/chunkpilot/engine-vllm:vllm-v0.33.0"


@pytest.mark.parametrize("knob", ["maxNumPartialPrefills", "maxLongPartialPrefills"])
def test_partial_prefill_knobs_are_refused_on_the_upstream_vllm_0_33_image(knob: str) -> None:
    engine: dict[str, Any] = {"version": "0.33.0", "image": UPSTREAM_0_33, "maxNumPartialPrefills": 2}
    if knob == "maxLongPartialPrefills":
        engine["maxLongPartialPrefills"] = 1
    result = render_engine(spec(**engine))
    assert isinstance(result, UnsupportedKnob)
    assert result.reason == "UnsupportedKnob"
    assert "0.33.0" in result.message
    assert "spec.engine.maxNumPartialPrefills" in result.message
    assert "--max-num-partial-prefills" in result.message
    # The remedy names the fix: the Chunkpilot engine image (the default for this release).
    assert f"clear spec.engine.image or set it to {ENGINE_IMAGE_0_33}" in result.message


def test_partial_prefill_knobs_use_the_plugin_of_the_default_vllm_0_33_image() -> None:
    result = rendered(version="0.33.0", maxNumPartialPrefills=4, maxLongPartialPrefills=1)
    assert result.image == ENGINE_IMAGE_0_33
    assert flag_value(result.args, "--scheduler-cls").startswith("chunkpilot.engine.vllm_plugin.")
    assert json.loads(flag_value(result.args, "--additional-config")) == {
        "chunkpilot": {"max_num_partial_prefills": 4, "max_long_partial_prefills": 1}
    }
    assert "--max-num-partial-prefills" not in result.args
    assert not any(item["name"] == "VLLM_USE_V1" for item in result.env)


@pytest.mark.parametrize(
    "image",
    [
        ENGINE_IMAGE_0_33,
        f"{ENGINE_IMAGE_0_33}@sha256:{'a' * 64}",  # tag and digest
        f"{ENGINE_IMAGE_0_33.rpartition(':')[0]}@sha256:{'b' * 64}",  # digest only
        f"{ENGINE_IMAGE_0_33.rpartition(':')[0]}:my-build",  # another tag of the same repository
    ],
)
def test_the_engine_image_is_recognised_by_its_repository_whatever_the_tag_or_digest(image: str) -> None:
    result = rendered(version="0.33.0", image=image, maxNumPartialPrefills=4)
    assert isinstance(result, EngineRender), result
    assert flag_value(result.args, "--scheduler-cls").startswith("chunkpilot.engine.vllm_plugin.")


@pytest.mark.parametrize(
    ("reference", "repository"),
    [
        ("vllm/vllm-openai:v0.33.0", "vllm/vllm-openai"),
        ("registry.local:5000/org/engine", "registry.local:5000/org/engine"),
        ("registry.local:5000/org/engine:v1@sha256:" + "c" * 64, "registry.local:5000/org/engine"),
        ("engine@sha256:" + "d" * 64, "engine"),
    ],
)
def test_image_repository_drops_tag_and_digest_but_not_a_registry_port(
    reference: str, repository: str
) -> None:
    assert image_repository(reference) == repository


@pytest.mark.parametrize(
    ("reference", "path", "mirrored"),
    [
        ("vllm/vllm-openai:v0.33.0", "vllm/vllm-openai", "mirror.local:5000/vllm/vllm-openai:v0.33.0"),
        (
            "ghcr.io/chunkpilot/engine-vllm:vllm-v0.33.0",
            "chunkpilot/engine-vllm",
            "mirror.local:5000/chunkpilot/engine-vllm:vllm-v0.33.0",
        ),
        (
            "localhost/org/engine@sha256:" + "e" * 64,
            "org/engine",
            "mirror.local:5000/org/engine@sha256:" + "e" * 64,
        ),
        (
            "nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
            "nvidia/tensorrt-llm/release",
            "mirror.local:5000/nvidia/tensorrt-llm/release:1.2.1",
        ),
    ],
)
def test_a_mirror_keeps_an_images_path_and_tag(reference: str, path: str, mirrored: str) -> None:
    assert image_path(reference) == path
    assert with_registry(reference, "mirror.local:5000/") == mirrored
    assert image_path(mirrored) == path
    assert with_registry(reference, None) == reference


def test_partial_prefill_knobs_on_a_v1_release_without_an_engine_image_name_the_version_fix() -> None:
    result = render_engine(spec(version="0.32.0", maxNumPartialPrefills=2))
    assert isinstance(result, UnsupportedKnob)
    assert "set spec.engine.version to 0.33.0" in result.message
    assert ENGINE_IMAGE_0_33 in result.message


def test_partial_prefill_knobs_render_on_vllm_0_8_with_the_v0_scheduler() -> None:
    result = rendered(version="0.8.5", maxNumPartialPrefills=4, maxLongPartialPrefills=2)
    assert flag_value(result.args, "--max-num-partial-prefills") == "4"
    assert flag_value(result.args, "--max-long-partial-prefills") == "2"
    assert {"name": "VLLM_USE_V1", "value": "0"} in result.env
    assert "--shutdown-timeout" not in result.args  # not a flag of that release


@pytest.mark.parametrize(
    ("engine", "knob"),
    [
        ({"maxNumActiveSeqs": 8}, "spec.engine.maxNumActiveSeqs"),
        ({"longPrefillTokenThresholdAdaptive": True}, "spec.engine.longPrefillTokenThresholdAdaptive"),
    ],
)
def test_new_knobs_are_refused_on_old_vllm(engine: dict[str, Any], knob: str) -> None:
    result = render_engine(spec(version="0.8.5", **engine))
    assert isinstance(result, UnsupportedKnob)
    assert result.knob == knob
    assert "0.8.5" in result.message


def test_too_old_version_is_refused() -> None:
    result = render_engine(spec(version="0.6.3"))
    assert isinstance(result, UnsupportedEngineVersion)
    assert result.reason == "UnsupportedEngineVersion"
    assert "spec.engine.version" in result.message


def test_simulator_refuses_what_the_same_vllm_version_refuses() -> None:
    result = render_engine(spec(kind="sim", version="0.32.0", maxNumPartialPrefills=2))
    assert isinstance(result, UnsupportedKnob)
    result = render_engine(spec(kind="sim", version="0.33.0", maxNumActiveSeqs=8, maxNumSeqs=16))
    assert isinstance(result, EngineRender)
    assert isinstance(render_engine(spec(kind="sim", version="0.32.0", maxNumActiveSeqs=8)), UnsupportedKnob)


def test_simulator_enforces_partial_prefills_where_the_default_vllm_image_does() -> None:
    # vLLM 0.33's default image carries the scheduler plugin; the simulator takes its own flags.
    result = rendered(kind="sim", version="0.33.0", maxNumPartialPrefills=2, maxLongPartialPrefills=1)
    assert flag_value(result.args, "--max-num-partial-prefills") == "2"
    assert flag_value(result.args, "--max-long-partial-prefills") == "1"
    assert "--scheduler-cls" not in result.args


def test_vllm_recipe_basics() -> None:
    result = rendered(version="0.33.0", tensorParallelSize=4, maxNumBatchedTokens=4096, maxNumSeqs=64)
    assert result.command == ["vllm", "serve"]
    assert result.args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag_value(result.args, "--tensor-parallel-size") == "4"
    assert flag_value(result.args, "--max-num-batched-tokens") == "4096"
    assert flag_value(result.args, "--port") == "8000"
    assert flag_value(result.args, "--served-model-name") == "meta-llama/Llama-3.1-8B-Instruct"
    assert result.gpus == 4
    assert result.resources["limits"]["nvidia.com/gpu"] == "4"
    assert result.image == ENGINE_IMAGE_0_33
    assert "--scheduler-cls" not in result.args  # the plugin is only selected when a knob needs it
    shutdown = int(flag_value(result.args, "--shutdown-timeout"))
    assert result.termination_grace_period_s == shutdown + TERMINATION_GRACE_MARGIN_S
    assert result.probes.startup_budget_s >= 1200  # large models load slowly


def test_chunked_prefill_off_uses_the_spelling_of_the_version() -> None:
    model = {"name": "m/x", "maxModelLen": 2048}
    new = rendered(version="0.33.0", enableChunkedPrefill=False, maxNumBatchedTokens=4096, model=model)
    old = rendered(version="0.8.5", enableChunkedPrefill=False, maxNumBatchedTokens=4096, model=model)
    assert "--no-enable-chunked-prefill" in new.args
    assert "--enable-chunked-prefill=false" in old.args


def test_model_token_comes_from_the_secret_reference() -> None:
    result = rendered(model={"name": "m/x", "tokenSecretRef": {"name": "hf", "key": "tok"}})
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}} in result.env


def test_pvc_model_is_mounted_and_passed_as_a_path() -> None:
    result = rendered(model={"name": "pvc://weights/llama/8b"})
    assert result.args[0] == "/mnt/models/llama/8b"
    assert result.model_volume is not None and result.model_volume.claim_name == "weights"


def test_simulator_argv_is_the_vllm_argv_plus_its_own_flags() -> None:
    vllm = rendered(version="0.33.0", extraArgs=["--seed", "7"])
    sim = render_engine(
        InferenceServiceSpec.model_validate(
            {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"kind": "sim", "version": "0.33.0", "extraArgs": ["--seed", "7"]},
                "resources": {"accelerator": "h200"},
            }
        )
    )
    assert isinstance(sim, EngineRender)
    assert sim.command == ["chunkpilot", "sim", "serve"]
    assert sim.args == [*vllm.args[:-2], "--gpu", "h200", "--seed", "7"]
    assert sim.gpus == 0
    assert "nvidia.com/gpu" not in sim.resources.get("limits", {})


def test_default_images() -> None:
    from chunkpilot.api import EngineKind

    assert default_image(EngineKind.VLLM, "0.8.5") == "vllm/vllm-openai:v0.8.5"
    assert default_image(EngineKind.VLLM, "0.32.0") == "vllm/vllm-openai:v0.32.0"
    assert default_image(EngineKind.VLLM, "0.33.0") == ENGINE_IMAGE_0_33
    assert default_image(EngineKind.VLLM, "v0.33") == ENGINE_IMAGE_0_33
    # Only the release the engine image is built from; a newer or suffixed build stays upstream.
    assert default_image(EngineKind.VLLM, "0.34.0") == "vllm/vllm-openai:v0.34.0"
    assert default_image(EngineKind.VLLM, "0.33.0.post1") == "vllm/vllm-openai:v0.33.0.post1"
    assert default_image(EngineKind.SIM, "0.33.0").startswith("ghcr.io/chunkpilot/chunkpilot:")


def test_explicit_image_wins() -> None:
    assert rendered(image="registry.local/vllm:patched").image == "registry.local/vllm:patched"


@pytest.mark.parametrize(
    ("engine", "honoured"),
    [
        ({"version": "0.8.5"}, True),
        ({"version": "0.33.0"}, True),
        ({"version": "0.33.0", "image": UPSTREAM_0_33}, False),
        ({"version": "0.32.0"}, False),
        ({"version": "0.32.0", "image": ENGINE_IMAGE_0_33}, True),
        ({"kind": "sim", "version": "0.33.0"}, True),
        ({"kind": "sim", "version": "0.32.0"}, False),
    ],
)
def test_honours_partial_prefills_follows_the_renderer(engine: dict[str, Any], honoured: bool) -> None:
    assert honours_partial_prefills(spec(**engine)) is honoured
    knobbed = spec(**engine, maxNumPartialPrefills=2)
    assert isinstance(render_engine(knobbed), EngineRender) is honoured


@pytest.mark.parametrize(
    "row", [k for k in KNOBS if VLLM in k.flags and k.flag(VLLM).versioned], ids=lambda k: k.name
)
def test_every_versioned_knob_of_the_table_is_checked(row: KnobSpec) -> None:
    flag = row.flag(VLLM)
    outside = EngineVersion(0, 8, 0) if flag.since is not None else flag.until
    assert outside is not None
    value: Any = True if row.kind == "bool" else 2
    engine = {"version": str(outside), "image": f"vllm/vllm-openai:v{outside}", row.camel: value}
    if row.name == "max_long_partial_prefills":
        engine["maxNumPartialPrefills"] = 2
    (rule,) = [rule for rule in KNOB_RULES if rule.knob == row.path]
    assert rule.flag == flag.flag and rule.is_set(spec(**engine)) and not rule.supports(outside)
    result = render_engine(spec(**engine))
    assert isinstance(result, UnsupportedKnob) and result.knob in {
        row.path,
        "spec.engine.maxNumPartialPrefills",
    }


# --------------------------------------------------------------------------- SGLang and TensorRT-LLM


def test_sglang_renders_the_knob_table_dialect() -> None:
    result = rendered(
        kind="sglang",
        maxNumBatchedTokens=2048,
        maxNumSeqs=64,
        maxPrefillTokens=8192,
        schedulePolicy="lpm",
        enableMixedChunk=True,
        enablePrefixCaching=False,
    )
    assert result.engine == "SGLang" and result.version == "0.5.23"
    assert result.image == "lmsysorg/sglang:v0.5.23"
    assert result.command == ["python3", "-m", "sglang.launch_server"]
    assert flag_value(result.args, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag_value(result.args, "--chunked-prefill-size") == "2048"
    assert flag_value(result.args, "--max-running-requests") == "64"
    assert flag_value(result.args, "--max-prefill-tokens") == "8192"
    assert flag_value(result.args, "--schedule-policy") == "lpm"
    assert {"--enable-mixed-chunk", "--disable-radix-cache", "--enable-metrics"} <= set(result.args)
    assert result.metrics_path == "/metrics" and result.config_dir is None


def test_sglang_without_chunked_prefill_renders_minus_one() -> None:
    args = rendered(kind="sglang", enableChunkedPrefill=False).args
    assert flag_value(args, "--chunked-prefill-size") == "-1"
    assert "--enable-mixed-chunk" not in args and "--disable-radix-cache" not in args


@pytest.mark.parametrize(
    ("kind", "engine", "knob"),
    [
        ("sglang", {"maxNumActiveSeqs": 8}, "spec.engine.maxNumActiveSeqs"),
        ("sglang", {"longPrefillTokenThreshold": 512}, "spec.engine.longPrefillTokenThreshold"),
        (
            "sglang",
            {"speculative": {"method": "ngram"}, "maxNumBatchedTokens": 8192},
            "spec.engine.speculative",
        ),
        ("sglang", {"capacitySchedulerPolicy": "MAX_UTILIZATION"}, "spec.engine.capacitySchedulerPolicy"),
        ("trtllm", {"maxNumPartialPrefills": 2}, "spec.engine.maxNumPartialPrefills"),
        ("trtllm", {"enableMixedChunk": True}, "spec.engine.enableMixedChunk"),
        ("trtllm", {"schedulePolicy": "lpm"}, "spec.engine.schedulePolicy"),
        ("vllm", {"enableMixedChunk": True}, "spec.engine.enableMixedChunk"),
        ("vllm", {"capacitySchedulerPolicy": "STATIC_BATCH"}, "spec.engine.capacitySchedulerPolicy"),
        ("sim", {"maxPrefillTokens": 16384}, "spec.engine.maxPrefillTokens"),
    ],
)
def test_knobs_an_engine_cannot_honour_are_refused(kind: str, engine: dict[str, Any], knob: str) -> None:
    result = render_engine(spec(kind=kind, **engine))
    assert isinstance(result, UnsupportedKnob), result
    assert result.knob == knob and result.reason == "UnsupportedKnob"
    assert "unset" in result.message and knob.rsplit(".", 1)[-1] in result.message


def test_trtllm_renders_flags_and_the_options_file() -> None:
    result = rendered(
        kind="trtllm",
        maxNumBatchedTokens=4096,
        maxNumSeqs=128,
        capacitySchedulerPolicy="MAX_UTILIZATION",
        enablePrefixCaching=False,
        model={"name": "meta-llama/Llama-3.1-8B-Instruct", "maxModelLen": 8192},
    )
    assert result.engine == "TensorRT-LLM" and result.version == "1.2.1"
    assert result.image == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    assert result.command[:2] == ["/bin/sh", "-c"] and result.command[-1] == "trtllm-serve"
    assert result.args[:2] == ["serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag_value(result.args, "--max_num_tokens") == "4096"
    assert flag_value(result.args, "--max_batch_size") == "128"
    assert flag_value(result.args, "--max_seq_len") == "8192"
    assert flag_value(result.args, "--extra_llm_api_options") == "/etc/chunkpilot/llm-api.yaml"
    (options,) = [item["value"] for item in result.env if item["name"] == "CHUNKPILOT_LLM_API_OPTIONS"]
    parsed = yaml.safe_load(options)
    assert parsed["enable_chunked_prefill"] is True
    assert parsed["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.92}
    assert parsed["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    assert parsed["return_perf_metrics"] is True and parsed["enable_iter_perf_stats"] is True
    assert result.metrics_path == "/prometheus/metrics" and result.config_dir == "/etc/chunkpilot"


def test_trtllm_refuses_a_served_name_other_than_the_model() -> None:
    model = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"}
    result = render_engine(spec(kind="trtllm", model=model))
    assert isinstance(result, UnsupportedKnob) and result.knob == "spec.model.servedName"
    same = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "meta-llama/Llama-3.1-8B-Instruct"}
    assert isinstance(render_engine(spec(kind="trtllm", model=same)), EngineRender)


@pytest.mark.parametrize(
    ("kind", "version"), [("sglang", "0.3.6"), ("trtllm", "0.21.0"), ("sglang", "0.2.15")]
)
def test_old_or_bad_versions_of_the_other_engines_are_refused(kind: str, version: str) -> None:
    result = render_engine(spec(kind=kind, version=version))
    assert isinstance(result, UnsupportedEngineVersion), result


def test_default_images_of_every_kind() -> None:
    from chunkpilot.api import EngineKind

    assert default_image(EngineKind.SGLANG, "0.5.23") == "lmsysorg/sglang:v0.5.23"
    assert default_image(EngineKind.TRTLLM, "1.2.1") == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"


def test_a_versioned_flag_of_another_dialect_is_refused_outside_its_releases() -> None:
    from chunkpilot.operator.engines.knobcheck import versioned_knob

    from chunkpilot.api.knobs import SGLANG, EngineFlag

    def mixed_chunk(flag: EngineFlag) -> KnobSpec:
        return KnobSpec("enable_mixed_chunk", "enableMixedChunk", "bool", "doc", {SGLANG: flag})

    row = mixed_chunk(EngineFlag("--x", since=EngineVersion(0, 5, 0)))
    early = versioned_knob(row, SGLANG, EngineVersion(0, 4, 9))
    assert early.engine == "SGLang" and "0.5.0 and later" in early.message and early.flag == "--x"
    gone = mixed_chunk(EngineFlag("--x", until=EngineVersion(0, 5, 0)))
    assert "removed in 0.5.0" in versioned_knob(gone, SGLANG, EngineVersion(0, 5, 23)).message
