"""Serving profiles: the serve-args schema, validation, the --config YAML and the env file
(plugins/module_utils/serve_config.py), the serve_config module, and the service role's
structure (validation first, every variable declared, the key never logged)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import (
    ProfileError,
    SchemaError,
    ARGS_LOGGER,
    build,
    dump_env,
    load_schema,
    logging_config,
    model_path,
    size_value,
    validate_env,
    validate_serve_args,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DOC = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
SCHEMA = load_schema(SCHEMA_DOC)
PROFILES = sorted((ROOT / "profiles").glob("*.yml"))
STABLE = yaml.safe_load((ROOT / "profiles" / "qwen3.6-35b-a3b-nvfp4-sm120.yml").read_text())
STANDIN_SRC = ROOT / "tests" / "fixtures" / "vllm_standin" / "src"
ROLE = ROOT / "roles" / "vllm_service"
ROLE_ARGS = {"host": "0.0.0.0", "port": 8000}
ROLE_ENV = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def profile(**changes):
    out = copy.deepcopy(STABLE)
    for key, value in changes.items():
        out[key] = value
    return out


def args_of(serve_args):
    return {**STABLE["serve_args"], **serve_args}


def errors_of(prof, **kwargs) -> list[str]:
    with pytest.raises(ProfileError) as info:
        build(SCHEMA_DOC, prof, role_args=ROLE_ARGS, role_env=ROLE_ENV, **kwargs)
    return info.value.errors


def one_error(prof, **kwargs) -> str:
    errors = errors_of(prof, **kwargs)
    assert len(errors) == 1, errors
    return errors[0]


# --- the shipped data ----------------------------------------------------------------------

def test_shipped_schema_loads_and_knows_the_profiles_flags():
    assert SCHEMA.vllm == "0.25.1"
    assert {"gpu-memory-utilization", "max-model-len", "kv-cache-dtype", "enforce-eager"} <= set(SCHEMA.flags)
    assert SCHEMA.flags["port"].reserved and SCHEMA.flags["api-key"].reserved


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_shipped_profile_validates_and_renders(path):
    prof = yaml.safe_load(path.read_text())
    result = build(SCHEMA_DOC, prof, role_args=ROLE_ARGS, role_env=ROLE_ENV, header="test")
    assert result["config"]["model"] == prof["model"]
    assert list(result["config"])[0] == "model"
    assert yaml.safe_load(result["content"]) == result["config"]
    assert result["profile"]["serve_args"] == prof["serve_args"]
    assert result["warnings"] == []


def test_the_stable_profile_renders_what_design_md_says():
    result = build(SCHEMA_DOC, STABLE, role_args=ROLE_ARGS, role_env=ROLE_ENV)
    config = yaml.safe_load(result["content"])
    assert config == {
        "model": "/models/qwen3.6-35b-a3b-nvfp4", "enable-chunked-prefill": True, "enable-prefix-caching": True,
        "gpu-memory-utilization": 0.95, "kv-cache-dtype": "fp8", "max-model-len": 262144,
        "max-num-batched-tokens": 32768, "max-num-seqs": 128, "tensor-parallel-size": 1,
        "host": "0.0.0.0", "port": 8000,
        # Not in DESIGN.md's flags: the one name clients use across quantizations (issue 13).
        "served-model-name": ["qwen3.6-35b-a3b"],
    }
    assert result["env"] == {"VLLM_USE_DEEP_GEMM_E8M0": "0", **ROLE_ENV}


# --- booleans: false is the no- form, never dropped ----------------------------------------

def test_false_is_written_as_the_no_form():
    result = build(SCHEMA_DOC, profile(serve_args=args_of({"enforce-eager": False, "enable-prefix-caching": False})),
                   role_args=ROLE_ARGS)
    config = yaml.safe_load(result["content"])
    assert config["no-enforce-eager"] is True and config["no-enable-prefix-caching"] is True
    assert "enforce-eager" not in config and "enable-prefix-caching" not in config
    # preflight reads booleans as booleans (the catalogue matches enforce-eager: true)
    assert result["profile"]["serve_args"]["enforce-eager"] is False


def test_the_no_form_may_be_written_directly_and_means_false():
    result = build(SCHEMA_DOC, profile(serve_args={"no-enable-prefix-caching": True}), role_args=ROLE_ARGS)
    assert result["profile"]["serve_args"] == {"enable-prefix-caching": False}
    assert result["config"]["no-enable-prefix-caching"] is True


# A store_true flag (every bool of 0.25.1 that a profile may set has the --no- form).
STORE_TRUE = load_schema({**SCHEMA_DOC, "flags": {**SCHEMA_DOC["flags"], "store-true-flag": {"type": "bool"}}})


def test_a_false_on_a_flag_without_a_no_form_is_refused():
    _, [message] = validate_serve_args(STORE_TRUE, {"store-true-flag": False})
    assert "--store-true-flag" in message and "no --no- form" in message and "remove it" in message
    assert validate_serve_args(STORE_TRUE, {"store-true-flag": True}) == ({"store-true-flag": True}, [])


def test_a_no_form_that_does_not_exist_is_refused():
    _, [message] = validate_serve_args(STORE_TRUE, {"no-store-true-flag": True})
    assert "--store-true-flag has no --no- form" in message


def test_a_no_form_takes_true_only():
    message = one_error(profile(serve_args={"no-enforce-eager": False}))
    assert "write enforce-eager: true instead" in message


def test_the_same_flag_twice_with_different_values_is_refused():
    message = one_error(profile(serve_args={"enforce-eager": True, "no-enforce-eager": True}))
    assert "sets --enforce-eager again" in message


def test_rendered_configs_parse_with_the_standin_vllm_parser(tmp_path, monkeypatch):
    """The YAML as `vllm serve --config` reads it (the stand-in's FlexibleArgumentParser)."""
    monkeypatch.syspath_prepend(str(STANDIN_SRC))
    try:
        import vllm.cli

        prof = profile(serve_args=args_of({"enforce-eager": False, "enable-prefix-caching": False,
                                           "served-model-name": ["qwen", "default"], "max-model-len": "256K",
                                           "enable-chunked-prefill": True}))
        result = build(SCHEMA_DOC, prof, role_args=ROLE_ARGS)
        path = tmp_path / "gpu0.yaml"
        path.write_text(result["content"])
        args = vllm.cli.parse_args(["serve", "--config", str(path)])
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
    assert args.model == "/models/qwen3.6-35b-a3b-nvfp4"
    assert args.enforce_eager is False and args.enable_prefix_caching is False
    assert args.enable_chunked_prefill is True
    assert args.served_model_name == ["qwen", "default"]
    assert args.max_model_len == 262144 and args.gpu_memory_utilization == 0.95
    assert args.kv_cache_dtype == "fp8" and args.port == 8000 and args.host == "0.0.0.0"


# --- unknown flags, types, ranges, choices ------------------------------------------------

@pytest.mark.parametrize("flag, suggestion", [
    ("enable-prefix-cache", "--enable-prefix-caching"),
    ("gpu-memory-utilisation", "--gpu-memory-utilization"),
    ("--max_num_seq", "--max-num-seqs"),
    ("kv-cache-type", "--kv-cache-dtype"),
    ("no-enforce-eagre", "--no-enforce-eager"),
])
def test_an_unknown_flag_is_named_with_the_closest_known_one(flag, suggestion):
    message = one_error(profile(serve_args=args_of({flag: 1})))
    assert "unknown flag" in message and f"(did you mean {suggestion}?)" in message


def test_an_unknown_flag_without_a_near_miss_gets_no_suggestion():
    message = one_error(profile(serve_args={"frobnicate-the-widgets": True}))
    assert "unknown flag --frobnicate-the-widgets for vllm serve 0.25.1" in message
    assert "did you mean" not in message


def test_snake_case_and_dashes_name_the_same_flag():
    result = build(SCHEMA_DOC, profile(serve_args={"--max_num_seqs": 64}), role_args=ROLE_ARGS)
    assert result["config"]["max-num-seqs"] == 64


@pytest.mark.parametrize("flag, value, expected", [
    ("gpu-memory-utilization", 1.5, "1.5 is out of range: it must be > 0 and <= 1"),
    ("gpu-memory-utilization", 0, "0 is out of range: it must be > 0 and <= 1"),
    ("max-num-seqs", 0, "0 is out of range: it must be >= 1"),
    ("tensor-parallel-size", 2, "2 is out of range: it must be >= 1 and <= 1"),
    ("max-model-len", "0k", "0 is out of range"),
    ("max-num-seqs", "128", 'expects an integer, got string "128"'),
    ("max-num-seqs", True, "expects an integer, got boolean true"),
    ("max-num-seqs", 12.5, "expects an integer, got number 12.5"),
    ("enforce-eager", "false", 'expects a boolean (true or false, unquoted), got string "false"'),
    ("enforce-eager", 1, "expects a boolean"),
    ("gpu-memory-utilization", "0.9", "expects a number"),
    ("gpu-memory-utilization", float("nan"), "finite"),
    ("max-model-len", "256x", "expects a size"),
    ("kv-cache-dtype", "fp8e4m3", "is not one of: auto, bfloat16, float16, fp8, fp8_ds_mla, fp8_e4m3"),
    ("kv-cache-dtype", "", "expects a non-empty string"),
    ("block-size", 0, "0 is out of range: it must be >= 1"),
    ("max-model-len", "1.5K", 'expects a size (an integer, or a string like "256k"'),
    ("max-model-len", "1.5", "expects a size"),
    ("max-model-len", 1.5, "expects a size"),
    ("load-format", "gguf", "is not one of: auto, hf, bitsandbytes"),
    ("moe-backend", "marlin-v2", "is not one of: aiter, auto"),
    ("moe-backend", "flashinfer-b12x", "(did you mean 'flashinfer_b12x'?)"),
    ("served-model-name", [], "expects a non-empty list"),
    ("served-model-name", ["ok", 3], "item 1: expects a non-empty string"),
    ("compilation-config", "{}", "expects a mapping"),
])
def test_wrong_types_ranges_and_choices_are_refused(flag, value, expected):
    message = one_error(profile(serve_args=args_of({flag: value})))
    assert message.startswith(f"profile.serve_args.{flag}: --{flag} ")
    assert expected in message


def test_a_choice_gets_the_closest_one_suggested():
    assert "(did you mean 'fp8_e4m3'?)" in one_error(profile(serve_args={"kv-cache-dtype": "fp8e4m3"}))


def test_sizes_follow_vllm_human_readable_int():
    """vllm/utils/argparse_utils.py: k m g t are x1000 and take decimals, K M G T are x1024 and
    refuse them; a plain string is an integer. Checked against the real function (0.25.1)."""
    assert [size_value(v) for v in (262144, "262144", "256k", "256K", "1M", "1.5k", "25.6k", "2G", "1T", "1t")] == \
        [262144, 262144, 256000, 262144, 1048576, 1500, 25600, 2 * 2**30, 2**40, 10**12]
    assert [size_value(v) for v in ("1.5K", "1.0M", "1.5", "x", "256 k", True, 1.0)] == [None] * 7


def test_flags_real_0_25_1_lacks_are_unknown():
    """vllm serve exits 2 on either: the unit would restart until its start limit."""
    for flag in ("swap-space", "disable-log-requests"):
        assert f"unknown flag --{flag} for vllm serve 0.25.1" in one_error(profile(serve_args=args_of({flag: 4})))


@pytest.mark.parametrize("flag, value", [
    ("load-format", "hf"), ("load-format", "instanttensor"), ("load-format", "modelexpress"),
    ("load-format", "runai_streamer_sharded"), ("moe-backend", "marlin"), ("moe-backend", "auto"),
    ("max-model-len", "25.6k"), ("block-size", 24),
])
def test_values_real_0_25_1_takes_are_accepted(flag, value):  # negative control of the refusals above
    result = build(SCHEMA_DOC, profile(serve_args=args_of({flag: value})), role_args=ROLE_ARGS)
    assert result["config"][flag] == value


def test_disable_log_stats_is_refused_because_it_blinds_every_gate():
    """In 0.25.1 it removes every vllm:* series (v1/engine/async_llm.py): no progress for the
    watchdog, no wedge for the soak, an unmeasured KV check."""
    message = one_error(profile(serve_args=args_of({"disable-log-stats": True})))
    assert message.startswith("profile.serve_args.disable-log-stats: --disable-log-stats is not set in a profile")
    assert all(word in message for word in ("vllm:* metric", "watchdog", "soak", "bake")), message


def test_json_flags_render_as_json_that_yaml_reads_back():
    result = build(SCHEMA_DOC, profile(serve_args={"compilation-config": {"cudagraph_mode": "FULL", "level": 3}}),
                   role_args=ROLE_ARGS)
    assert yaml.safe_load(result["content"])["compilation-config"] == {"cudagraph_mode": "FULL", "level": 3}


def test_every_problem_is_reported_at_once():
    errors = errors_of(profile(serve_args={"enable-prefix-cache": True, "gpu-memory-utilization": 1.5,
                                           "max-num-seqs": "128"}, env={"X": True}))
    assert len(errors) == 4
    assert [e.split(":")[0] for e in errors] == [
        "profile.serve_args.enable-prefix-cache", "profile.serve_args.gpu-memory-utilization",
        "profile.serve_args.max-num-seqs", "profile.env.X"]


# --- what the role owns --------------------------------------------------------------------

@pytest.mark.parametrize("flag, reason", [
    ("port", "vllm_fleet_instances"),
    ("host", "vllm_fleet_service_host"),
    ("api-key", "vllm_fleet_service_api_key"),
    ("model", "profile's `model` key"),
    ("config", "writes the config file"),
    ("shutdown-timeout", "vllm_fleet_service_shutdown_timeout"),
])
def test_flags_the_role_owns_are_refused_in_a_profile(flag, reason):
    message = one_error(profile(serve_args=args_of({flag: "x" if flag != "port" else 9000})))
    assert f"--{flag} is not set in a profile" in message and reason in message


def test_role_args_are_checked_too():
    with pytest.raises(ProfileError, match="role argument port: --port 70000 is out of range"):
        build(SCHEMA_DOC, STABLE, role_args={"port": 70000})


def test_an_unknown_suggestion_never_proposes_a_reserved_flag():
    assert "did you mean" not in one_error(profile(serve_args={"api-keys": "x"}))


# --- flag injection (issue 14) -------------------------------------------------------------

def test_the_served_model_name_injection_is_refused():
    """vllm serve --config makes each list item its own argv word: this list would set the
    API key and the bind address the role owns."""
    message = one_error(profile(serve_args=args_of(
        {"served-model-name": ["qwen", "--api-key", "known-key", "--host", "0.0.0.0"]})))
    assert message.startswith("profile.serve_args.served-model-name: --served-model-name item 1:")
    assert "\"--api-key\" begins with '-'" in message and "may not begin with '-'" in message


def test_a_plain_list_of_names_still_renders():  # negative control of the injection test
    result = build(SCHEMA_DOC, profile(serve_args=args_of({"served-model-name": ["qwen", "qwen-nvfp4"]})),
                   role_args=ROLE_ARGS)
    assert result["config"]["served-model-name"] == ["qwen", "qwen-nvfp4"]


@pytest.mark.parametrize("flag, value, expected", [
    ("tokenizer", "--api-key", "begins with '-'"),
    ("tokenizer", " -x", "begins with '-'"),
    ("tokenizer", "a\n--host 0.0.0.0", "control character '\\n'"),
    ("tokenizer", "a\rb", "control character '\\r'"),
    ("tokenizer", "a\x1b[2Jb", "control character '\\x1b'"),
    ("tokenizer", "a\u2028b", "control character"),
    ("tokenizer", "x" * 5000, "is 5000 characters long: at most 4096"),
    ("served-model-name", "-q", "begins with '-'"),
    ("served-model-name", ["ok", "x\ny"], "item 1"),
    ("served-model-name", ["n"] * 65, "has 65 items: at most 64"),
    ("compilation-config", {"level": 3, "note": "a\nb"}, "at .note"),
    ("compilation-config", {"custom_ops": ["--api-key"]}, "at .custom_ops[0]: \"--api-key\" spells a flag"),
    ("compilation-config", {"a\nb": 1}, "(a key)"),
    ("compilation-config", {"pad": "x" * 70000}, "characters long as JSON"),
])
def test_values_that_could_inject_or_overflow_are_refused_in_every_shape(flag, value, expected):
    message = one_error(profile(serve_args=args_of({flag: value})))
    assert message.startswith(f"profile.serve_args.{flag}:") and expected in message, message
    assert len(message) < 400  # a 5000-character value is not echoed whole


def test_a_mapping_may_hold_a_single_dash_value():  # negative control: vLLM's custom_ops "-op"
    result = build(SCHEMA_DOC, profile(serve_args=args_of({"compilation-config": {"custom_ops": ["-rms_norm"]}})),
                   role_args=ROLE_ARGS)
    assert result["config"]["compilation-config"] == {"custom_ops": ["-rms_norm"]}


@pytest.mark.parametrize("key, value, expected", [
    ("model", "--api-key", "begins with '-'"),
    ("model", "/models/q\n--host", "control character"),
    ("model", "m" * (10 * 1024 * 1024), "at most 4096"),
    ("name", "stable\x07", "control character '\\x07'"),
    ("name", "n" * 129, "at most 128"),
])
def test_profile_name_and_model_are_one_short_line(key, value, expected):
    message = one_error(profile(**{key: value}))
    assert message.startswith(f"profile.{key}: ") and expected in message, message[:300]


def test_env_values_refuse_control_characters_and_length_but_may_begin_with_a_dash():
    env, errors, _ = validate_env(SCHEMA, {"A": "-1", "B": "a\x1bb", "C": "x" * 5000})
    assert env == {"A": "-1"}
    assert errors[0].startswith("env.B:") and "control character" in errors[0]
    assert errors[1].startswith("env.C:") and "at most 4096" in errors[1]


def test_a_key_with_a_control_character_is_shown_quoted():
    message = one_error(profile(serve_args=args_of({"bogus\nflag": 1})))
    assert "\n" not in message and "bogus\\nflag" in message


# --- environment ---------------------------------------------------------------------------

def test_env_values_are_text():
    env, errors, _ = validate_env(SCHEMA, {"A": "0", "B": 1, "C": 0.5, "D": True, "E": None, "F": "a\nb"})
    assert env == {"A": "0", "B": "1", "C": "0.5"}
    assert [e.split(":")[0] for e in errors] == ["env.D", "env.E", "env.F"]
    assert "quote it" in errors[0]


def test_env_names_are_checked_and_reserved_ones_refused():
    message = "\n".join(errors_of(profile(env={"1BAD": "x", "CUDA_VISIBLE_DEVICES": "1", "VLLM_API_KEY": "k"}),
                                  reserved_env={"VLLM_API_KEY": "set vllm_fleet_service_api_key"}))
    assert "'1BAD' is not an environment variable name" in message
    assert "profile.env.CUDA_VISIBLE_DEVICES: not set in a profile: the role sets it for each instance" in message
    assert "profile.env.VLLM_API_KEY: not set in a profile: set vllm_fleet_service_api_key" in message


@pytest.mark.parametrize("name", ["VLLM_ATTENTION_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP8",
                                  "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_RPC_TIMEOUT", "VLLM_TORCH_PROFILER_DIR",
                                  "VLLM_USE_TRITON_FLASH_ATTN"])
def test_a_variable_real_0_25_1_does_not_read_gets_a_warning(name):
    [warning] = build(SCHEMA_DOC, profile(env={name: "1"}), role_args=ROLE_ARGS)["warnings"]
    assert f"vLLM 0.25.1 does not read {name}" in warning
    # negative control: one it reads
    assert build(SCHEMA_DOC, profile(env={"VLLM_USE_DEEP_GEMM_E8M0": "0"}), role_args=ROLE_ARGS)["warnings"] == []


def test_a_misspelt_vllm_variable_gets_a_warning_with_the_closest():
    result = build(SCHEMA_DOC, profile(env={"VLLM_USE_DEEP_GEMM_E8MO": "0"}), role_args=ROLE_ARGS)
    [warning] = result["warnings"]
    assert "VLLM_USE_DEEP_GEMM_E8MO" in warning and "'VLLM_USE_DEEP_GEMM_E8M0'" in warning


def test_env_file_quotes_what_systemd_would_expand_or_split():
    text = dump_env({"A": 'say "hi" $HOME `x` \\n', "B": "plain"}, header="one\ntwo")
    assert text == '# one\n# two\nA="say \\"hi\\" \\$HOME \\`x\\` \\\\n"\nB="plain"\n'


def test_role_env_comes_after_the_profile_env():
    result = build(SCHEMA_DOC, STABLE, role_args=ROLE_ARGS, role_env={"CUDA_VISIBLE_DEVICES": 3})
    assert list(result["env"]) == ["VLLM_USE_DEEP_GEMM_E8M0", "CUDA_VISIBLE_DEVICES"]
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == "3"


# --- vLLM's logging configuration: no key in the journal -----------------------------------

KEYS = ["new-key-0123456789abcdef", "old-key-fedcba9876543210"]


def _vllm_logs(tmp_path, logging_content: str | None) -> str:
    """What the stand-in vLLM logs as it starts on an instance config of a rotation's window
    (the role appends the keys as `api-key`, the one way vLLM takes several): its parser reads
    the config, and 0.25.1's start-up line of non-default arguments and another INFO line are
    logged, with the role's logging configuration (VLLM_LOGGING_CONFIG_PATH) or, given None,
    with vLLM's default."""
    config = tmp_path / "gpu0.yaml"
    config.write_text(build(SCHEMA_DOC, STABLE, role_args=ROLE_ARGS)["content"] + f"api-key: {json.dumps(KEYS)}\n")
    script = ("import logging, sys, vllm.cli\n"
              "from vllm.entrypoints.serve.utils.api_utils import log_non_default_args\n"
              "log_non_default_args(vllm.cli.parse_args(['serve', '--config', sys.argv[1]]).non_default)\n"
              "logging.getLogger('vllm.entrypoints.openai.api_server').info('Starting vLLM API server 0 on x')\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(STANDIN_SRC)}
    if logging_content is not None:
        path = tmp_path / "logging.json"
        path.write_text(logging_content)
        env["VLLM_LOGGING_CONFIG_PATH"] = str(path)
    proc = subprocess.run([sys.executable, "-c", script, str(config)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_the_logging_configuration_keeps_the_keys_out_and_every_other_line_in(tmp_path):
    logs = _vllm_logs(tmp_path, build(SCHEMA_DOC, STABLE, role_args=ROLE_ARGS)["logging_content"])
    assert "Starting vLLM API server 0 on x" in logs and "INFO" in logs
    assert not [key for key in KEYS if key in logs] and "non-default args" not in logs


def test_without_the_logging_configuration_vllm_logs_the_keys(tmp_path):  # the negative control
    logs = _vllm_logs(tmp_path, None)
    assert all(key in logs for key in KEYS) and "non-default args: {" in logs and "'api_key': [" in logs


def test_the_logging_configuration_applies_the_profiles_level_and_prefix():
    config = json.loads(build(SCHEMA_DOC, profile(env={"VLLM_LOGGING_LEVEL": "debug", "VLLM_LOGGING_PREFIX": "[q] "}),
                              role_args=ROLE_ARGS)["logging_content"])
    assert config["loggers"]["vllm"]["level"] == config["handlers"]["vllm"]["level"] == "DEBUG"
    assert config["formatters"]["vllm"]["format"].startswith("[q] %(levelname)s")
    assert config["loggers"][ARGS_LOGGER] == {"level": "WARNING"}  # at DEBUG too
    assert logging_config({})["loggers"]["vllm"]["level"] == "INFO"  # vLLM's default


def test_a_logging_level_vllm_cannot_load_is_refused():
    message = one_error(profile(env={"VLLM_LOGGING_LEVEL": "LOUD"}))
    assert message == ('profile.env.VLLM_LOGGING_LEVEL: "LOUD" is not a logging level: '
                       "one of CRITICAL, ERROR, WARNING, INFO, DEBUG")


def test_the_role_reserves_what_would_undo_its_logging_configuration():
    reserved = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_vllm_fleet_service_reserved_env"]
    assert {"VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_STREAM", "VLLM_API_KEY"} <= set(reserved)
    unit = (ROLE / "templates" / "vllm@.service.j2").read_text()
    assert "Environment=VLLM_LOGGING_CONFIG_PATH={{ vllm_fleet_config_dir }}/logging.json" in unit.splitlines()


# --- the health wait of the unit ------------------------------------------------------------

def _health_url(tmp_path, config: dict) -> str:
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("wait_health", str(ROLE / "files" / "vllm-fleet-wait-health"))
    module = module_from_spec(spec_from_loader("wait_health", loader))
    loader.exec_module(module)
    path = tmp_path / "gpu0.yaml"
    path.write_text(build(SCHEMA_DOC, STABLE, role_args=config, header="h")["content"])
    return module.health_url(str(path))


@pytest.mark.parametrize("host, url", [
    ("0.0.0.0", "http://127.0.0.1:8001/health"), ("::", "http://127.0.0.1:8001/health"),
    ("10.0.0.5", "http://10.0.0.5:8001/health"), ("fd00::5", "http://[fd00::5]:8001/health"),
])
def test_the_health_wait_reads_its_address_from_the_instance_config(tmp_path, host, url):
    """Not from VLLM_FLEET_HEALTH_URL: real vLLM warns about every VLLM_* name it does not know."""
    assert _health_url(tmp_path, {"host": host, "port": 8001}) == url


# --- the profile itself --------------------------------------------------------------------

def test_profile_keys_are_checked():
    errors = errors_of({"name": "x", "model": "", "serve-args": {}})
    assert "profile: unknown key 'serve-args' (did you mean 'serve_args'?)" in errors[0]
    assert errors[1].startswith("profile.model: a non-empty single-line string is required")


def test_a_profile_must_be_a_mapping():
    assert "is not a mapping" in one_error(["not", "a", "profile"])


def test_serve_args_must_be_a_mapping():
    _, errors = validate_serve_args(SCHEMA, ["enforce-eager"])
    assert errors == ['serve_args: [\'enforce-eager\'] is not a mapping of flag names to values']


# --- the schema's own format ---------------------------------------------------------------

@pytest.mark.parametrize("flags, expected", [
    ({"x": {"type": "boolean"}}, "type 'boolean' is not one of"),
    ({"x": {"type": "int", "negatable": True}}, "negatable is a boolean, and only for type bool"),
    ({"x": {"type": "str", "min": 1}}, "min and max are for types int, float and size"),
    ({"x": {"type": "int", "chioces": [1]}}, "unknown key 'chioces' (did you mean 'choices'?)"),
    ({"--x": {"type": "int"}}, "a flag is named by its long form"),
    ({"x": {"type": "int", "reserved": ""}}, "reserved is a sentence"),
    ({}, "flags is a non-empty mapping"),
])
def test_a_broken_schema_names_the_flag_and_key(flags, expected):
    with pytest.raises(SchemaError, match=None) as info:
        load_schema({"schema_version": 1, "vllm": "0.25.1", "flags": flags})
    assert expected in str(info.value)


def test_an_unsupported_schema_version_is_refused():
    with pytest.raises(SchemaError, match="schema_version 2 is not supported"):
        load_schema({**SCHEMA_DOC, "schema_version": 2})


# --- the module, through Ansible -----------------------------------------------------------

def _ansible(module_args: dict, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}", "-m", "vllm_fleet.fleet.serve_config",
           "-a", json.dumps(module_args), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _result(proc) -> dict:
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_renders_in_check_mode_and_changes_nothing():
    proc = _ansible({"schema": SCHEMA_DOC, "profile": STABLE, "role_args": ROLE_ARGS, "header": "h"}, "--check")
    result = _result(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["changed"] is False
    assert result["content"].startswith("# h\nmodel: ")
    assert result["config"]["port"] == 8000


def test_module_fails_with_every_problem_listed():
    bad = profile(serve_args={"enable-prefix-cache": True, "gpu-memory-utilization": 1.5})
    proc = _ansible({"schema": SCHEMA_DOC, "profile": bad})
    result = _result(proc)
    assert proc.returncode != 0
    assert result["msg"].startswith(f"serve_config: profile '{STABLE['name']}' cannot be served (2 problem(s)):")
    assert "(did you mean --enable-prefix-caching?)" in result["msg"]
    assert len(result["errors"]) == 2


# --- the service role's structure ----------------------------------------------------------

def _tasks(name: str) -> list[dict]:
    return yaml.safe_load((ROLE / "tasks" / name).read_text())


def _walk(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _walk(task.get(key, []))


def test_validation_comes_before_anything_is_written():
    main = _tasks("main.yml")
    assert [t["ansible.builtin.import_tasks"] for t in main] == ["validate.yml", "configure.yml", "run.yml"]
    writers = {"ansible.builtin.copy", "ansible.builtin.template", "ansible.builtin.file", "ansible.builtin.user",
               "ansible.builtin.group", "ansible.builtin.systemd_service", "ansible.builtin.command"}
    for task in _walk(_tasks("validate.yml")):
        assert not writers & set(task), f"validate.yml writes: {task['name']}"


# Modules of this collection that take the key in an option their argument_spec marks no_log:
# Ansible masks it in their arguments (-vvv) and result, and their failure message (readiness:
# the journal) stays readable, which a task's no_log would censor.
MASKS_THE_KEY = {"vllm_fleet.fleet.vllm_ready": "api_keys"}


def test_every_task_that_touches_the_key_has_no_log():
    """A task whose arguments template the key must not log them."""
    uses_key = re.compile(r"\{\{[^}]*vllm_fleet_service_api_key\b[^}]*\}\}")
    seen = masked = 0
    for path in sorted((ROLE / "tasks").glob("*.yml")) + [ROLE / "handlers" / "main.yml"]:
        for task in _walk(yaml.safe_load(path.read_text())):
            body = {k: v for k, v in task.items()
                    if k not in ("name", "when", "no_log", "vars", "block", "rescue", "always")}
            module = next((name for name in MASKS_THE_KEY if name in body), None)
            if module:
                option = MASKS_THE_KEY[module]
                body[module] = {k: v for k, v in body[module].items() if k != option}
                masked += uses_key.search(json.dumps(task[module][option])) is not None
            if uses_key.search(json.dumps(body)):
                seen += 1
                assert task.get("no_log"), f"{path.name}: {task['name']} handles the API key without no_log"
    assert seen >= 1 and masked >= 1  # the key file; readiness's requests
    for module, option in MASKS_THE_KEY.items():
        source = (ROOT / "plugins" / "modules" / f"{module.rsplit('.', 1)[1]}.py").read_text()
        assert re.search(rf"\b{option}=dict\([^)]*no_log=True", source), f"{module}: {option} is not no_log"


def test_release_switch_declares_each_default_on_the_entry_point_that_reads_it():
    role = ROLE.parent / "release_switch"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert set(specs) == {"cutover", "rollback", "mark_known_good"}
    assert set(defaults) == set(specs["cutover"]["options"])
    assert all(name.startswith("vllm_fleet_switch_") for name in defaults)
    for name, spec in specs["cutover"]["options"].items():
        assert spec.get("description") and spec.get("type"), name
        if "default" in spec:
            assert spec["default"] == defaults[name], name


def test_every_role_variable_is_declared_in_the_argument_specs():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    main = specs["main"]["options"]
    # the instances are the shared vllm_fleet_instances (fleet_defaults), declared here too
    # the options of one entry point alone (validate's, configure's, restart's) are declared there
    own = {"vllm_fleet_service_validate_release": "validate", "vllm_fleet_service_validate_cudnn": "validate",
           "vllm_fleet_service_validate_gpu": "validate",
           "vllm_fleet_service_instances_stopped": "configure", "vllm_fleet_service_restart": "restart"}
    assert all(name in specs[entry]["options"] for name, entry in own.items())
    assert set(defaults) - set(own) == set(main) - {"vllm_fleet_instances"}
    assert "vllm_fleet_instances" in main and "vllm_fleet_instances" not in defaults
    for name, spec in {**main, **specs["restart"]["options"], **specs["configure"]["options"]}.items():
        assert spec.get("description"), f"{name} has no description"
        assert spec.get("type"), f"{name} has no type"
        if "default" in spec and name in defaults:
            assert spec["default"] == defaults[name], name
    assert all(name.startswith("vllm_fleet_service_") for name in defaults)


# --- the role's own inputs, checked by its profile entry point (on the controller) ------------

GOOD_KEY = "good-key-0123456789abcdef"
ROLE_INPUT_CASES = {
    # host: (variables, what its failure says; None: it passes)
    "good": ({"vllm_fleet_service_api_key": GOOD_KEY, "vllm_fleet_service_api_key_retiring": [KEYS[1]]}, None),
    "key-begins-with-a-dash": ({"vllm_fleet_service_api_key": "-" + GOOD_KEY},
                               "vllm_fleet_service_api_key may hold only letters, digits and . _ ~ + / = - (16 to "
                               "1024 of them, and no newline), and may not begin with '-'"),
    "retiring-key-begins-with-a-dash": ({"vllm_fleet_service_api_key": GOOD_KEY,
                                         "vllm_fleet_service_api_key_retiring": [KEYS[1], "--api-key-0123456789"]},
                                        "vllm_fleet_service_api_key_retiring: key 2 (counted from 1) must have 16 "
                                        "to 1024 of the characters of vllm_fleet_service_api_key, not begin with '-'"),
    "shutdown-timeout-negative": ({"vllm_fleet_service_shutdown_timeout": -1},
                                  "vllm_fleet_service_shutdown_timeout -1 is out of range: 0 to 3600 s"),
    "shutdown-timeout-too-long": ({"vllm_fleet_service_shutdown_timeout": 3601, "vllm_fleet_service_timeout_stop_sec": 4000},
                                  "vllm_fleet_service_shutdown_timeout 3601 is out of range: 0 to 3600 s"),
    "stop-not-above-the-drain": ({"vllm_fleet_service_shutdown_timeout": 90, "vllm_fleet_service_timeout_stop_sec": 90},
                                 "vllm_fleet_service_timeout_stop_sec 90 must be above vllm_fleet_service_shutdown_timeout"
                                 " 90: systemd would kill vLLM (SIGKILL) before it has drained its requests"),
}


@pytest.fixture(scope="module")
def role_input_run(tmp_path_factory):
    """The role's profile entry point on one local host per case, in one ansible-playbook run."""
    directory = tmp_path_factory.mktemp("role-inputs")
    inventory = {"all": {"hosts": {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                          "vllm_fleet_profile": STABLE, **variables}
                                   for name, (variables, _) in ROLE_INPUT_CASES.items()}}}
    (directory / "inventory.yml").write_text(json.dumps(inventory))
    (directory / "play.yml").write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.import_role": {"name": "vllm_fleet.fleet.vllm_service", "tasks_from": "profile"}},
        {"ansible.builtin.debug": {"msg": "rendered {{ _vllm_fleet_service_rendered.results[0].config | to_json }}"}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(directory / "inventory.yml"),
                           str(directory / "play.yml")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    results: dict[str, list[dict]] = {}
    for task in json.loads(proc.stdout)["plays"][0]["tasks"]:
        for host, result in task["hosts"].items():
            results.setdefault(host, []).append(result)
    return results


@pytest.mark.parametrize("case", ROLE_INPUT_CASES)
def test_the_role_refuses_a_key_beginning_with_a_dash_and_a_stop_that_cannot_drain(role_input_run, case):
    expected = ROLE_INPUT_CASES[case][1]
    failed = [result for result in role_input_run[case] if result.get("failed")]
    if expected is None:  # the negative control: the same checks pass good values
        assert failed == [], failed
        config = json.loads(role_input_run[case][-1]["msg"].split(" ", 1)[1])
        assert config["shutdown-timeout"] == 30 and "api-key" not in config
    else:
        assert len(failed) == 1 and expected in " ".join(failed[0]["msg"].split()), failed
        assert GOOD_KEY not in json.dumps(role_input_run[case])


# --- a profile with staged weights ------------------------------------------------------------

def staged(**weights_and_args):
    prof = {key: value for key, value in STABLE.items() if key != "model"}
    prof["weights"] = {"name": "qwen3.6-35b-a3b-nvfp4", "revision": "2026-11-30"}
    return {**prof, **weights_and_args}


def test_a_profile_with_weights_serves_its_staged_directory_and_records_the_weights():
    result = build(SCHEMA_DOC, staged(), role_args=ROLE_ARGS, role_env=ROLE_ENV, models_dir="/opt/vllm-fleet/models/")
    assert result["config"]["model"] == "/opt/vllm-fleet/models/qwen3.6-35b-a3b-nvfp4@2026-11-30"
    # recorded as the plan gives it, so the known-good comparison compares the plan, not a path
    assert result["profile"]["weights"] == staged()["weights"] and "model" not in result["profile"]
    assert model_path(staged(), "/opt/vllm-fleet/models") == result["config"]["model"]
    assert model_path(STABLE, "/opt/vllm-fleet/models") == STABLE["model"]


def test_a_staged_model_needs_a_served_name_one_way_to_name_it_and_a_models_dir():
    unnamed = staged(serve_args={k: v for k, v in STABLE["serve_args"].items() if k != "served-model-name"})
    assert "a staged model needs serve_args.served-model-name" in one_error(unnamed, models_dir="/m")
    assert "give model (a path the site provides) or weights" in one_error(staged(model="/models/x"), models_dir="/m")
    assert "profile.weights.revision is required" in one_error(staged(weights={"name": "x"}), models_dir="/m")
    assert one_error(staged()) == "profile.weights: staged models need models_dir (vllm_fleet_models_dir)"
    # negative control: the same profile with its served name and a models_dir builds
    build(SCHEMA_DOC, staged(), role_args=ROLE_ARGS, role_env=ROLE_ENV, models_dir="/m")
