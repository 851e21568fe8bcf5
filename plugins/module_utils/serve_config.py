# SPDX-License-Identifier: Apache-2.0
"""Serving profiles: validate them against a schema of ``vllm serve`` flags, render the
``vllm serve --config`` YAML and the systemd environment file.

A profile is ``{name, description, model, serve_args, env, baseline}`` (``profiles/*.yml``). The
schema is data (``catalogue/vllm_serve_args.yml``): flag name -> type, choices, range,
whether a boolean has a ``--no-`` form, and whether the service role owns the flag.

``vllm serve --config FILE`` turns ``key: true`` into ``--key`` and silently drops
``key: false``; so a false is written as ``no-key: true`` for flags that have that form,
and refused for flags that have none (nothing in the file could express it).

Plain Python on purpose (no ``ansible`` import, no PyYAML): the serve_config module is a
thin wrapper, tests/unit calls this directly, and the YAML is written as one
``key: <JSON value>`` line per flag, which every YAML parser reads back exactly.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.model_weights import (
    WeightsError, check_model, model_dirname)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.soak_stats import (
    SoakConfigError,
    validate_performance_spec,
)

SCHEMA_VERSION = 1
TYPES = ("bool", "int", "float", "str", "size", "list", "json")
FLAG_KEYS = ("type", "help", "negatable", "choices", "min", "max", "min_exclusive", "max_exclusive",
             "elements", "reserved")
PROFILE_REQUIRED = ("name",)
# model (a path or id the site provides) or weights (a model vllm-fleet stages), never both.
PROFILE_OPTIONAL = ("model", "weights", "description", "serve_args", "env", "baseline")
FLAG_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# vLLM's sizes (human_readable_int, vllm/utils/argparse_utils.py): digits; or a number and a
# suffix, k m g t (x1000, decimals allowed: 25.6k) or K M G T (x1024, whole numbers only: 1.5K
# is an error there).
SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT])\Z")
SIZE_DIGITS_RE = re.compile(r"[0-9]+\Z")
SIZE_SCALE = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
              "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Limits on what a profile may hold. vllm serve --config turns a string into one argv word and
# each list item into its own: a word that begins with '-' is read as a flag (so a list item
# "--api-key" would set the key the role owns), and a newline or control character has no
# business in a flag value, a model name or an environment file.
MAX_TEXT = 4096        # one string: a flag value, a list item, the model, an env value
MAX_NAME = 128         # the profile's name
MAX_ITEMS = 64         # items of a list flag
MAX_JSON = 65536       # a mapping flag, written as JSON
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class SchemaError(ValueError):
    """The serve-args schema does not follow its own format; the message names the flag."""


class ProfileError(ValueError):
    """The profile cannot be served as given; ``errors`` holds one readable line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class Flag:
    name: str
    type: str
    help: str = ""
    negatable: bool = False
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    elements: str = "str"
    reserved: str | None = None


@dataclass(frozen=True)
class Schema:
    vllm: str
    flags: dict[str, Flag]
    known_env: tuple[str, ...] = field(default=())


def normalise_flag(name: str) -> str:
    """``--kv_cache_dtype`` and ``kv-cache-dtype`` name the same vLLM flag."""
    return name.strip().lstrip("-").replace("_", "-")


def _closest(word: str, candidates, what: str = "did you mean", cutoff: float = 0.6) -> str:
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return f" ({what} {found[0]!r}?)" if found else ""


def text_problem(text: str, *, limit: int = MAX_TEXT, flag_like: bool = True) -> str | None:
    """Why ``text`` cannot be a value here, or None: too long, a control character (a newline
    included), or, where it becomes an argv word (``flag_like``), a leading '-'."""
    if len(text) > limit:
        return f"is {len(text)} characters long: at most {limit} are allowed"
    bad = CONTROL_RE.search(text)
    if bad:
        return (f"{_show(text)} holds the control character {bad.group()!r} at offset {bad.start()}: "
                "a value is one line of printable text")
    if flag_like and text.lstrip().startswith("-"):
        return (f"{_show(text)} begins with '-': vllm serve --config passes each value as its own "
                "argument, where it would be read as a flag; a value may not begin with '-'")
    return None


def _nested_problem(value: Any, path: str = "") -> str | None:
    """Control characters, long strings or flag spellings anywhere in a JSON value; the
    problem names where (``at .a.b[0]``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{_label(key)}"
            problem = text_problem(key, flag_like=False) if isinstance(key, str) else None
            if problem:
                return f"at {where} (a key): {problem}"
            problem = _nested_problem(item, where)
            if problem:
                return problem
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problem = _nested_problem(item, f"{path}[{i}]")
            if problem:
                return problem
    elif isinstance(value, str):
        # The mapping is one argv word (JSON), but a string in it that spells a flag is refused too.
        problem = text_problem(value, flag_like=False)
        if not problem and value.lstrip().startswith("--"):
            problem = f"{_show(value)} spells a flag: a value may not begin with '--'"
        if problem:
            return f"at {path or '.'}: {problem}"
    return None


def _label(key: Any) -> str:
    """A key as a message may show it: as written, or quoted when it holds a control character."""
    text = str(key)
    return text if not CONTROL_RE.search(text) and len(text) <= 80 else _show(text)


# --- the schema ----------------------------------------------------------------------------

def _schema_bound(where: str, key: str, value: Any) -> float | None:
    """A flag's min or max as the schema gives it: a number, or None where unbounded."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where}: {key} {value!r} is not a number")
    return value


def _flag(name: Any, raw: Any) -> Flag:
    where = f"serve-args schema: flag {name!r}"
    if not isinstance(name, str) or not FLAG_RE.match(name):
        raise SchemaError(f"{where}: a flag is named by its long form without dashes in front, "
                          "lower case (for example 'max-num-seqs')")
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: {raw!r} is not a mapping (type, choices, min, max, ...)")
    unknown = [k for k in raw if k not in FLAG_KEYS]
    if unknown:
        raise SchemaError(f"{where}: unknown key {unknown[0]!r}{_closest(str(unknown[0]), FLAG_KEYS)}; "
                          f"allowed: {', '.join(FLAG_KEYS)}")
    kind = raw.get("type")
    if kind not in TYPES:
        raise SchemaError(f"{where}: type {kind!r} is not one of: {', '.join(TYPES)}")
    negatable = raw.get("negatable", False)
    if not isinstance(negatable, bool) or (negatable and kind != "bool"):
        raise SchemaError(f"{where}: negatable is a boolean, and only for type bool")
    choices = raw.get("choices", [])
    if not isinstance(choices, list) or (choices and kind not in ("str", "int", "list")):
        raise SchemaError(f"{where}: choices is a list, for types str, int and list")
    elements = raw.get("elements", "str")
    if elements not in ("str", "int"):
        raise SchemaError(f"{where}: elements {elements!r} is not one of: str, int")
    if (raw.get("min") is not None or raw.get("max") is not None) and kind not in ("int", "float", "size"):
        raise SchemaError(f"{where}: min and max are for types int, float and size")
    for key in ("min_exclusive", "max_exclusive"):
        if not isinstance(raw.get(key, False), bool):
            raise SchemaError(f"{where}: {key} is a boolean")
    reserved = raw.get("reserved")
    if reserved is not None and (not isinstance(reserved, str) or not reserved.strip()):
        raise SchemaError(f"{where}: reserved is a sentence saying where the flag is set instead")
    helptext = raw.get("help", "")
    if not isinstance(helptext, str):
        raise SchemaError(f"{where}: help is a string")
    return Flag(name=name, type=kind, help=helptext, negatable=negatable, choices=tuple(choices),
                min=_schema_bound(where, "min", raw.get("min")), max=_schema_bound(where, "max", raw.get("max")),
                min_exclusive=raw.get("min_exclusive", False), max_exclusive=raw.get("max_exclusive", False),
                elements=elements, reserved=reserved)


def load_schema(data: Any) -> Schema:
    """Validate the parsed schema document (``catalogue/vllm_serve_args.yml``)."""
    if not isinstance(data, dict):
        raise SchemaError("serve-args schema: the document is a mapping with schema_version, vllm, flags")
    unknown = [k for k in data if k not in ("schema_version", "vllm", "flags", "env")]
    if unknown:
        raise SchemaError(f"serve-args schema: unknown key {unknown[0]!r}; allowed: schema_version, vllm, flags, env")
    version = data.get("schema_version")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise SchemaError(f"serve-args schema: schema_version {version!r} is not supported (supported: {SCHEMA_VERSION})")
    flags = data.get("flags")
    if not isinstance(flags, dict) or not flags:
        raise SchemaError("serve-args schema: flags is a non-empty mapping of flag name to its description")
    env = data.get("env") or {}
    known_env = env.get("known", []) if isinstance(env, dict) else None
    if not isinstance(known_env, list) or not all(isinstance(n, str) and ENV_NAME_RE.match(n) for n in known_env):
        raise SchemaError("serve-args schema: env.known is a list of environment variable names")
    return Schema(vllm=str(data.get("vllm", "")), flags={name: _flag(name, raw) for name, raw in flags.items()},
                  known_env=tuple(known_env))


# --- values --------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, int, float, type(None))) else repr(value)


def _show_number(number: float) -> str:
    return str(number) if isinstance(number, int) else f"{number:g}"


def _range(flag: Flag, number: float) -> str | None:
    low = flag.min is not None and (number <= flag.min if flag.min_exclusive else number < flag.min)
    high = flag.max is not None and (number >= flag.max if flag.max_exclusive else number > flag.max)
    if not (low or high):
        return None
    bounds = []
    if flag.min is not None:
        bounds.append(f"{'>' if flag.min_exclusive else '>='} {_show_number(flag.min)}")
    if flag.max is not None:
        bounds.append(f"{'<' if flag.max_exclusive else '<='} {_show_number(flag.max)}")
    return f"{_show_number(number)} is out of range: it must be {' and '.join(bounds)}"


def size_value(value: Any) -> int | None:
    """262144 -> 262144, '256k' -> 256000, '256K' -> 262144, '25.6k' -> 25600; None when vLLM
    would refuse it ('1.5K', '1.5', 1.5)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip()
    if SIZE_DIGITS_RE.match(text):
        return int(text)
    match = SIZE_RE.match(text)
    if not match:
        return None
    number, suffix = match.groups()
    if suffix.isupper():
        return int(number) * SIZE_SCALE[suffix] if "." not in number else None
    return int(float(number) * SIZE_SCALE[suffix])


def _choice(flag: Flag, value: Any) -> str | None:
    if not flag.choices or value in flag.choices:
        return None
    hint = _closest(str(value), [str(c) for c in flag.choices]) if isinstance(value, str) else ""
    return f"{_show(value)} is not one of: {', '.join(str(c) for c in flag.choices)}{hint}"


def check_value(flag: Flag, value: Any) -> str | None:
    """Why ``value`` is not a valid value for ``flag``, or None."""
    kind = flag.type
    if kind == "bool":
        if not isinstance(value, bool):
            return f"expects a boolean (true or false, unquoted), got {_type_name(value)} {_show(value)}"
        return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expects an integer, got {_type_name(value)} {_show(value)}"
        return _choice(flag, value) or _range(flag, value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expects a number, got {_type_name(value)} {_show(value)}"
        if not math.isfinite(value):
            return f"expects a finite number, got {value!r}"
        return _range(flag, value)
    if kind == "size":
        number = size_value(value)
        if number is None:
            return (f"expects a size (an integer, or a string like \"256k\" (x1000, \"25.6k\" too) or "
                    f"\"256K\" (x1024, whole numbers only)), got {_type_name(value)} {_show(value)}")
        return _range(flag, number)
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            return f"expects a non-empty string, got {_type_name(value)} {_show(value)}"
        return text_problem(value) or _choice(flag, value)
    if kind == "list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            return f"expects a non-empty list (or one string), got {_type_name(value)} {_show(value)}"
        if len(items) > MAX_ITEMS:
            return f"has {len(items)} items: at most {MAX_ITEMS} are allowed"
        element = Flag(name=flag.name, type=flag.elements, choices=flag.choices)
        for i, item in enumerate(items):
            problem = check_value(element, item)
            if problem:
                return f"item {i}: {problem}"
        return None
    # json: a mapping, written as JSON (vLLM parses --compilation-config and friends as JSON)
    if not isinstance(value, dict):
        return f"expects a mapping (written as JSON), got {_type_name(value)} {_show(value)}"
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"cannot be written as JSON: {exc}"
    if len(text) > MAX_JSON:
        return f"is {len(text)} characters long as JSON: at most {MAX_JSON} are allowed"
    return _nested_problem(value)


# --- serve args ----------------------------------------------------------------------------

def _resolve(schema: Schema, key: Any) -> tuple[str | None, bool, str | None]:
    """(flag name, negated, error) for a profile key: 'no-enable-prefix-caching' -> (name, True)."""
    if not isinstance(key, str) or not key.strip():
        return None, False, f"{key!r} is not a flag name"
    name = normalise_flag(key)
    if name in schema.flags:
        return name, False, None
    if name.startswith("no-") and name[3:] in schema.flags:
        base = schema.flags[name[3:]]
        if base.type == "bool" and base.negatable:
            return base.name, True, None
        return None, False, (f"--{name}: vLLM {schema.vllm} has no such flag: --{base.name} has no --no- form"
                             + (" (leave it out to keep it off)" if base.type == "bool" else ""))
    known = [f.name for f in schema.flags.values() if not f.reserved]
    known += [f"no-{f.name}" for f in schema.flags.values() if f.negatable]
    return None, False, f"unknown flag --{_label(name)} for vllm serve {schema.vllm}{_closest_flag(name, known)}"


def _closest_flag(name: str, known) -> str:
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean --{found[0]}?)" if found else ""


def validate_serve_args(schema: Schema, serve_args: Any, *, role_args: dict | None = None,
                        where: str = "serve_args") -> tuple[dict, list[str]]:
    """The serve args with flag names normalised and booleans as booleans, and the errors.

    ``role_args`` are the flags the caller owns (host, port): they may be reserved flags, and
    a profile that sets one of them is refused.
    """
    errors: list[str] = []
    role_args = role_args or {}
    if serve_args is None:
        serve_args = {}
    if not isinstance(serve_args, dict):
        return {}, [f"{where}: {_show(serve_args)} is not a mapping of flag names to values"]

    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in serve_args.items():
        name, negated, problem = _resolve(schema, key)
        label = f"{where}.{_label(key)}"
        if problem:
            errors.append(f"{label}: {problem}")
            continue
        flag = schema.flags[name]
        if flag.reserved or name in role_args:
            errors.append(f"{label}: --{name} is not set in a profile: {flag.reserved or 'the role sets it'}")
            continue
        if negated:
            if value is not True:
                errors.append(f"{label}: a --no- flag takes true; write {name}: "
                              f"{'true' if value is False else 'false'} instead")
                continue
            value = False
        problem = check_value(flag, value)
        if problem:
            errors.append(f"{label}: --{name} {problem}")
            continue
        if value is False and not flag.negatable:
            errors.append(f"{label}: --{name} is false, but it has no --no- form, so the config file "
                          "cannot say false (vllm serve drops a false key): remove it to keep vLLM's "
                          "default (off)")
            continue
        if name in out:
            if out[name] != value:
                errors.append(f"{label}: sets --{name} again (as {spelled[name]!r}) to a different value")
            continue
        out[name] = value
        spelled[name] = str(key)

    for key, value in role_args.items():
        name = normalise_flag(str(key))
        flag = schema.flags.get(name)
        if flag is None:
            errors.append(f"role argument {key!r}: unknown flag --{name}{_closest_flag(name, schema.flags)}")
            continue
        problem = check_value(flag, value)
        if problem:
            errors.append(f"role argument {key}: --{name} {problem}")
    return out, errors


def render_config(schema: Schema, model: str, serve_args: dict, role_args: dict | None = None) -> dict:
    """The ``vllm serve --config`` mapping: model first, the profile's flags (sorted), then the
    role's; a false boolean becomes ``no-<flag>: true``. Expects validated serve args."""
    config: dict[str, Any] = {"model": model}
    for name in sorted(serve_args):
        value = serve_args[name]
        if value is False:
            if not schema.flags[name].negatable:  # validate_serve_args refuses these
                raise ValueError(f"--{name} has no --no- form")
            config[f"no-{name}"] = True
        else:
            config[name] = value
    for key, value in (role_args or {}).items():
        config[normalise_flag(str(key))] = value
    return config


def dump_config(config: dict, header: str = "") -> str:
    """YAML text, one ``key: <JSON>`` line per flag: JSON scalars and flow collections are
    YAML, so any YAML loader reads back exactly ``config``."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for key, value in config.items():
        lines.append(f"{key}: {json.dumps(value, ensure_ascii=True, allow_nan=False)}")
    return "\n".join(lines) + "\n"


# --- environment ---------------------------------------------------------------------------

def validate_env(schema: Schema, env: Any, *, reserved: dict | None = None,
                 where: str = "env") -> tuple[dict, list[str], list[str]]:
    """(env as strings, errors, warnings). ``reserved`` maps names the role sets to the reason."""
    errors: list[str] = []
    warnings: list[str] = []
    reserved = reserved or {}
    if env is None:
        env = {}
    if not isinstance(env, dict):
        return {}, [f"{where}: {_show(env)} is not a mapping of variable names to values"], []
    out: dict[str, str] = {}
    for name, value in env.items():
        label = f"{where}.{_label(name)}"
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            errors.append(f"{label}: {repr(name)[:80]} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            continue
        if name in reserved:
            errors.append(f"{label}: not set in a profile: {reserved[name]}")
            continue
        if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
            errors.append(f"{label}: expects a string, got {_type_name(value)} {_show(value)} "
                          "(quote it: environment values are text, for example \"0\" or \"1\")")
            continue
        text = str(value)
        problem = text_problem(text, flag_like=False)
        if problem:
            errors.append(f"{label}: {problem}")
            continue
        out[name] = text
        if schema.known_env and name.startswith("VLLM_") and name not in schema.known_env:
            warnings.append(f"{label}: vLLM {schema.vllm} does not read {name} (as far as the schema "
                            f"knows){_closest(name, schema.known_env, cutoff=0.85)}; a misspelt variable is silently "
                            "ignored")
    return out, errors, warnings


# --- vLLM's logging configuration ------------------------------------------------------------

# vLLM 0.25.1 logs every non-default argument at start, unredacted, the keys of --api-key included
# (log_non_default_args in vllm/entrypoints/serve/utils/api_utils.py, called by setup_server in
# vllm/entrypoints/openai/api_server.py), at INFO on this module's logger. In a rotation's window
# the keys are arguments (the instance config), so that one line would put them in the journal.
ARGS_LOGGER = "vllm.entrypoints.serve.utils.api_utils"
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def logging_config(env: dict) -> dict:
    """The logging configuration vLLM loads from VLLM_LOGGING_CONFIG_PATH: vLLM's default
    (DEFAULT_LOGGING_CONFIG in vllm/logger.py, without colour: the journal is no terminal) with
    ARGS_LOGGER at WARNING, so the non-default-args line is never written. The file replaces
    vLLM's default, which is where VLLM_LOGGING_LEVEL and VLLM_LOGGING_PREFIX act: their values
    from the profile's ``env`` are applied here. Expects a validated level."""
    level = env.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    prefix = env.get("VLLM_LOGGING_PREFIX", "")
    return {
        "formatters": {"vllm": {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                                "format": f"{prefix}%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": level,
                              "stream": "ext://sys.stdout"}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False},
                    ARGS_LOGGER: {"level": "WARNING"}},
        "version": 1,
        "disable_existing_loggers": False,
    }


def _logging_errors(env: dict, where: str) -> list[str]:
    level = env.get("VLLM_LOGGING_LEVEL")
    if level is None or level.upper() in LOG_LEVELS:
        return []
    return [f"{where}.VLLM_LOGGING_LEVEL: {_show(level)} is not a logging level: one of {', '.join(LOG_LEVELS)}"]


def _env_quote(value: str) -> str:
    # systemd EnvironmentFile=: inside double quotes, \ " ` $ are escaped with a backslash.
    return '"' + re.sub(r'([\\"`$])', r"\\\1", value) + '"'


def dump_env(env: dict, header: str = "") -> str:
    """An EnvironmentFile= for systemd: ``NAME="value"`` lines."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{name}={_env_quote(str(value))}" for name, value in env.items()]
    return "\n".join(lines) + "\n"


# --- the whole profile ---------------------------------------------------------------------

def build(schema_data: Any, profile: Any, *, role_args: dict | None = None, role_env: dict | None = None,
          reserved_env: dict | None = None, header: str = "", models_dir: str = "") -> dict:
    """Validate a profile and render what an instance serves.

    Returns ``{profile, config, content, env, env_content, logging_content, warnings}``:
    ``profile`` is the applied profile as preflight reads it (flag names normalised, booleans as
    booleans), ``config``/``content`` the ``--config`` mapping and its YAML, ``env``/``env_content``
    the environment (profile then role) and its EnvironmentFile text, ``logging_content`` the JSON
    of logging_config() for VLLM_LOGGING_CONFIG_PATH.
    Raises SchemaError for a broken schema, ProfileError (every problem at once) otherwise.
    """
    schema = load_schema(schema_data)
    role_args = dict(role_args or {})
    role_env = {str(k): str(v) for k, v in (role_env or {}).items()}
    errors: list[str] = []
    if not isinstance(profile, dict):
        raise ProfileError([f"profile: {_show(profile)} is not a mapping with name, model, serve_args, env"])
    allowed = PROFILE_REQUIRED + PROFILE_OPTIONAL
    for key in profile:
        if key not in allowed:
            errors.append(f"profile: unknown key {key!r}{_closest(str(key), allowed)}; "
                          f"allowed: {', '.join(allowed)}")
    errors += _model_errors(profile)
    for key in ("name", "model"):
        value = profile.get(key)
        if key == "model" and (value is None and "weights" in profile):
            continue
        if not isinstance(value, str) or not value.strip():
            errors.append(f"profile.{key}: a non-empty single-line string is required, got {_show(value)}")
            continue
        problem = text_problem(value, limit=MAX_NAME if key == "name" else MAX_TEXT)
        if problem:
            errors.append(f"profile.{key}: {problem}")
    description = profile.get("description")
    if isinstance(description, str) and len(description) > MAX_TEXT:
        errors.append(f"profile.description: is {len(description)} characters long: at most {MAX_TEXT} are allowed")

    serve_args, arg_errors = validate_serve_args(schema, profile.get("serve_args"), role_args=role_args,
                                                 where="profile.serve_args")
    reserved = {**{name: "the role sets it for each instance" for name in role_env}, **(reserved_env or {})}
    env, env_errors, warnings = validate_env(schema, profile.get("env"), reserved=reserved, where="profile.env")
    errors += arg_errors + env_errors + _logging_errors(env, "profile.env")
    try:  # the soak gate's figures at the reference load (roles/soak_gate reads them)
        validate_performance_spec(profile.get("baseline"), None, baseline_name="profile.baseline")
    except SoakConfigError as exc:
        errors.append(str(exc))
    if errors:
        raise ProfileError(errors)

    if "weights" in profile and not models_dir:
        raise ProfileError(["profile.weights: staged models need models_dir (vllm_fleet_models_dir)"])
    config = render_config(schema, model_path(profile, models_dir), serve_args, role_args)
    full_env = {**env, **role_env}
    # As the profile says it (model, or weights), so a node's record compares with the plan.
    source = {key: profile[key] for key in ("model", "weights") if key in profile}
    return {
        "profile": {"name": profile["name"], **source, "serve_args": serve_args, "env": env},
        "config": config,
        "content": dump_config(config, header),
        "env": full_env,
        "env_content": dump_env(full_env, header),
        "logging_content": json.dumps(logging_config(env), indent=2) + "\n",
        "warnings": warnings,
    }


def _model_errors(profile: dict) -> list[str]:
    """A profile names its model one way: model, or weights staged by vllm-fleet; a staged
    one needs served-model-name, since clients cannot ask for a node's directory."""
    if "weights" not in profile:
        return []
    errors = []
    if "model" in profile:
        errors.append("profile.model and profile.weights: give model (a path the site provides) or weights"
                      " (a model vllm-fleet stages under vllm_fleet_models_dir), not both")
    try:
        check_model(profile["weights"])
    except WeightsError as exc:
        errors.append(str(exc))
    serve_args = profile.get("serve_args") if isinstance(profile.get("serve_args"), dict) else {}
    if not served_names({"serve_args": serve_args}):  # its names without the model fallback
        errors.append("profile.weights: a staged model needs serve_args.served-model-name, the name clients ask"
                      " for (vLLM would answer to the node's directory)")
    return errors


def model_path(profile: dict, models_dir: str) -> str:
    """What ``vllm serve`` is given: the staged ``<models_dir>/<name>@<revision>`` for a
    profile with weights, else its model."""
    weights = profile.get("weights")
    if weights is None:
        return profile["model"]
    return f"{models_dir.rstrip('/')}/{model_dirname(weights['name'], weights['revision'])}"


def served_names(profile: Any) -> list[str]:
    """The model names clients may ask a profile for, the first being the one vLLM reports:
    served-model-name (any spelling of the flag; a string or a list), else the model, which
    is vLLM's own default. A node that serves nothing yet (no profile) has none."""
    if not profile:
        return []
    if not isinstance(profile, dict):
        raise ValueError(f"served_names: {_show(profile)} is not a profile (a mapping with model and serve_args)")
    serve_args = profile.get("serve_args") or {}
    names = [value for key, value in serve_args.items() if normalise_flag(str(key)) == "served-model-name"]
    if names:
        return [names[-1]] if isinstance(names[-1], str) else [str(name) for name in names[-1]]
    return [str(profile["model"])] if profile.get("model") else []
