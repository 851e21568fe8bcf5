"""vllm_service on a simulated node: the unit, its hardening, the user, the rendered config,
the key kept out of sight, and the instance serving from the `current` release."""
import json
import shlex

import pytest
import yaml

ROOT = "/opt/vllm-fleet"
CONFIG = "/etc/vllm-fleet"
UNIT = "vllm@gpu0.service"
PORT = 18300
KEY = "molecule-test-key-4f1d2c3b5a69"  # molecule.yml
RELEASE_ID = "vllm-0.25.1_nvidia-cudnn-cu13-9.24.0.43"


def journal(host, lines=60):
    return host.run(f"journalctl --no-pager -n {lines} -u {UNIT}").stdout


def show(host, *props):
    """systemctl show as a dict; a property listed on several lines (EnvironmentFiles=,
    DeviceAllow=) is joined with newlines."""
    out = host.check_output(f"systemctl show {UNIT} " + " ".join(f"--property={p}" for p in props))
    values = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        values[key] = f"{values[key]}\n{value}" if key in values else value
    return values


def api(host, path, body=None, auth=True):
    """(status, text) of a request made inside the node. The key is read there from the key
    file, so it never appears on a command line."""
    script = f"""
import json, urllib.request, urllib.error
headers = {{"Content-Type": "application/json"}}
if {auth!r}:
    line = open("{CONFIG}/api-key.env").read().split("VLLM_API_KEY=", 1)[1].splitlines()[0]
    headers["Authorization"] = "Bearer " + line.strip().strip('"')
data = json.dumps({body!r}).encode() if {body is not None!r} else None
req = urllib.request.Request("http://127.0.0.1:{PORT}{path}", data=data, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""
    out = host.check_output(f"python3 -c {shlex.quote(script)}")
    status, _, text = out.partition("\n")
    return int(status), text


def test_service_is_enabled_and_active(host):
    service = host.service(UNIT)
    assert service.is_enabled
    assert service.is_running, journal(host)


def test_unit_restarts_on_every_exit_with_limits_and_a_load_timeout(host):
    props = show(host, "Restart", "RestartUSec", "StartLimitBurst", "StartLimitIntervalUSec", "TimeoutStartUSec",
                 "LimitCORE", "Type", "User", "Group", "ExecStart", "EnvironmentFiles", "ExecStartPost")
    assert props["Restart"] == "always"
    assert props["RestartUSec"] == "1s"
    assert props["StartLimitBurst"] == "5" and props["StartLimitIntervalUSec"] == "15min"
    assert props["TimeoutStartUSec"] == "15min"
    assert props["LimitCORE"] == "0"
    assert (props["User"], props["Group"]) == ("vllm", "vllm")
    assert f"path={ROOT}/current/bin/vllm" in props["ExecStart"]
    assert f"argv[]={ROOT}/current/bin/vllm serve --config {CONFIG}/gpu0.yaml" in props["ExecStart"]
    assert "vllm-fleet-wait-health" in props["ExecStartPost"]
    assert f"{CONFIG}/gpu0.env" in props["EnvironmentFiles"] and f"{CONFIG}/api-key.env" in props["EnvironmentFiles"]


@pytest.mark.parametrize("prop, expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("DevicePolicy", "closed"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("RemoveIPC", "yes"),
    ("UMask", "0077"),
    ("SystemCallArchitectures", "native"),
    ("ReadWritePaths", ""),
    ("StateDirectory", "vllm-fleet/gpu0"),
    ("CacheDirectory", "vllm-fleet/gpu0"),
    # CUDA/Triton JIT need writable+executable memory; the device nodes must stay visible.
    ("MemoryDenyWriteExecute", "no"),
    ("PrivateDevices", "no"),
])
def test_hardening(host, prop, expected):
    assert show(host, prop)[prop] == expected


def test_only_the_address_families_vllm_needs(host):
    assert set(show(host, "RestrictAddressFamilies")["RestrictAddressFamilies"].split()) == \
        {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def test_device_acl_allows_only_the_nvidia_nodes(host):
    allow = set(show(host, "DeviceAllow")["DeviceAllow"].splitlines())
    # char-rtc r comes with ProtectClock=.
    assert allow - {"char-rtc r"} == {f"{name} rw" for name in
                                      ("char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps")}


def test_system_call_filter_is_set(host):
    props = show(host, "SystemCallFilter", "SystemCallErrorNumber")
    assert props["SystemCallFilter"] and "reboot" not in props["SystemCallFilter"].split()
    assert props["SystemCallErrorNumber"] in ("EPERM", "1")  # systemd 252 shows the number


def test_service_user_is_a_system_user_without_login(host):
    user = host.user("vllm")
    assert user.exists and 0 < user.uid < 1000
    assert user.shell == "/usr/sbin/nologin"
    assert user.home == "/nonexistent"
    assert "video" in user.groups  # the image has video, not render
    assert host.check_output(f"systemctl show -P MainPID {UNIT} | xargs ps -o user= -p") == "vllm"


def test_config_yaml_has_the_profile_with_the_no_form_for_a_false(host):
    config_file = host.file(f"{CONFIG}/gpu0.yaml")
    assert (config_file.user, config_file.group, config_file.mode) == ("root", "vllm", 0o640)
    config = yaml.safe_load(config_file.content_string)
    assert list(config)[0] == "model" and config["model"] == "/models/qwen3.6-35b-a3b-nvfp4"
    assert config["no-enforce-eager"] is True and "enforce-eager" not in config
    assert config["enable-prefix-caching"] is True and config["kv-cache-dtype"] == "fp8"
    assert (config["host"], config["port"]) == ("0.0.0.0", PORT)
    assert "api-key" not in config


def test_env_file_pins_the_gpu_and_carries_the_profile_env(host):
    env_file = host.file(f"{CONFIG}/gpu0.env")
    assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o640)
    text = env_file.content_string
    for line in ('CUDA_VISIBLE_DEVICES="0"', 'CUDA_DEVICE_ORDER="PCI_BUS_ID"', 'VLLM_USE_DEEP_GEMM_E8M0="0"'):
        assert line in text.splitlines()
    # Not the health wait's URL: real vLLM logs every VLLM_* name it does not know, at every start.
    assert "VLLM_FLEET" not in text


def test_the_health_wait_finds_the_instance_from_its_config(host):
    post = show(host, "ExecStartPost")["ExecStartPost"]
    assert f"vllm-fleet-wait-health $MAINPID {CONFIG}/gpu0.yaml" in post
    assert f"http://127.0.0.1:{PORT}/health answered 200" in journal(host, 400)


def test_a_stop_drains_for_shutdown_timeout_and_systemd_waits_longer(host):
    config = yaml.safe_load(host.file(f"{CONFIG}/gpu0.yaml").content_string)
    assert config["shutdown-timeout"] == 30
    assert show(host, "TimeoutStopUSec")["TimeoutStopUSec"] == "1min 30s"


def test_vllm_logs_through_the_roles_logging_configuration(host):
    logging_file = host.file(f"{CONFIG}/logging.json")
    assert (logging_file.user, logging_file.group, logging_file.mode) == ("root", "vllm", 0o640)
    assert json.loads(logging_file.content_string)["loggers"]["vllm.entrypoints.serve.utils.api_utils"] == \
        {"level": "WARNING"}
    assert f"VLLM_LOGGING_CONFIG_PATH={CONFIG}/logging.json" in show(host, "Environment")["Environment"].split()


def test_profile_json_records_what_the_node_serves(host):
    applied = json.loads(host.file(f"{CONFIG}/profile.json").content_string)
    assert applied["name"] == "qwen3.6-35b-a3b-nvfp4-sm120"
    assert applied["serve_args"]["enforce-eager"] is False
    assert applied["env"]["VLLM_USE_DEEP_GEMM_E8M0"] == "0"


def test_key_file_is_root_only(host):
    key_file = host.file(f"{CONFIG}/api-key.env")
    assert (key_file.user, key_file.group, key_file.mode) == ("root", "root", 0o600)
    assert f'VLLM_API_KEY="{KEY}"' in key_file.content_string.splitlines()


def test_key_is_nowhere_else(host):
    # Each command's output is searched here, so the key never appears on a command line there.
    places = {
        "ps": host.check_output("ps -eo args"),
        "systemctl cat": host.check_output(f"systemctl cat {UNIT}"),
        "systemctl show": host.check_output(f"systemctl show {UNIT}"),
        "journal": host.check_output("journalctl --no-pager -o cat"),
        "config": host.file(f"{CONFIG}/gpu0.yaml").content_string,
        "env file": host.file(f"{CONFIG}/gpu0.env").content_string,
        "profile.json": host.file(f"{CONFIG}/profile.json").content_string,
    }
    leaks = [where for where, text in places.items() if KEY in text]
    assert leaks == []


def test_instance_answers_a_completion_with_the_key_and_refuses_without(host):
    status, text = api(host, "/v1/completions", {"prompt": "one node at a time", "max_tokens": 5})
    assert status == 200, journal(host)
    reply = json.loads(text)
    assert reply["choices"][0]["text"].strip()
    assert reply["usage"]["completion_tokens"] >= 1
    assert api(host, "/v1/models", auth=False)[0] == 401
    assert host.run(f"curl -sf http://127.0.0.1:{PORT}/health").rc == 0


def test_the_instance_runs_the_current_release_and_torch_loads_cudnn_9_24(host):
    assert host.file(f"{ROOT}/current").linked_to == f"{ROOT}/releases/{RELEASE_ID}"
    cmdline = host.check_output(f"tr '\\0' ' ' < /proc/$(systemctl show -P MainPID {UNIT})/cmdline")
    assert cmdline.startswith(f"{ROOT}/releases/{RELEASE_ID}/bin/python {ROOT}/current/bin/vllm serve")
    loaded = host.check_output(f"{ROOT}/current/bin/python -c 'import torch; print(torch.backends.cudnn.version())'")
    assert loaded == "92400"
    assert "cuDNN 92400 as loaded by torch" in journal(host, 400)
