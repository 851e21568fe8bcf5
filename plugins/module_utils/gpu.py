"""GPU facts from NVML (nvidia-ml-py), in the shape docs/CONTRACTS.md gives vllm_fleet_gpu.

Plain Python, no Ansible: the gpu_facts module is a thin wrapper around collect_gpu_facts.
"""
import ctypes
import sys

# NVML_DEVICE_ARCH_* codes. The ABI values are fixed, so they do not depend on the
# pynvml in use knowing the newest names.
ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}

# NVML_DEVICE_ARCH_BLACKWELL covers datacenter sm_100 and workstation sm_120, whose
# kernels differ (228 KB against 99 KB of shared memory): the class comes from the
# compute capability. "workstation" is the die family, which includes boards sold for
# servers on the same die (L40S at 8.9, A10 at 8.6).
GPU_CLASSES = {
    "8.0": "datacenter",
    "8.6": "workstation",
    "8.9": "workstation",
    "9.0": "datacenter",
    "12.0": "workstation",
    "12.1": "embedded",
}

# Opt-in shared memory per block, where the CUDA driver cannot be asked (CUDA
# Programming Guide, "Technical Specifications per Compute Capability").
SHARED_MEMORY_OPTIN_BYTES = {
    "8.0": 163 * 1024,
    "8.6": 99 * 1024,
    "8.9": 99 * 1024,
    "9.0": 227 * 1024,
    "10.0": 227 * 1024,
    "12.0": 99 * 1024,
    "12.1": 99 * 1024,
}

CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97

DEVICE_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci_bus_id",
    "compute_capability",
    "sm",
    "architecture",
    "gpu_class",
    "memory_total_bytes",
    "shared_memory_per_block_optin_bytes",
    "shared_memory_per_block_optin_source",
    "ecc_enabled",
    "mig_enabled",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
)


def collect_gpu_facts(pynvml_module=None):
    """Return the vllm_fleet_gpu facts. Never raises for a missing or broken GPU stack."""
    facts = {
        "available": False,
        "error": None,
        "reason": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "device_count": 0,
        "devices": [],
    }
    nvml = pynvml_module
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            facts["error"] = "missing_python_library"
            facts["reason"] = (
                "the Python library nvidia-ml-py (module pynvml) is not installed for "
                f"{sys.executable}: install nvidia-ml-py into the interpreter Ansible "
                "uses on this node (ansible_python_interpreter)"
            )
            return facts

    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        facts["error"], facts["reason"] = _init_failure(nvml, err)
        return facts

    try:
        facts["driver_version"] = _query(nvml, nvml.nvmlSystemGetDriverVersion)
        facts["cuda_driver_version"] = _cuda_version(
            _query(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        )
        facts["nvml_version"] = _query(nvml, nvml.nvmlSystemGetNVMLVersion)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            facts["error"] = "nvml_error"
            facts["reason"] = f"NVML started but could not count the GPUs: {_describe(err)}"
            return facts
        facts["devices"] = [_device(nvml, index) for index in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the answers are in; a failed shutdown changes none of them

    facts["available"] = True
    facts["device_count"] = count
    _add_shared_memory(facts["devices"])
    return facts


def _init_failure(nvml, err):
    if isinstance(err, nvml.NVMLError_LibraryNotFound):
        return "library_not_found", (
            "no NVIDIA driver: libnvidia-ml.so.1 not found by the dynamic loader; install "
            "the NVIDIA driver (it ships the library) or add its directory to the loader "
            "path, then check that nvidia-smi works"
        )
    if isinstance(err, nvml.NVMLError_DriverNotLoaded):
        return "driver_not_loaded", (
            "the NVIDIA kernel driver is not loaded (libnvidia-ml.so.1 is present): load "
            "it (modprobe nvidia) or reboot after a driver install, then check that "
            "nvidia-smi works"
        )
    if isinstance(err, nvml.NVMLError_NoPermission):
        return "no_permission", (
            "NVML denied access to the GPU (insufficient permissions): gather facts as a "
            "user that may open /dev/nvidia* (become: true)"
        )
    return "nvml_error", f"NVML failed to initialise: {_describe(err)}; check nvidia-smi"


def _describe(err):
    return f"{err} (NVML error {err.value})"


def _query(nvml, call, *args):
    """One NVML question; NotSupported, FunctionNotFound or any other NVML error is None."""
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def _cuda_version(raw):
    # NVML encodes CUDA 12.8 as 12080.
    if raw is None:
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"


def _device(nvml, index):
    device = dict.fromkeys(DEVICE_FIELDS)
    device["index"] = index
    handle = _query(nvml, nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return device

    device["name"] = _query(nvml, nvml.nvmlDeviceGetName, handle)
    device["uuid"] = _query(nvml, nvml.nvmlDeviceGetUUID, handle)
    pci = _query(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    device["pci_bus_id"] = pci.busId if pci is not None else None

    capability = _query(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    if capability is not None:
        major, minor = capability
        device["compute_capability"] = f"{major}.{minor}"
        device["sm"] = f"sm_{major}{minor}"
        device["gpu_class"] = "datacenter" if major == 10 else GPU_CLASSES.get(f"{major}.{minor}")
    device["architecture"] = ARCHITECTURES.get(_query(nvml, nvml.nvmlDeviceGetArchitecture, handle))

    memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    device["memory_total_bytes"] = memory.total if memory is not None else None

    ecc = _query(nvml, nvml.nvmlDeviceGetEccMode, handle)
    device["ecc_enabled"] = bool(ecc[0]) if ecc is not None else None
    mig = _query(nvml, nvml.nvmlDeviceGetMigMode, handle)
    device["mig_enabled"] = bool(mig[0]) if mig is not None else None
    retired = _query(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    device["retired_pages_pending"] = bool(retired) if retired is not None else None
    remapped = _query(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    if remapped is not None:
        correctable, uncorrectable, pending, failure = remapped
        device["remapped_rows_correctable"] = correctable
        device["remapped_rows_uncorrectable"] = uncorrectable
        device["remapped_rows_pending"] = bool(pending)
        device["remapped_rows_failure"] = bool(failure)
    return device


def _add_shared_memory(devices):
    """The CUDA driver's answer for each device, else the table for its compute capability."""
    from_driver = _cuda_shared_memory_optin() if devices else {}
    for device in devices:
        answer = from_driver.get(_pci_key(device["pci_bus_id"]))
        if answer is not None:
            device["shared_memory_per_block_optin_bytes"] = answer
            device["shared_memory_per_block_optin_source"] = "cuda_driver"
        elif device["compute_capability"] in SHARED_MEMORY_OPTIN_BYTES:
            device["shared_memory_per_block_optin_bytes"] = SHARED_MEMORY_OPTIN_BYTES[
                device["compute_capability"]
            ]
            device["shared_memory_per_block_optin_source"] = "table"


def _cuda_shared_memory_optin():
    """{PCI address: opt-in shared memory per block} from libcuda; {} when it cannot answer.

    Matched by PCI address, because CUDA ordinals follow CUDA_VISIBLE_DEVICES and
    CUDA_DEVICE_ORDER while NVML indexes follow the bus.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return {}
    answers = {}
    for ordinal in range(count.value):
        device = ctypes.c_int()
        bus_id = ctypes.create_string_buffer(32)
        value = ctypes.c_int()
        if (
            cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            and cuda.cuDeviceGetPCIBusId(bus_id, len(bus_id), device) == 0
            and cuda.cuDeviceGetAttribute(
                ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device
            ) == 0
        ):
            answers[_pci_key(bus_id.value.decode())] = value.value
    return answers


def _pci_key(bus_id):
    """(domain, bus, device, function) from "00000000:01:00.0" (NVML) or "0000:01:00.0" (CUDA)."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.split(":")
        slot, function = rest.split(".")
        return tuple(int(part, 16) for part in (domain, bus, slot, function))
    except ValueError:
        return None
