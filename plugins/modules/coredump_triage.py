#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vllm-fleet contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: coredump_triage
short_description: Name the kernel, exception and instruction of a GPU core dump, and the known issue it is
version_added: "0.1.0"
description:
  - Reads a CUDA GPU core dump (written when a process runs with
    C(CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1)) through C(cuda-gdb), or a saved C(cuda-gdb) output,
    and returns the exception (for example C(Warp Out-of-range Address), C(CUDA_EXCEPTION_5)),
    the kernel (demangled as C(cuda-gdb) prints it), the exception PC, the faulting SASS
    instruction and its offset in the function, the device, SM, warp and lane, and the backtrace.
  - For a dump it runs C(cuda-gdb -nx -batch -ex "target cudacore FILE" -ex bt -ex "x/i $errorpc"
    -ex "x/i $pc"). A warp error is reported after the warp moved on, so the faulting
    instruction is the one at C($errorpc) (marked C(*>)), not at C($pc) (C(=>)).
  - Before that, the file must have the ELF header of a GPU core dump (ELF64, little-endian,
    OS/ABI C(0x33), type C(ET_CORE), machine C(EM_CUDA), a 64-byte header); any other file fails
    the task and C(cuda-gdb) never sees it.
  - C(cuda-gdb) runs sandboxed, since the dump was written by the serving user, with a private
    environment (C(PATH), C(HOME), C(LC_ALL) only, none of the controller's credentials), a
    private working directory, limits on CPU time (O(timeout)), memory (4 GiB beside twice the
    dump), file size and open files, no core file, its own process group (killed whole on
    timeout), and as the dump file's owner when the module runs as root and the file is not
    root's. No network namespace (that needs root or unprivileged user namespaces).
  - Matches the kernel against the C(kernel_patterns) of the known-issues catalogue and returns
    the entry (id, title, symptom, evidence, fix), or RV(coredump.matched=null) and a message
    saying the kernel is unknown and where to add a pattern.
  - Reading a dump needs no GPU; the controller can triage dumps collected from the fleet
    (C(delegate_to) C(localhost)), or a node can triage its own.
  - Only reads; it never changes the file or the host.
options:
  path:
    description:
      - A GPU core dump (for example C(/var/lib/vllm-fleet/coredumps/core_node.1234.1767000000.nvcudmp)),
        or a text file holding what C(cuda-gdb) printed for one.
      - GPU core dumps are root-only on the fleet's nodes; reading one needs the right user.
    type: path
    required: true
  format:
    description:
      - V(cudacore) runs C(cuda-gdb) on O(path); V(cuda_gdb_output) reads O(path) as saved
        C(cuda-gdb) output.
      - V(auto) tells them apart by the first bytes; a GPU core dump is an ELF file with
        OS/ABI C(0x33) (C(ELFOSABI_CUDA)). Another ELF file (a CPU core dump), a gzip file or
        other binary data fails the task with what it is.
    type: str
    choices: [auto, cudacore, cuda_gdb_output]
    default: auto
  cuda_gdb:
    description:
      - The C(cuda-gdb) to run for a dump. By default the one on C(PATH), else
        C(/usr/local/cuda/bin/cuda-gdb).
      - Without one, a dump fails the task with how to get one; a saved output needs none.
    type: path
  catalogue:
    description:
      - The parsed known-issues catalogue, a mapping with C(schema_version) and C(known_issues);
        read C(catalogue/known_issues.yml) with the C(ansible.builtin.file) lookup and the
        C(from_yaml) filter (see the examples).
    type: raw
    required: true
  timeout:
    description:
      - Seconds C(cuda-gdb) may take to load the dump and answer (wall clock, and its CPU time limit).
    type: int
    default: 600
requirements:
  - packaging (PEP 440 versions, for the catalogue) on the Python interpreter that runs the module
  - C(cuda-gdb) from the CUDA toolkit, for a dump (not for a saved output)
notes:
  - A dump without an exception (user-triggered) or a truncated output fails the task with
    what was missing; so does garbled input.
  - To save an output for later, run the command above with the dump and redirect it to a file.
seealso:
  - module: vllm_fleet.fleet.preflight
  - name: CUDA-GDB, GPU core dump support
    description: The environment variables that make the CUDA driver write a GPU core dump.
    link: https://docs.nvidia.com/cuda/cuda-gdb/index.html#gpu-core-dump-support
extends_documentation_fragment:
  - vllm_fleet.fleet.read_only
author:
  - vllm-fleet contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Triage a dump collected to the controller
  vllm_fleet.fleet.coredump_triage:
    path: reports/coredumps/gpu-node-01/core_gpu-node-01.48213.1767104122.nvcudmp
    catalogue: "{{ lookup('ansible.builtin.file', 'catalogue/known_issues.yml') | from_yaml }}"
  delegate_to: localhost
  register: triage

- name: Say what it was
  ansible.builtin.debug:
    msg: "{{ triage.coredump.message }}"

- name: Triage an output saved where cuda-gdb ran
  vllm_fleet.fleet.coredump_triage:
    path: /tmp/core_gpu-node-01.48213.1767104122.txt
    format: cuda_gdb_output
    catalogue: "{{ lookup('ansible.builtin.file', 'catalogue/known_issues.yml') | from_yaml }}"

- name: Triage on the node with a toolkit outside PATH
  vllm_fleet.fleet.coredump_triage:
    path: /var/lib/vllm-fleet/coredumps/core_gpu-node-01.48213.1767104122.nvcudmp
    cuda_gdb: /usr/local/cuda-13.0/bin/cuda-gdb
    catalogue: "{{ lookup('ansible.builtin.file', 'catalogue/known_issues.yml') | from_yaml }}"
"""

RETURN = r"""
coredump:
  description: What the dump shows and which known issue it is.
  returned: success
  type: dict
  contains:
    path:
      description: The file triaged.
      type: str
    format:
      description: How it was read, V(cudacore) or V(cuda_gdb_output).
      type: str
      sample: cudacore
    cuda_gdb:
      description: The C(cuda-gdb) that read the dump; null for a saved output.
      type: str
    command:
      description: The C(cuda-gdb) command line; null for a saved output.
      type: list
      elements: str
    exception:
      description: The exception as C(cuda-gdb) names it.
      type: str
      sample: Warp Out-of-range Address
    exception_code:
      description: Its code, null for a name outside C(cuda-gdb)'s table.
      type: str
      sample: CUDA_EXCEPTION_5
    kernel:
      description: The kernel of the faulting warp, as C(cuda-gdb) prints it (demangled, with its
        parameter list for C++ kernels), without the launch configuration.
      type: str
      sample: cudnn_generated_fort_native_sm120_matMul_nvfp4_bf16_knob_7_128x256x128_4x1x1_cga1x1x1_kernel0_0
    kernel_base:
      description: The kernel name without return type and parameter list.
      type: str
    launch:
      description: The launch configuration, C(grid) and C(block).
      type: dict
      sample: {grid: "(148,1,1)", block: "(384,1,1)"}
    pc:
      description: The exception PC (C($errorpc)); the frame's PC when the output has none.
      type: str
      sample: "0x7f3e2b5d8a40"
    frame_pc:
      description: The PC of frame 0, where the warp stopped.
      type: str
    instruction:
      description: The faulting SASS instruction; null when the output has no disassembly.
      type: str
      sample: STS.128 [R21+0x18c40], R4
    instruction_offset:
      description: Its offset in bytes from the start of the function (C(<symbol+offset>)).
      type: int
      sample: 2624
    instruction_symbol:
      description: The function symbol of the instruction (may be mangled).
      type: str
    instruction_source:
      description: V(errorpc) (the faulting instruction) or V(pc) (only the warp's current one was
        printed); null when there is none.
      type: str
    device:
      description: Device of the faulting warp (also SM, warp and lane, and RV(coredump.focus)).
      type: int
    focus:
      description: C(cuda-gdb)'s focus on the exception, C(kernel), C(grid), C(block), C(thread),
        C(device), C(sm), C(warp), C(lane).
      type: dict
    frames:
      description: The backtrace, innermost first, each C(level), C(pc), C(function), C(launch),
        C(args), C(file), C(line), C(text).
      type: list
      elements: dict
    matched:
      description: The catalogue entry whose C(kernel_patterns) match, with C(id), C(title),
        C(severity), C(symptom), C(evidence), C(fix), C(pattern) and C(matched_name); null for an
        unknown kernel.
      type: dict
      sample:
        id: cudnn-sm12x-fusion-matmul-oob
        title: cuDNN < 9.23.1 fusion-engine matmul writes out of bounds on compute capability 12.0/12.1
        fix: Install nvidia-cudnn-cu13>=9.23.1 ...
        pattern: cudnn_generated_fort_native_sm120_matMul*
    message:
      description: One readable sentence, the fault and the known issue with its fix, or why the
        kernel is unknown and where to add a pattern.
      type: str
      sample: "unknown kernel my_kernel(int*): no catalogue entry matches; add kernel_patterns to catalogue/known_issues.yml (...)"
    notes:
      description: What the output lacked that triage could do without (no disassembly, no exception PC).
      type: list
      elements: str
    output:
      description: What C(cuda-gdb) printed (or the saved output), at most 64 KiB.
      type: str
"""

import os
import subprocess
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    # the catalogue loader needs it; checked here to fail cleanly
    import packaging.specifiers  # noqa: F401 pylint: disable=unused-import
except ImportError:
    PACKAGING_IMPORT_ERROR = traceback.format_exc()
else:
    PACKAGING_IMPORT_ERROR = None
    from ansible_collections.vllm_fleet.fleet.plugins.module_utils.known_issues import load_catalogue

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.coredump import (
    DEFAULT_CUDA_GDB_DIRS,
    ELF64_EHSIZE,
    CoreDumpFormatError,
    CoreDumpParseError,
    core_header_problem,
    cuda_gdb_command,
    detect_format,
    find_cuda_gdb,
    parse_cuda_gdb,
    run_sandboxed,
    triage,
)

OUTPUT_LIMIT = 64 * 1024
# A saved cuda-gdb output is a few KiB; anything this big is a dump given the wrong format.
SAVED_OUTPUT_MAX = 16 * 1024 * 1024


def _tail(text, chars=2000):
    text = text.strip()
    return text if len(text) <= chars else "..." + text[-chars:]


def _read(module, path, size=None):
    try:
        with open(path, "rb") as handle:
            return handle.read() if size is None else handle.read(size)
    except OSError as exc:
        hint = " (GPU core dumps are root-only: run as root)" if isinstance(exc, PermissionError) else ""
        module.fail_json(msg=f"coredump_triage: cannot read {path}: {exc.strerror}{hint}")


def _run_cuda_gdb(module, path):
    problem = core_header_problem(_read(module, path, ELF64_EHSIZE))
    if problem:
        module.fail_json(msg=f"coredump_triage: {path} is not a CUDA GPU core dump ({problem}): cuda-gdb was not "
                             "run on it. GPU core dumps are the ELF files the CUDA driver writes where "
                             "CUDA_COREDUMP_FILE says; a saved cuda-gdb output needs format cuda_gdb_output")
    explicit = module.params["cuda_gdb"]
    cuda_gdb = find_cuda_gdb(explicit)
    if cuda_gdb is None:
        looked = (f"{explicit} is not an executable file" if explicit else
                  f"none on PATH nor in {', '.join(DEFAULT_CUDA_GDB_DIRS)}")
        module.fail_json(msg=(
            f"coredump_triage: no cuda-gdb to read the GPU core dump {path} ({looked}). Install the CUDA "
            "toolkit's cuda-gdb where the task runs (reading a dump needs no GPU) or set cuda_gdb, or run "
            f"cuda-gdb -nx -batch -ex 'target cudacore {path}' -ex bt -ex 'x/i $errorpc' -ex 'x/i $pc' "
            "elsewhere and pass its saved output with format: cuda_gdb_output"))
    command = cuda_gdb_command(cuda_gdb, path)
    try:
        rc, output = run_sandboxed(command, path, module.params["timeout"])
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"coredump_triage: {cuda_gdb} did not finish reading {path} in "
                             f"{module.params['timeout']} s (raise timeout for a large dump)", command=command)
    except OSError as exc:
        module.fail_json(msg=f"coredump_triage: cannot run {cuda_gdb}: {exc.strerror}", command=command)
    return cuda_gdb, command, rc, output.decode("utf-8", errors="replace")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            format=dict(type="str", default="auto", choices=["auto", "cudacore", "cuda_gdb_output"]),
            cuda_gdb=dict(type="path"),
            catalogue=dict(type="raw", required=True),
            timeout=dict(type="int", default=600),
        ),
        supports_check_mode=True,
    )
    if PACKAGING_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("packaging"), exception=PACKAGING_IMPORT_ERROR)
    params = module.params
    path = params["path"]
    try:
        entries = load_catalogue(params["catalogue"])
    except ValueError as exc:
        module.fail_json(msg=f"coredump_triage: {exc}")
    if not os.path.isfile(path):
        module.fail_json(msg=f"coredump_triage: {path} is not a file")

    fmt = params["format"]
    if fmt == "auto":
        try:
            fmt = detect_format(_read(module, path, 64))
        except CoreDumpFormatError as exc:
            module.fail_json(msg=f"coredump_triage: {path}: {exc}")

    cuda_gdb = command = None
    if fmt == "cudacore":
        cuda_gdb, command, rc, output = _run_cuda_gdb(module, path)
        source = f"cuda-gdb ({cuda_gdb}, exit status {rc})"
    else:
        size = os.path.getsize(path)
        if size > SAVED_OUTPUT_MAX:
            module.fail_json(msg=f"coredump_triage: {path}: {size} bytes is too large for a saved cuda-gdb output "
                                 "(a few KiB); is it a GPU core dump? Use format cudacore (or auto)")
        output, rc = _read(module, path), None
        source = "the saved cuda-gdb output"
    try:
        parsed = parse_cuda_gdb(output)
    except CoreDumpParseError as exc:
        shown = output if isinstance(output, str) else output[:4096].decode("utf-8", errors="replace")
        detail = f"; cuda-gdb printed: {_tail(shown)}" if fmt == "cudacore" else ""
        module.fail_json(msg=f"coredump_triage: {path}: {source} could not be triaged: {exc}{detail}",
                         command=command, rc=rc)

    result = triage(parsed, entries)
    text = output if isinstance(output, str) else output.decode("utf-8", errors="replace")
    result.update(path=path, format=fmt, cuda_gdb=cuda_gdb, command=command, output=text[:OUTPUT_LIMIT])
    module.exit_json(changed=False, coredump=result)


if __name__ == "__main__":
    main()
