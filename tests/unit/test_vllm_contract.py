"""What vllm-fleet says about vLLM 0.25.1 agrees with the real one (issue 31, item 1).

catalogue/vllm_contract.json is generated from the sha256-pinned wheel by scripts/vllm-contract
(its real parsers run, its sources read); `make check-real` regenerates it and fails on any
difference. These tests hold to it, offline (no network, no real vLLM): the serve-args schema
(catalogue/vllm_serve_args.yml), the shipped profiles, the service unit's environment and the
stand-in (tests/fixtures/vllm_standin: its `vllm serve` parser, config-file rule, sizes,
metrics and `vllm bench serve` result). One named test per mismatch the issue lists.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import soak_bench
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak import SoakConfig
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.serve_config import (
    ProfileError,
    build,
    load_schema,
    size_value,
    validate_env,
    validate_serve_args,
)
# The stand-in as tests/unit/test_vllm_standin.py builds and runs it: imported in-process
# (standin), and served on a fake GPU (gpu, healthy) for its bench.
from tests.unit.test_vllm_standin import _bench, gpu, healthy, standin, tokenizer_dir  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = json.loads((ROOT / "catalogue" / "vllm_contract.json").read_text())
SCHEMA_DOC = yaml.safe_load((ROOT / "catalogue" / "vllm_serve_args.yml").read_text())
PROFILES = sorted((ROOT / "profiles").glob("*.yml"))
REAL_BENCH = ROOT / "tests" / "fixtures" / "vllm_bench_real"
VERSION = CONTRACT["vllm"]["version"]
SERVE = CONTRACT["serve_flags"]["flags"]
BENCH = CONTRACT["bench_serve_flags"]["flags"]
ENV_NAMES = frozenset(CONTRACT["env"]["names"])
# The script's own rule for turning a parsed value into the contract's JSON form.
_loader = SourceFileLoader("vllm_contract", str(ROOT / "scripts" / "vllm-contract"))
GENERATOR = module_from_spec(spec_from_loader("vllm_contract", _loader))
_loader.exec_module(GENERATOR)

# The schema's types, and the kinds of real flag (the contract's "kind") that take such a value
# as the config file writes it: one word, or for a list one word per item.
COMPATIBLE = {"bool": {"bool"}, "int": {"int", "size"}, "float": {"float"}, "str": {"str"}, "size": {"size"},
              "list": {"list"}, "json": {"json"}}
# The variables issue 31 found in the schema's known list that 0.25.1 does not read.
GONE_ENV = ("VLLM_ATTENTION_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP8",
            "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_RPC_TIMEOUT", "VLLM_TORCH_PROFILER_DIR", "VLLM_USE_TRITON_FLASH_ATTN")


# ---------------------------------------------------------------- the contract itself


def test_the_contract_names_its_wheel_and_how_each_part_was_obtained():
    assert CONTRACT["vllm"] == {"version": "0.25.1", "wheel": "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl",
                                "sha256": GENERATOR.WHEEL_SHA256}
    assert "never edit by hand" in CONTRACT["_header"]
    hows = {name: part["how"] for name, part in CONTRACT.items() if isinstance(part, dict) and "how" in part}
    assert hows == {"serve_flags": "run", "serve_values": "run", "config_file": "run", "size_grammar": "run",
                    "env": "run", "bench_serve_flags": "run", "env_defaults": "read", "metrics": "read",
                    "bench_result": "read", "http": "read"}
    # Exactly as the script writes it (sorted keys, one indent): a hand edit that reformats shows
    # here; one that changes a value shows in make check-real, which regenerates it from the wheel.
    assert (ROOT / "catalogue" / "vllm_contract.json").read_text() == GENERATOR.dump(CONTRACT)


def test_the_contract_holds_what_the_fleet_relies_on():
    """A few facts the fleet is built on, as the wheel gave them (DESIGN.md): if the generator
    stopped seeing them, these would go, not silently pass."""
    assert SERVE["api-key"]["nargs"] == "+" and SERVE["served-model-name"]["nargs"] == "+"
    assert SERVE["enable-prefix-caching"]["negatable"] and not SERVE["disable-log-stats"]["negatable"]
    assert SERVE["shutdown-timeout"]["default"] == 0
    probes = CONTRACT["config_file"]["probes"]
    assert probes["command_line_wins"]["value"] == 8 and probes["config_value"]["value"] == 64
    assert probes["value_beginning_with_a_dash"]["exit"] == 2
    assert probes["load_config_file"]["expanded"][:1] == ["--enforce-eager"]  # false dropped, true the flag
    http = {(r["path"], r["method"]): r["needs_key"] for r in CONTRACT["http"]["routes"]
            if r["source"] != "vllm/entrypoints/openai/dp_supervisor.py"}
    assert http[("/health", "GET")] is False and http[("/metrics", "MOUNT")] is False
    assert http[("/v1/models", "GET")] is True and http[("/v1/completions", "POST")] is True
    assert CONTRACT["bench_result"]["request_timeout"]["total_seconds"] == 6 * 3600
    assert BENCH["ready-check-timeout-sec"]["default"] == 0


# ---------------------------------------------------------------- the serve-args schema


def _real_choices(name: str) -> list | None:
    """The values the real vllm serve takes for a flag: argparse's choices, or where argparse
    takes any string and the engine checks it later (load-format), the registry it checks."""
    if SERVE[name]["choices"] is not None:
        return SERVE[name]["choices"]
    return CONTRACT["serve_values"].get(name, {}).get("values")


def schema_disagreements(schema_doc: dict) -> list[str]:
    """Where a serve-args schema document says what the real vllm serve does not."""
    schema = load_schema(schema_doc)
    problems = []
    for name, flag in schema.flags.items():
        real = SERVE.get(name)
        if real is None:
            problems.append(f"--{name}: vllm serve {VERSION} has no such flag (it exits 2)")
            continue
        one_of_a_list = real["kind"] == "list" and flag.type == real["element"]  # one value of a nargs + flag
        if real["kind"] not in COMPATIBLE[flag.type] and not one_of_a_list:
            problems.append(f"--{name}: type {flag.type} here, {real['kind']} ({real['type']}) in vLLM {VERSION}")
        if flag.type == "list" and real["kind"] == "list" and flag.elements != real["element"]:
            problems.append(f"--{name}: elements {flag.elements} here, {real['element']} in vLLM {VERSION}")
        choices = _real_choices(name)
        if choices is not None and sorted(map(str, flag.choices)) != sorted(map(str, choices)):
            problems.append(f"--{name}: choices {sorted(map(str, flag.choices)) or 'any'} here, "
                            f"{choices} in vLLM {VERSION}")
        if flag.negatable != real["negatable"]:
            problems.append(f"--{name}: negatable {flag.negatable} here; vLLM {VERSION} "
                            f"{'has' if real['negatable'] else 'has no'} --no-{name}")
    problems += [f"env.known: vLLM {VERSION} does not read {name}" for name in schema.known_env
                 if name not in ENV_NAMES]
    return problems


def test_the_schema_agrees_with_the_real_parser():
    assert schema_disagreements(SCHEMA_DOC) == []


@pytest.mark.parametrize("change, expected", [
    (lambda doc: doc["flags"].__setitem__("enable-magic", {"type": "bool"}),
     "--enable-magic: vllm serve 0.25.1 has no such flag (it exits 2)"),
    (lambda doc: doc["flags"]["tokenizer"].__setitem__("type", "int"),
     "--tokenizer: type int here, str (str) in vLLM 0.25.1"),
    (lambda doc: doc["flags"]["dtype"].__setitem__("choices", ["auto", "half"]), "--dtype: choices ['auto', 'half'] here"),
    (lambda doc: doc["flags"]["enforce-eager"].__setitem__("negatable", False),
     "--enforce-eager: negatable False here; vLLM 0.25.1 has --no-enforce-eager"),
    (lambda doc: doc["env"]["known"].append("VLLM_NOT_A_THING"), "env.known: vLLM 0.25.1 does not read VLLM_NOT_A_THING"),
], ids=["unknown-flag", "type", "choices", "negatable", "env-name"])
def test_the_agreement_check_catches_a_schema_that_says_more_than_the_real_one(change, expected):
    """Negative control: a copy of the schema with one thing the contract lacks."""
    doc = copy.deepcopy(SCHEMA_DOC)
    change(doc)
    before = schema_disagreements(SCHEMA_DOC)
    added = [p for p in schema_disagreements(doc) if p not in before]
    assert len(added) == 1 and added[0].startswith(expected), added


def test_sizes_the_schema_accepts_parse_in_the_real_grammar():
    """Every probe of the real size parsers: where the schema takes the text, vLLM takes it too,
    as the same number (the schema may refuse more: '-1', 'auto')."""
    checked = 0
    for flag, probes in CONTRACT["size_grammar"]["probes"].items():
        for text, real in probes.items():
            ours = size_value(text)
            if ours is not None:
                assert real.get("ok") and real["value"] == ours, (flag, text, ours, real)
                checked += 1
    assert checked >= 20


def _errors(serve_args: dict) -> list[str]:
    return validate_serve_args(load_schema(SCHEMA_DOC), serve_args, role_args={"host": "0.0.0.0", "port": 8000})[1]


# ---------------------------------------------------------------- the profiles


def _profile_flag(key: str) -> str:
    """A profile key as vLLM reads it from the config file: --key, or --no-key's flag."""
    name = key.replace("_", "-")
    return name[3:] if name.startswith("no-") and SERVE.get(name[3:], {}).get("negatable") else name


def profile_problems(profile: dict) -> list[str]:
    """The serve args, values among real choices and VLLM_* variables of a profile that the real
    vLLM does not know."""
    problems = []
    for key, value in (profile.get("serve_args") or {}).items():
        name = _profile_flag(key)
        if name not in SERVE:
            problems.append(f"serve_args.{key}: vllm serve {VERSION} has no --{name}")
            continue
        choices = _real_choices(name)
        values = value if isinstance(value, list) else [value]
        if choices is not None and not all(str(v) in map(str, choices) for v in values):
            problems.append(f"serve_args.{key}: {value!r} is not among vLLM {VERSION}'s choices")
    problems += [f"env.{name}: vLLM {VERSION} does not read it" for name in profile.get("env") or {}
                 if name.startswith("VLLM_") and name not in ENV_NAMES]
    return problems


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_shipped_profile_sets_only_what_real_vllm_reads(path):
    assert profile_problems(yaml.safe_load(path.read_text())) == []


def test_the_profile_check_catches_what_real_vllm_does_not_read():
    """Negative control: a composed profile with a gone flag, a gone choice and a gone variable."""
    assert profile_problems({"serve_args": {"swap-space": 4, "load-format": "gguf", "no-enforce-eager": True},
                             "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER", "CUDA_LAUNCH_BLOCKING": "1"}}) == [
        "serve_args.swap-space: vllm serve 0.25.1 has no --swap-space",
        "serve_args.load-format: 'gguf' is not among vLLM 0.25.1's choices",
        "env.VLLM_ATTENTION_BACKEND: vLLM 0.25.1 does not read it"]


# ---------------------------------------------------------------- the service unit's environment


def unit_env_names(text: str) -> set[str]:
    """The names a systemd unit (or its template) sets with Environment= lines."""
    names = set()
    for line in text.splitlines():
        if line.strip().startswith("Environment="):
            for word in shlex.split(line.strip()[len("Environment="):]):
                names.add(word.split("=", 1)[0])
    return names


def role_env_names(node) -> set[str]:
    """The names of every role_env mapping (serve_config's argument: what each instance's
    EnvironmentFile gets besides the profile's env) anywhere in a tasks document."""
    if isinstance(node, list):
        return set().union(*map(role_env_names, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = set(node["role_env"]) if isinstance(node.get("role_env"), dict) else set()
    return found.union(*map(role_env_names, node.values()))


def instance_env_names() -> set[str]:
    """Every name the service role puts in an instance's environment: the units' Environment=
    lines and the role_env it renders into each instance's EnvironmentFile."""
    names = set()
    for unit in ROOT.glob("roles/*/templates/*.service*"):
        names |= unit_env_names(unit.read_text())
    for tasks in ROOT.glob("roles/*/tasks/*.yml"):
        names |= role_env_names(yaml.safe_load(tasks.read_text()))
    return names


def test_vllm_fleet_health_url_is_not_in_the_instance_environment():
    """Real 0.25.1 logs 'Unknown vLLM environment variable detected' for every VLLM_* name it
    does not read, at every start (vllm/envs.py validate_environ)."""
    assert "VLLM_FLEET_HEALTH_URL" not in ENV_NAMES
    names = instance_env_names()
    assert {"CUDA_VISIBLE_DEVICES", "VLLM_CACHE_ROOT"} <= names  # the scan sees role_env and the unit
    unknown = sorted(n for n in names if n.startswith("VLLM_") and n not in ENV_NAMES)
    assert unknown == [], f"the instance environment sets {unknown}, which vLLM {VERSION} does not read"
    # Negative controls: where the role had it before (role_env, before caf5ac6), and a unit line.
    tasks = [{"block": [{"vllm_fleet.fleet.serve_config": {"role_env": {
        "CUDA_VISIBLE_DEVICES": "0", "VLLM_FLEET_HEALTH_URL": "http://127.0.0.1:8000/health"}}}]}]
    assert role_env_names(tasks) == {"CUDA_VISIBLE_DEVICES", "VLLM_FLEET_HEALTH_URL"}
    assert unit_env_names("Environment=VLLM_FLEET_HEALTH_URL=http://127.0.0.1:8000/health\n") == {
        "VLLM_FLEET_HEALTH_URL"}


# ---------------------------------------------------------------- each mismatch of issue 31


def _standin_fails(standin, *argv: str) -> int | str:
    with pytest.raises(SystemExit) as exited:
        standin.cli.parse_args(["serve", "/models/m", *argv])
    return exited.value.code


@pytest.mark.parametrize("flag, value", [("swap-space", "4"), ("disable-log-requests", None)],
                         ids=["swap-space", "disable-log-requests"])
def test_flags_real_0_25_1_lacks_are_refused(standin, flag, value):
    """--swap-space and --disable-log-requests make the real vllm serve exit 2 (a unit that
    restarts until its start limit): the schema refuses them, the stand-in exits 2 too."""
    assert flag not in SERVE
    assert flag not in SCHEMA_DOC["flags"]
    errors = _errors({flag: 4 if value else True})
    assert len(errors) == 1 and f"unknown flag --{flag}" in errors[0], errors
    assert _standin_fails(standin, f"--{flag}", *([value] if value else [])) == 2


def test_load_format_choices_are_the_real_loaders():
    """vllm/model_executor/model_loader/__init__.py: no gguf in 0.25.1; hf, instanttensor,
    modelexpress and runai_streamer_sharded are new."""
    real = CONTRACT["serve_values"]["load-format"]["values"]
    assert "gguf" not in real and {"hf", "instanttensor", "modelexpress", "runai_streamer_sharded"} <= set(real)
    assert sorted(SCHEMA_DOC["flags"]["load-format"]["choices"]) == real
    assert any("is not one of" in e for e in _errors({"load-format": "gguf"}))
    assert _errors({"load-format": "runai_streamer_sharded"}) == []


def test_moe_backend_has_the_real_choices(standin):
    """The real --moe-backend lower-cases its value, turns - into _, then checks argparse choices."""
    real = SERVE["moe-backend"]["choices"]
    assert real and "marlin" in real and SERVE["moe-backend"]["type"].startswith("lambda: s.lower()")
    assert sorted(SCHEMA_DOC["flags"]["moe-backend"].get("choices", [])) == real
    assert any("is not one of" in e for e in _errors({"moe-backend": "no-such-backend"}))
    assert _standin_fails(standin, "--moe-backend", "no-such-backend") == 2
    for choice in real:
        assert standin.cli.parse_args(["serve", "/models/m", "--moe-backend", choice]).moe_backend == choice
    assert standin.cli.parse_args(["serve", "/models/m", "--moe-backend", "Flashinfer-B12X"]).moe_backend == (
        "flashinfer_b12x")  # lower-cased, - as _, as the real type function does


def test_sizes_like_1_5K_are_refused(standin):
    """Decimals with a binary suffix are an error in vLLM's human_readable_int."""
    real = CONTRACT["size_grammar"]["probes"]["max-num-batched-tokens"]
    assert real["1.5K"]["exit"] == 2 and "Decimals are not allowed" in real["1.5K"]["error"]
    assert real["25.6k"]["value"] == 25600 and real["256K"]["value"] == 262144
    assert size_value("1.5K") is None
    assert any("expects a size" in e for e in _errors({"max-num-batched-tokens": "1.5K"}))
    assert _standin_fails(standin, "--max-num-batched-tokens", "1.5K") == 2


def test_disable_log_stats_is_refused_by_the_schema():
    """In 0.25.1 --disable-log-stats removes every vllm:* metric (vllm/v1/engine/async_llm.py):
    the watchdog, the soak and the bake would be blind. A profile may not set it."""
    assert SERVE["disable-log-stats"]["action"] == "store_true"
    errors = _errors({"disable-log-stats": True})
    assert len(errors) == 1 and errors[0].startswith("serve_args.disable-log-stats: "), errors
    with pytest.raises(ProfileError, match="disable-log-stats"):
        build(SCHEMA_DOC, {"name": "blind", "model": "/models/m", "serve_args": {"disable-log-stats": True}},
              role_args={"host": "0.0.0.0", "port": 8000})


@pytest.mark.parametrize("name", GONE_ENV)
def test_env_names_real_0_25_1_does_not_read_are_not_known(name):
    """A profile setting one gets the warning, not silence."""
    assert name not in ENV_NAMES
    assert name not in SCHEMA_DOC["env"]["known"]
    _, errors, warnings = validate_env(load_schema(SCHEMA_DOC), {name: "1"})
    assert errors == [] and len(warnings) == 1 and f"does not read {name}" in warnings[0]


# ---------------------------------------------------------------- the stand-in's vllm serve


def _subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _standin_parser(standin, *names: str) -> argparse.ArgumentParser:
    built = standin.cli.build_parser()
    return _subparser(built[0] if isinstance(built, tuple) else built, *names)


def _sample_argv(name: str, flag: dict) -> list[str]:
    """One valid use of a schema flag on a command line."""
    kind = flag["type"]
    if kind == "bool":
        return [f"--{name}"]
    value = {"int": str(flag.get("min", 1) or 1), "float": "0.5", "size": "1k", "str": "x", "json": "{}",
             "list": "1" if flag.get("elements") == "int" else "x"}[kind]
    choices = flag.get("choices") or []
    return [f"--{name}", str(choices[0]) if choices else value]


def test_the_standin_accepts_every_flag_the_schema_allows(standin):
    for name, flag in SCHEMA_DOC["flags"].items():
        if name == "config":
            continue  # a file: the config-file probes below
        argv = _sample_argv(name, flag)
        # --model MODEL takes the positional's place (FlexibleArgumentParser), so not both.
        standin.cli.parse_args(["serve", *argv] if name == "model" else ["serve", "/models/m", *argv])
        if flag.get("negatable"):
            assert getattr(standin.cli.parse_args(["serve", "/models/m", f"--no-{name}"]),
                           SERVE[name]["dest"]) is False


def standin_flag_problems(serve: argparse.ArgumentParser) -> list[str]:
    """For each flag the schema allows: the real action (store_true or the --no- form), nargs,
    choices, destination and default (the server logs every argument that differs from its
    default, as the real one does); and no option the real parser lacks."""
    actions = {o[2:]: a for a in serve._actions for o in a.option_strings if o.startswith("--")}
    problems = []
    for name in SCHEMA_DOC["flags"]:
        action, real = actions.get(name), SERVE.get(name)
        if real is None:
            continue  # not a real flag: test_the_schema_agrees_with_the_real_parser says so
        if action is None:
            problems.append(f"--{name}: the stand-in has no such flag")
            continue
        ours = {"negatable": isinstance(action, argparse.BooleanOptionalAction), "nargs": action.nargs,
                "choices": None if action.choices is None else sorted(map(str, action.choices)), "dest": action.dest,
                "default": GENERATOR.plain(action.default)}
        theirs = {**real, "choices": None if real["choices"] is None else sorted(map(str, real["choices"]))}
        if isinstance(real["default"], dict) and "object" in real["default"]:
            del ours["default"]  # an object built for the platform vLLM runs on: not comparable
        problems += [f"--{name}: {key} {value!r} in the stand-in, {theirs[key]!r} in vLLM {VERSION}"
                     for key, value in ours.items() if value != theirs[key]]
    known = {f"--{n}" for n in SERVE} | {f"--no-{n}" for n, f in SERVE.items() if f["negatable"]} | {
        a for f in SERVE.values() for a in f["aliases"]} | {"-h", "--help"}
    problems += [f"{o}: the stand-in takes it, the real vllm serve {VERSION} exits 2"
                 for a in serve._actions for o in a.option_strings if o not in known]
    return problems


def test_the_standin_flags_are_the_real_ones(standin):
    assert standin_flag_problems(_standin_parser(standin, "serve")) == []


def test_the_standin_flag_check_catches_a_flag_the_real_one_lacks(standin):
    """Negative control: the stand-in's parser with --swap-space added, and a choice taken away."""
    serve = _standin_parser(standin, "serve")
    serve.add_argument("--swap-space", type=float, default=4)
    next(a for a in serve._actions if a.dest == "dtype").choices = ("auto",)
    problems = standin_flag_problems(serve)
    assert f"--dtype: choices ['auto'] in the stand-in, {SERVE['dtype']['choices']!r} in vLLM 0.25.1" in problems
    assert "--swap-space: the stand-in takes it, the real vllm serve 0.25.1 exits 2" in problems


CONFIG_PROBES = {k: v for k, v in CONTRACT["config_file"]["probes"].items() if "argv" in v and "yaml" in v
                 and "dest" in v}


@pytest.mark.parametrize("probe", sorted(CONFIG_PROBES))
def test_the_standin_reads_config_files_as_the_real_parser(standin, tmp_path, probe):
    """Each file the generator gave the real FlexibleArgumentParser, given to the stand-in:
    same value, or the same failure (argparse's exit 2, or an error before argparse)."""
    real = CONFIG_PROBES[probe]
    argv = []
    for word in real["argv"]:
        if word == "MODEL":
            word = "m"  # as the generator gave it
        elif re.fullmatch(r"(--config=)?FILE\.\w+", word):
            path = tmp_path / ("f." + word.rsplit(".", 1)[1])
            path.write_text(real["yaml"])
            word = word.replace(word.split("=")[-1], str(path))
        argv.append(word)
    try:
        namespace = standin.cli.parse_args(argv)
    except SystemExit as exc:
        outcome = ("exit", exc.code)
    except Exception as exc:  # the real parser's ValueError, for one
        outcome = ("exception", type(exc).__name__)
    else:
        outcome = ("ok", GENERATOR.plain(getattr(namespace, real["dest"])))
    if "exception" in real:  # an error before argparse: the same exception, or an exit with a message
        assert outcome == ("exception", real["exception"]) or (
            outcome[0] == "exit" and outcome[1] not in (0, None, 2)), (probe, outcome, real)
    else:
        assert outcome == (("ok", real["value"]) if real.get("ok") else ("exit", real["exit"])), (probe, real)


def test_the_standin_reads_sizes_as_the_real_parser(standin):
    for flag, probes in CONTRACT["size_grammar"]["probes"].items():
        dest = SERVE[flag]["dest"]
        for text, real in probes.items():
            if real.get("ok"):
                assert getattr(standin.cli.parse_args(["serve", "/models/m", f"--{flag}", text]), dest) == real["value"]
            else:
                assert _standin_fails(standin, f"--{flag}", text) == real["exit"], (flag, text)


# ---------------------------------------------------------------- metrics


SAMPLE = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? \S+")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_disagreements(exposition: str) -> list[str]:
    """Where a /metrics text's vllm:* samples differ from the real names and labels."""
    metrics = CONTRACT["metrics"]["names"]
    by_sample = {s: (name, m) for name, m in metrics.items() for s in m["samples"]}
    values = {label: set(v["values"]) for label, v in CONTRACT["metrics"]["label_values"].items()}
    seen: dict[str, set] = {}
    problems = []
    for line in exposition.splitlines():
        match = SAMPLE.fullmatch(line)
        if not match or not match["name"].startswith("vllm:"):
            continue
        name = match["name"]
        if name not in by_sample:
            problems.append(f"{name}: not a series of vLLM {VERSION}")
            continue
        labels = dict(LABEL.findall(match["labels"] or ""))
        if name.endswith("_bucket"):
            labels.pop("le", None)
        metric, real = by_sample[name]
        if real["labels"] is not None and sorted(labels) != sorted(real["labels"]):
            problems.append(f"{name}: labels {sorted(labels)}, in vLLM {VERSION} {sorted(real['labels'])}")
        for label, value in labels.items():
            seen.setdefault(label, set()).add(value)
    for label, real in values.items():
        if label in seen and seen[label] != real:
            problems.append(f"{label}: values {sorted(seen[label])}, in vLLM {VERSION} {sorted(real)} "
                            "(each is created at start, so /metrics lists them all)")
    return problems


def test_the_standin_metrics_are_the_real_names_and_labels(standin):
    text = standin.metrics.Metrics("qwen-test").render(running=1, waiting=2, kv_usage=0.5)
    assert "vllm:generation_tokens_total{" in text
    assert metric_disagreements(text) == []


def test_the_metrics_check_catches_a_name_or_label_the_real_one_lacks():
    """Negative control."""
    assert metric_disagreements('vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.5\n') == [
        "vllm:gpu_cache_usage_perc: not a series of vLLM 0.25.1"]
    assert metric_disagreements('vllm:num_requests_running{model_name="m"} 1.0\n') == [
        "vllm:num_requests_running: labels ['model_name'], in vLLM 0.25.1 ['engine', 'model_name']"]
    assert metric_disagreements('vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} 1\n'
                                ) == ["finished_reason: values ['stop'], in vLLM 0.25.1 "
                                      "['abort', 'error', 'length', 'repetition', 'stop'] "
                                      "(each is created at start, so /metrics lists them all)"]


def test_every_vllm_series_the_fleet_reads_is_real():
    """The watchdog, the soak, the gates, the alert rules and the catalogue name vllm:* series:
    each is one the real server exports."""
    samples = {s for m in CONTRACT["metrics"]["names"].values() for s in m["samples"]} | set(CONTRACT["metrics"]["names"])
    used = {}
    for folder in ("plugins", "roles", "catalogue", "examples", "src", "profiles"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yml", ".yaml", ".j2", ".json", ".md") \
                    and path.name != "vllm_contract.json":
                for name in re.findall(r"vllm:[a-z_]+[a-z]", path.read_text(errors="replace")):
                    used.setdefault(name, str(path.relative_to(ROOT)))
    assert len(used) >= 8
    assert {name: where for name, where in used.items() if name not in samples} == {}


# ---------------------------------------------------------------- vllm bench serve


# What --percentile-metrics defaults to for a generation run (vllm/benchmarks/serve.py main_async).
GENERATION_METRICS = CONTRACT["bench_result"]["default_percentile_metrics"]["task_type == TaskType.GENERATION"]


def bench_keys(metrics: str, percentiles: str, detailed: bool) -> set[str]:
    """The keys of the real bench's --save-result file for a generation run."""
    result = CONTRACT["bench_result"]
    keys = set(result["default_keys"]) | (set(result["detailed_only_keys"]) if detailed else set())
    for metric in metrics.split(","):
        for pattern in result["per_metric_keys"]:
            for p in (float(p) for p in percentiles.split(",")):
                word = str(int(p)) if int(p) == p else str(p)
                keys.add(pattern.replace("{metric_attribute_name}", metric).replace("{p_word}", word))
    return keys


def _option(argv: list[str], name: str, default):
    return argv[argv.index(name) + 1] if name in argv else default


@pytest.mark.parametrize("run", sorted(p.parent.name for p in REAL_BENCH.glob("*/result.json")))
def test_the_contract_bench_keys_are_those_of_the_captured_real_runs(run):
    """Cross-check of what was read from vllm/benchmarks/serve.py against files the real
    `vllm bench serve` wrote (tests/fixtures/vllm_bench_real, captured)."""
    argv = json.loads((REAL_BENCH / run / "run.json").read_text())["argv"]
    result = json.loads((REAL_BENCH / run / "result.json").read_text())
    expected = bench_keys(_option(argv, "--percentile-metrics", GENERATION_METRICS),
                          _option(argv, "--metric-percentiles", BENCH["metric-percentiles"]["default"]),
                          "--save-detailed" in argv)
    assert set(result) == expected


def test_the_standin_bench_takes_only_real_options(standin):
    """Every option of the stand-in's vllm bench serve is the real one's, with values among the
    real choices; it waits for the server as long as the real one by default."""
    bench = _standin_parser(standin, "bench", "serve")
    for action in bench._actions:
        longs = [o[2:] for o in action.option_strings if o.startswith("--")]
        if not longs or longs[0] == "help":
            continue
        real = BENCH.get(longs[0])
        assert real is not None, f"the real vllm bench serve has no --{longs[0]}"
        assert (action.nargs == 0) == (real["kind"] == "bool"), longs[0]
        if action.choices is not None:
            assert set(map(str, action.choices)) <= set(real["choices"] or ()), longs[0]
    assert bench.get_default("ready_check_timeout_sec") == BENCH["ready-check-timeout-sec"]["default"]


@pytest.mark.parametrize("detailed", [False, True], ids=["default", "save-detailed"])
def test_the_standin_bench_writes_the_real_keys(healthy, tmp_path, tokenizer_dir, detailed):
    """No `errors` and no per-request arrays unless --save-detailed; `rtfx` always."""
    result, _ = _bench(healthy, tmp_path, tokenizer_dir, "--model", "qwen-test", "--num-prompts", "2",
                       "--random-input-len", "5", "--random-output-len", "3", *(["--save-detailed"] if detailed else []))
    assert "rtfx" in result and ("errors" in result) is detailed and ("ttfts" in result) is detailed
    assert set(result) == bench_keys(GENERATION_METRICS, BENCH["metric-percentiles"]["default"], detailed)


def bench_argv_problems(argv: list[str]) -> list[str]:
    """Where a `vllm bench serve` command line says what the real parser refuses."""
    problems, words = [], iter(argv)
    for word in words:
        if not word.startswith("--"):
            problems.append(f"{word!r}: the real vllm bench serve takes no positional argument")
            continue
        real = BENCH.get(word[2:])
        if real is None:
            problems.append(f"{word}: the real vllm bench serve {VERSION} has no such option")
        elif real["kind"] != "bool":
            value = next(words, None)
            if value is None or (real["choices"] and value not in real["choices"]):
                problems.append(f"{word} {value}: not a value the real one takes")
    return problems


def test_the_soaks_bench_command_and_the_keys_it_reads_are_the_real_ones():
    """What the soak runs (soak_bench.bench_command) is a command line the real client takes, and
    every key it reads from the result is one the real client writes without --save-detailed."""
    cfg = SoakConfig(unit="vllm@gpu0", state_dir="/s", duration_s=60, venv="/opt/vllm-fleet/releases/r1",
                     model="/models/m", served_model_name="qwen", tokenizer="/models/m")
    argv = soak_bench.bench_command(cfg, 64, 7, "/s/bench", "run-001.raw.json")
    assert argv[1:3] == ["bench", "serve"] and bench_argv_problems(argv[3:]) == []
    written = bench_keys(_option(argv, "--percentile-metrics", GENERATION_METRICS),
                         _option(argv, "--metric-percentiles", BENCH["metric-percentiles"]["default"]),
                         "--save-detailed" in argv)
    read = set(soak_bench.BENCH_SUMMARY_KEYS) | set(soak_bench.THROUGHPUT_KEYS)
    assert read - written == set()
    # Negative controls: an option the real client lacks, a value outside its choices.
    assert bench_argv_problems(["--no-such-option", "--dataset-name", "nope"]) == [
        "--no-such-option: the real vllm bench serve 0.25.1 has no such option",
        "--dataset-name nope: not a value the real one takes"]
