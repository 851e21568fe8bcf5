"""gpu_facts: the real nvidia-ml-py against the fake libnvidia-ml.so.1, one node kind at a time.

The dynamic loader reads LD_LIBRARY_PATH when a process starts, so every node kind runs
in its own interpreter, with the fake library's directory and its profile in the env.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.gpu import collect_gpu_facts
from tests.fixtures.nvml.build import PROFILES_DIR, build_fake_cuda, build_fake_nvml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECT = (
    "import json\n"
    "from ansible_collections.vllm_fleet.fleet.plugins.module_utils.gpu import collect_gpu_facts\n"
    "print(json.dumps(collect_gpu_facts()))\n"
)

NODE_ENV_KEYS = ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG", "FAKE_CUDA_DEVICES", "CUDA_VISIBLE_DEVICES")

# docs/CONTRACTS.md, written out here so that a drift in the module shows as a failure.
FACT_KEYS = {
    "available", "error", "reason", "driver_version", "cuda_driver_version",
    "nvml_version", "device_count", "devices",
}
DEVICE_KEYS = {
    "index", "name", "uuid", "pci_bus_id", "compute_capability", "sm", "architecture",
    "gpu_class", "memory_total_bytes", "shared_memory_per_block_optin_bytes",
    "shared_memory_per_block_optin_source", "ecc_enabled", "mig_enabled",
    "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "remapped_rows_pending", "remapped_rows_failure",
}
NULL_HEALTH = {
    "ecc_enabled": None, "mig_enabled": None, "retired_pages_pending": None,
    "remapped_rows_correctable": None, "remapped_rows_uncorrectable": None,
    "remapped_rows_pending": None, "remapped_rows_failure": None,
}
RTX_PRO_6000 = {
    "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "pci_bus_id": "00000000:01:00.0",
    "compute_capability": "12.0",
    "sm": "sm_120",
    "architecture": "blackwell",
    "gpu_class": "workstation",
    "memory_total_bytes": 97887 * 2**20,
    "shared_memory_per_block_optin_bytes": 101376,
    "shared_memory_per_block_optin_source": "table",
}


@pytest.fixture(scope="session")
def node_libs(tmp_path_factory):
    """The fake NVML beside a fake CUDA driver that sees no device (cuInit fails).

    The fake libcuda keeps a real one on the test machine out of the answers: it would
    otherwise be asked about the real GPUs' PCI addresses.
    """
    out = tmp_path_factory.mktemp("node-libs")
    build_fake_nvml(out)
    build_fake_cuda(out)
    return out


@pytest.fixture(scope="session")
def nvml_only(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvml-only")
    build_fake_nvml(out)
    return out


def node_env(lib_dir, config, **extra):
    env = {key: value for key, value in os.environ.items() if key not in NODE_ENV_KEYS}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    if config is not None:
        env["FAKE_NVML_CONFIG"] = str(config)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "collections")])
    env.update(extra)
    return env


def run_python(script, lib_dir, config, **extra):
    return subprocess.run(
        [sys.executable, "-c", script], env=node_env(lib_dir, config, **extra),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def gather(lib_dir, config, **extra):
    result = run_python(COLLECT, lib_dir, config, **extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def loads_a_system_library(soname, empty_dir):
    probe = run_python(f"import ctypes; ctypes.CDLL({soname!r})", empty_dir, "/nonexistent")
    return probe.returncode == 0


def assert_contract_shape(facts):
    assert set(facts) == FACT_KEYS
    assert len(facts["devices"]) == facts["device_count"]
    for device in facts["devices"]:
        assert set(device) == DEVICE_KEYS


def single_device(facts):
    assert facts["available"] is True
    assert facts["error"] is None and facts["reason"] is None
    assert facts["device_count"] == 1
    assert_contract_shape(facts)
    return facts["devices"][0]


def write_config(tmp_path, text):
    config = tmp_path / "node.conf"
    config.write_text(text)
    return config


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param("rtx_pro_6000", {
            **RTX_PRO_6000,
            "index": 0,
            "uuid": "GPU-7c3e9a52-1f0b-4d6e-9a1c-5b2f8e4d0a61",
            "ecc_enabled": False,
            "mig_enabled": None,
            "retired_pages_pending": False,
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": 0,
            "remapped_rows_pending": False,
            "remapped_rows_failure": False,
        }, id="rtx_pro_6000"),
        pytest.param("b200", {
            "name": "NVIDIA B200",
            "compute_capability": "10.0",
            "sm": "sm_100",
            "architecture": "blackwell",
            "gpu_class": "datacenter",
            "memory_total_bytes": 183359 * 2**20,
            "shared_memory_per_block_optin_bytes": 232448,
            "shared_memory_per_block_optin_source": "table",
            "ecc_enabled": True,
            "mig_enabled": False,
        }, id="b200"),
        pytest.param("h100", {
            "name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
            "sm": "sm_90",
            "architecture": "hopper",
            "gpu_class": "datacenter",
            "memory_total_bytes": 81559 * 2**20,
            "shared_memory_per_block_optin_bytes": 232448,
            "ecc_enabled": True,
        }, id="h100"),
        pytest.param("gb10", {
            "name": "NVIDIA GB10",
            "pci_bus_id": "0000000F:01:00.0",
            "compute_capability": "12.1",
            "sm": "sm_121",
            "architecture": "blackwell",
            "gpu_class": "embedded",
            "memory_total_bytes": None,
            "shared_memory_per_block_optin_bytes": 101376,
            "shared_memory_per_block_optin_source": "table",
            **NULL_HEALTH,
        }, id="gb10"),
        pytest.param("unsupported_queries", {
            **RTX_PRO_6000,
            **NULL_HEALTH,
        }, id="unsupported_queries"),
        pytest.param("retired_pages", {
            **RTX_PRO_6000,
            "ecc_enabled": True,
            "retired_pages_pending": True,
            "remapped_rows_correctable": 2,
            "remapped_rows_uncorrectable": 1,
            "remapped_rows_pending": True,
            "remapped_rows_failure": False,
        }, id="retired_pages"),
    ],
)
def test_profile_device_facts(node_libs, profile, expected):
    device = single_device(gather(node_libs, PROFILES_DIR / f"{profile}.conf"))
    assert {key: device[key] for key in expected} == expected


def test_driver_versions(node_libs):
    facts = gather(node_libs, PROFILES_DIR / "rtx_pro_6000.conf")
    assert facts["driver_version"] == "580.95.05"
    assert facts["cuda_driver_version"] == "13.0"
    assert facts["nvml_version"] == "13.580.95.05"


def test_old_driver_reports_its_cuda_version(node_libs):
    facts = gather(node_libs, PROFILES_DIR / "old_driver.conf")
    assert single_device(facts)["sm"] == "sm_120"
    assert facts["driver_version"] == "570.195.03"
    assert facts["cuda_driver_version"] == "12.8"


def test_no_driver(node_libs):
    facts = gather(node_libs, PROFILES_DIR / "no_driver.conf")
    assert_contract_shape(facts)
    assert facts["available"] is False
    assert facts["error"] == "driver_not_loaded"
    assert "not loaded" in facts["reason"] and "modprobe nvidia" in facts["reason"]
    assert facts["device_count"] == 0 and facts["devices"] == []
    assert facts["driver_version"] is None


def test_no_library_at_all(tmp_path):
    if loads_a_system_library("libnvidia-ml.so.1", tmp_path):
        pytest.skip("this machine has a real libnvidia-ml.so.1")
    facts = gather(tmp_path, PROFILES_DIR / "rtx_pro_6000.conf")
    assert_contract_shape(facts)
    assert facts["available"] is False
    assert facts["error"] == "library_not_found"
    assert facts["reason"].startswith("no NVIDIA driver: libnvidia-ml.so.1 not found")


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        (4, "no_permission", "become: true"),
        (18, "nvml_error", "RM has detected an NVML/RM version mismatch. (NVML error 18)"),
    ],
)
def test_other_init_failures(node_libs, tmp_path, code, error, words):
    facts = gather(node_libs, write_config(tmp_path, f"init_error={code}\n"))
    assert (facts["available"], facts["error"]) == (False, error)
    assert words in facts["reason"]


def test_missing_python_library(monkeypatch):
    # A None entry in sys.modules makes "import pynvml" raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    facts = collect_gpu_facts()
    assert_contract_shape(facts)
    assert (facts["available"], facts["error"]) == (False, "missing_python_library")
    assert "nvidia-ml-py" in facts["reason"] and sys.executable in facts["reason"]


def test_lost_gpu_leaves_a_null_entry(node_libs, tmp_path):
    base = (PROFILES_DIR / "rtx_pro_6000.conf").read_text()
    two_gpus = base.replace("device_count=1", "device_count=2") + "1.handle_error=15\n"
    facts = gather(node_libs, write_config(tmp_path, two_gpus))
    assert_contract_shape(facts)
    assert facts["available"] is True and facts["device_count"] == 2
    assert facts["devices"][0]["sm"] == "sm_120"
    lost = facts["devices"][1]
    assert lost["index"] == 1
    assert all(value is None for key, value in lost.items() if key != "index")


def test_shared_memory_from_cuda_driver_matched_by_pci_address(node_libs, tmp_path):
    # Three GPUs; CUDA lists two of them in the other order (as CUDA_VISIBLE_DEVICES
    # can) and does not see the third, which falls back to the table.
    lines = ["driver_version=580.95.05", "cuda_driver_version=13000", "device_count=3"]
    for index in range(3):
        lines += [
            f"{index}.pci_bus_id=00000000:0{index + 1}:00.0",
            f"{index}.cc_major=12",
            f"{index}.cc_minor=0",
        ]
    facts = gather(
        node_libs, write_config(tmp_path, "\n".join(lines) + "\n"),
        FAKE_CUDA_DEVICES="0000:02:00.0=65536 0000:01:00.0=101376",
    )
    answers = [
        (d["shared_memory_per_block_optin_bytes"], d["shared_memory_per_block_optin_source"])
        for d in facts["devices"]
    ]
    assert answers == [(101376, "cuda_driver"), (65536, "cuda_driver"), (101376, "table")]


def test_without_a_cuda_driver_the_table_answers(nvml_only, tmp_path):
    if loads_a_system_library("libcuda.so.1", tmp_path):
        pytest.skip("this machine has a real libcuda.so.1")
    device = single_device(gather(nvml_only, PROFILES_DIR / "b200.conf"))
    assert device["shared_memory_per_block_optin_bytes"] == 232448
    assert device["shared_memory_per_block_optin_source"] == "table"


def test_unknown_compute_capability_has_no_class_and_no_table_entry(node_libs, tmp_path):
    config = write_config(tmp_path, "device_count=1\n0.cc_major=7\n0.cc_minor=5\n0.arch=6\n")
    device = single_device(gather(node_libs, config))
    assert (device["sm"], device["architecture"]) == ("sm_75", "turing")
    assert device["gpu_class"] is None
    assert device["shared_memory_per_block_optin_bytes"] is None
    assert device["shared_memory_per_block_optin_source"] is None


def test_nvml_is_shut_down_afterwards(node_libs):
    # The fake counts nvmlInit against nvmlShutdown, as NVML does: once facts are
    # gathered, a query must find NVML uninitialised again.
    script = COLLECT + (
        "import pynvml\n"
        "try:\n"
        "    pynvml.nvmlDeviceGetCount()\n"
        "except pynvml.NVMLError_Uninitialized:\n"
        "    print('shut down')\n"
    )
    result = run_python(script, node_libs, PROFILES_DIR / "rtx_pro_6000.conf")
    assert result.stdout.splitlines()[-1] == "shut down", result.stdout + result.stderr


def test_fake_rejects_a_typo_in_a_profile(node_libs, tmp_path):
    # A misspelt key must not read as "unsupported": the fake refuses to start.
    config = write_config(tmp_path, "device_count=1\n0.ecc_mode=1\n")
    result = run_python(COLLECT, node_libs, config)
    assert json.loads(result.stdout)["error"] == "nvml_error"
    assert f"{config}:2: bad line" in result.stderr


def test_fake_reads_etc_fake_nvml_conf_by_default(node_libs):
    # On a simulated node the profile is bind-mounted there, for every process to see.
    if Path("/etc/fake-nvml.conf").exists():
        pytest.skip("this machine has an /etc/fake-nvml.conf")
    result = run_python(COLLECT, node_libs, None)
    assert json.loads(result.stdout)["error"] == "nvml_error"
    assert "cannot read /etc/fake-nvml.conf" in result.stderr


def test_fake_answers_the_versioned_queries(node_libs):
    script = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "handle = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "memory = pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)\n"
        "pci = pynvml.nvmlDeviceGetPciInfo_v3(handle)\n"
        "print(memory.total, memory.used, pynvml.nvmlSystemGetCudaDriverVersion_v2(),\n"
        "      pci.busIdLegacy, pci.domain, pci.bus)\n"
        "try:\n"
        "    pynvml.nvmlDeviceGetMemoryInfo(handle, 0x01000018)\n"
        "except pynvml.NVMLError_ArgumentVersionMismatch:\n"
        "    print('version checked')\n"
    )
    result = run_python(script, node_libs, PROFILES_DIR / "b200.conf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{183359 * 2**20} 0 13000 0000:1b:00.0 0 27",
        "version checked",
    ]


def run_module(node_libs, config, *args):
    env = node_env(
        node_libs, config,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )
    result = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-m", "vllm_fleet.fleet.gpu_facts", "-e", f"ansible_python_interpreter={sys.executable}",
         *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert "Traceback" not in result.stdout + result.stderr
    output = json.loads(result.stdout)
    return result.returncode, output["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.mark.parametrize("check", [False, True], ids=["run", "check_mode"])
def test_module_sets_the_fact(node_libs, check):
    rc, host = run_module(node_libs, PROFILES_DIR / "rtx_pro_6000.conf", *(["--check"] if check else []))
    assert rc == 0, host
    assert host["changed"] is False
    facts = host["ansible_facts"]["vllm_fleet_gpu"]
    assert single_device(facts)["sm"] == "sm_120"


def test_module_without_driver_is_not_a_failure(node_libs):
    rc, host = run_module(node_libs, PROFILES_DIR / "no_driver.conf")
    assert rc == 0, host
    assert host["ansible_facts"]["vllm_fleet_gpu"]["error"] == "driver_not_loaded"


def test_module_require_gpu_fails_with_the_reason(node_libs):
    rc, host = run_module(node_libs, PROFILES_DIR / "no_driver.conf", "-a", "require_gpu=true")
    assert rc != 0
    assert host["failed"] is True
    assert host["msg"].startswith("require_gpu is set, but the NVIDIA kernel driver is not loaded")
    assert "modprobe nvidia" in host["msg"]
    assert host["vllm_fleet_gpu"]["error"] == "driver_not_loaded"


def test_module_require_gpu_fails_when_nvml_sees_no_gpu(node_libs, tmp_path):
    config = write_config(tmp_path, "driver_version=580.95.05\ndevice_count=0\n")
    rc, host = run_module(node_libs, config, "-a", "require_gpu=true")
    assert rc != 0
    assert host["msg"].startswith("require_gpu is set, but NVML reports no GPU on this node")
    assert host["vllm_fleet_gpu"]["available"] is True
