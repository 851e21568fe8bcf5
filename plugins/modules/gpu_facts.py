#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts through NVML (nvidia-ml-py)
version_added: "0.1.0"
description:
  - Reads the NVIDIA driver, CUDA driver version and every GPU of the node through
    NVML, using the nvidia-ml-py library on the target's Python interpreter.
  - Sets the fact C(vllm_fleet_gpu) with the driver and CUDA driver versions, and per
    GPU its name, compute capability (C(12.0), C(sm_120)), architecture, GPU class,
    memory, opt-in shared memory per block, ECC, MIG, retired pages and remapped rows.
  - NVML reports datacenter (sm_100) and workstation (sm_120) Blackwell as one
    architecture; the module tells them apart by compute capability in C(gpu_class).
  - A node without a usable GPU gets C(available=false) and the reason in the fact,
    not a failed task, unless O(require_gpu=true).
  - A query the GPU does not support gives V(null) for that field.
options:
  require_gpu:
    description:
      - Fail the task when NVML cannot be used or reports no GPU, with the reason and
        what to do about it.
      - When V(false), such a node gets C(available=false) and the reason in the fact.
    type: bool
    default: false
requirements:
  - nvidia-ml-py (module C(pynvml)) on the target's Python interpreter
  - the NVIDIA driver (C(libnvidia-ml.so.1)) for any GPU to be seen
notes:
  - Opt-in shared memory per block comes from the CUDA driver (C(libcuda.so.1)) when it
    answers for the device, else from a table by compute capability.
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
attributes:
  facts:
    support: full
    description: Sets C(vllm_fleet_gpu).
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  vllm_fleet.fleet.gpu_facts:

- name: Show the compute capability of the first GPU
  ansible.builtin.debug:
    msg: "{{ vllm_fleet_gpu.devices[0].compute_capability }} ({{ vllm_fleet_gpu.devices[0].sm }})"
  when: vllm_fleet_gpu.available and vllm_fleet_gpu.device_count > 0

- name: Stop here on a node whose GPU cannot be read
  vllm_fleet.fleet.gpu_facts:
    require_gpu: true
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: always
  type: dict
  contains:
    vllm_fleet_gpu:
      description: What NVML says about the node's GPUs (docs/CONTRACTS.md).
      returned: always
      type: dict
      contains:
        available:
          description: NVML started and answered.
          type: bool
          sample: true
        error:
          description:
            - Why NVML could not be used, or V(null).
            - One of V(library_not_found), V(driver_not_loaded), V(no_permission),
              V(nvml_error), V(missing_python_library).
          type: str
          sample: driver_not_loaded
        reason:
          description: A sentence saying what is missing and what to do, or V(null).
          type: str
          sample: "no NVIDIA driver: libnvidia-ml.so.1 not found by the dynamic loader; ..."
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: "580.95.05"
        cuda_driver_version:
          description: Highest CUDA version the driver supports, C(major.minor).
          type: str
          sample: "13.0"
        nvml_version:
          description: NVML library version.
          type: str
          sample: "13.580.95.05"
        device_count:
          description: Number of GPUs NVML sees.
          type: int
          sample: 1
        devices:
          description: One entry per GPU, in NVML index order. Unsupported fields are V(null).
          type: list
          elements: dict
          contains:
            index:
              description: NVML index.
              type: int
              sample: 0
            name:
              description: Product name.
              type: str
              sample: NVIDIA RTX PRO 6000 Blackwell Workstation Edition
            uuid:
              description: GPU UUID.
              type: str
              sample: GPU-7c3e9a52-1f0b-4d6e-9a1c-5b2f8e4d0a61
            pci_bus_id:
              description: PCI address as NVML writes it.
              type: str
              sample: "00000000:01:00.0"
            compute_capability:
              description: CUDA compute capability, C(major.minor).
              type: str
              sample: "12.0"
            sm:
              description: The same as a CUDA architecture name.
              type: str
              sample: sm_120
            architecture:
              description: NVML architecture name in lower case, V(null) if unknown.
              type: str
              sample: blackwell
            gpu_class:
              description:
                - V(datacenter), V(workstation) or V(embedded), from the compute capability
                  (10.x, 9.0, 8.0 datacenter; 12.0, 8.9, 8.6 workstation; 12.1 embedded);
                  V(null) for any other.
              type: str
              sample: workstation
            memory_total_bytes:
              description: Total GPU memory in bytes.
              type: int
              sample: 102641958912
            shared_memory_per_block_optin_bytes:
              description: Largest shared memory a kernel may opt in to per block.
              type: int
              sample: 101376
            shared_memory_per_block_optin_source:
              description:
                - V(cuda_driver) (asked libcuda), V(table) (by compute capability) or V(null).
              type: str
              sample: table
            ecc_enabled:
              description: ECC currently on.
              type: bool
              sample: false
            mig_enabled:
              description: MIG currently on.
              type: bool
              sample: false
            retired_pages_pending:
              description: Retired pages wait for a reboot to take effect.
              type: bool
              sample: false
            remapped_rows_correctable:
              description: Rows remapped after correctable errors.
              type: int
              sample: 0
            remapped_rows_uncorrectable:
              description: Rows remapped after uncorrectable errors.
              type: int
              sample: 0
            remapped_rows_pending:
              description: A row remapping waits for a GPU reset.
              type: bool
              sample: false
            remapped_rows_failure:
              description: A row remapping has failed.
              type: bool
              sample: false
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.gpu import collect_gpu_facts


def main():
    module = AnsibleModule(
        argument_spec=dict(require_gpu=dict(type="bool", default=False)),
        supports_check_mode=True,
    )
    facts = collect_gpu_facts()
    if module.params["require_gpu"]:
        if not facts["available"]:
            module.fail_json(msg=f"require_gpu is set, but {facts['reason']}", vllm_fleet_gpu=facts)
        if facts["device_count"] == 0:
            module.fail_json(
                msg="require_gpu is set, but NVML reports no GPU on this node: check "
                "nvidia-smi, and that the GPU is not hidden from this host or container",
                vllm_fleet_gpu=facts,
            )
    module.exit_json(changed=False, ansible_facts={"vllm_fleet_gpu": facts})


if __name__ == "__main__":
    main()
