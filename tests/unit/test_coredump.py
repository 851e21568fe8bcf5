"""GPU core-dump triage: the cuda-gdb output parser and the catalogue match on composed
outputs (tests/fixtures/coredumps), the stand-in cuda-gdb and the stand-in vLLM's dump, and
the coredump_triage module run once through ansible-playbook on localhost."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_fleet.fleet.plugins.module_utils import coredump
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.coredump import (
    CoreDumpFormatError,
    CoreDumpParseError,
    cuda_gdb_command,
    detect_format,
    find_cuda_gdb,
    parse_cuda_gdb,
    triage,
)
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.known_issues import load_catalogue

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
RECORDED = ROOT / "tests" / "fixtures" / "coredumps"
CUDA_GDB = ROOT / "tests" / "fixtures" / "cuda_gdb" / "cuda-gdb"
STANDIN_SRC = ROOT / "tests" / "fixtures" / "vllm_standin" / "src"
CATALOGUE = yaml.safe_load((ROOT / "catalogue" / "known_issues.yml").read_text())
ENTRIES = load_catalogue(CATALOGUE)
CUDNN = "cudnn-sm12x-fusion-matmul-oob"
STORY_KERNEL = "cudnn_generated_fort_native_sm120_matMul_nvfp4_bf16_knob_7_128x256x128_4x1x1_cga1x1x1_kernel0_0"
UNKNOWN_HINT = "no catalogue entry matches; add kernel_patterns to catalogue/known_issues.yml"


def fixture(name: str) -> bytes:
    return (RECORDED / name).read_bytes()


def standin_coredump():
    """The stand-in vLLM's dump writer, loaded alone (stdlib only; no vllm package import)."""
    spec = importlib.util.spec_from_file_location("standin_coredump", STANDIN_SRC / "vllm" / "coredump.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def squash(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ composed outputs (tests/fixtures/coredumps)


def test_story_dump_names_the_cudnn_kernel_the_instruction_and_the_fix():
    parsed = parse_cuda_gdb(fixture("sm120_cudnn_matmul_oob.txt"))
    assert parsed["exception"] == "Warp Out-of-range Address"
    assert parsed["exception_code"] == "CUDA_EXCEPTION_5"
    assert parsed["kernel"] == STORY_KERNEL
    assert parsed["launch"] == {"grid": "(148,1,1)", "block": "(384,1,1)"}
    # The exception PC ($errorpc), not where the warp stopped (the frame's PC).
    assert parsed["pc"] == "0x7f3e2b5d8a40"
    assert int(parsed["frame_pc"], 16) == 0x7F3E2B5D8A70
    assert parsed["instruction"] == "STS.128 [R21+0x18c40], R4"  # a shared store past the block's shared memory
    assert parsed["instruction_offset"] == 2624
    assert parsed["instruction_source"] == "errorpc"
    assert (parsed["device"], parsed["sm"], parsed["warp"], parsed["lane"]) == (0, 46, 9, 0)
    assert parsed["focus"]["block"] == "(37,0,0)" and parsed["focus"]["thread"] == "(256,0,0)"
    assert [f["level"] for f in parsed["frames"]] == [0]
    assert parsed["core_file"].endswith("core_gpu-node-01.48213.1767104122.nvcudmp")
    assert parsed["notes"] == []

    result = triage(parsed, ENTRIES)
    matched = result["matched"]
    assert matched["id"] == CUDNN
    assert matched["pattern"] == "cudnn_generated_fort_native_sm120_matMul*"
    assert "nvidia-cudnn-cu13>=9.23.1" in matched["fix"]
    assert any("core dump" in e for e in matched["evidence"])
    message = result["message"]
    assert message.startswith(f"Warp Out-of-range Address (CUDA_EXCEPTION_5) in kernel {STORY_KERNEL} at +2624: "
                              "STS.128 [R21+0x18c40], R4: known issue cudnn-sm12x-fusion-matmul-oob (blocker)")
    assert "Fix: Install nvidia-cudnn-cu13>=9.23.1" in message


def test_misaligned_address_from_a_live_session_is_the_same_known_issue():
    parsed = parse_cuda_gdb(fixture("misaligned_address.txt"))
    assert parsed["exception"] == "Warp Misaligned Address"
    assert parsed["exception_code"] == "CUDA_EXCEPTION_6"  # from "received signal CUDA_EXCEPTION_6"
    assert parsed["kernel"] == STORY_KERNEL
    assert (parsed["instruction"], parsed["instruction_offset"]) == ("STS.64 [R13+0x6a04], R6", 6928)
    assert parsed["focus"]["kernel"] == 3 and parsed["sm"] == 102
    assert parsed["core_file"] is None
    assert triage(parsed, ENTRIES)["matched"]["id"] == CUDNN


def test_unknown_kernel_gets_a_clear_answer():
    parsed = parse_cuda_gdb(fixture("unknown_kernel.txt"))
    assert parsed["exception"] == "Warp Illegal Address" and parsed["exception_code"] == "CUDA_EXCEPTION_14"
    assert parsed["kernel"].startswith("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, "
                                       "(vllm::Fp8KVCacheDataType)1>(__nv_bfloat16 const*")
    assert parsed["kernel_base"] == ("vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, "
                                     "(vllm::Fp8KVCacheDataType)1>")
    assert parsed["instruction_symbol"].startswith("_ZN4vllm30reshape_and_cache_flash_kernel")
    result = triage(parsed, ENTRIES)
    assert result["matched"] is None
    assert result["message"].startswith(f"unknown kernel {parsed['kernel']}: {UNKNOWN_HINT} (Warp Illegal Address "
                                        "(CUDA_EXCEPTION_14) at +1104: STG.E.U8 desc[UR6][R4.64], R9)")


# Every shape cuda-gdb prints for these fields, one composed fixture each (README.md).
@pytest.mark.parametrize("name, kernel, pc, instruction, offset", [
    ("sm120_cudnn_matmul_oob.txt", STORY_KERNEL, "0x7f3e2b5d8a40", "STS.128 [R21+0x18c40], R4", 2624),  # symbols
    ("misaligned_address.txt", STORY_KERNEL, "0x7f3e2b5d9b10", "STS.64 [R13+0x6a04], R6", 6928),  # live session
    # x/i $errorpc without <symbol+offset>; the offset from x/i $pc's symbol of the same kernel
    ("errorpc_without_symbol.txt", STORY_KERNEL, "0x7f3e2b5d8a40", "STS.128 [R21+0x18c40], R4", 2624),
    # the kernel from 'info cuda kernels' (the newer "Name Args" table): the bt frame has no <<<...>>>
    ("info_cuda_kernels.txt", STORY_KERNEL, "0x7f3e2b5d8a40", "STS.128 [R21+0x18c40], R4", 2624),
    # $errorpc printed alone in a live session, bt frames with arguments: address and offset, no text
    ("print_errorpc.txt", "illegalMemoryAccessKernel", "0x7f31abb9f6d0", None, 208),
])
def test_each_shape_gives_the_faulting_instruction_and_its_offset(name, kernel, pc, instruction, offset):
    parsed = parse_cuda_gdb(fixture(name))
    assert parsed["kernel"] == kernel and parsed["launch"]["grid"]
    assert (parsed["pc"], parsed["instruction_address"]) == (pc, pc)
    assert (parsed["instruction"], parsed["instruction_offset"], parsed["instruction_source"]) == (
        instruction, offset, "errorpc")


def test_a_kernel_without_symbols_still_gives_its_faulting_instruction():
    parsed = parse_cuda_gdb(fixture("no_symbols.txt"))
    # The issue's line: "=> 0x7fffd2a41c30:\tLDG.E.128 R4, [R2.64]", its address the exception PC.
    assert (parsed["instruction"], parsed["instruction_address"], parsed["instruction_source"]) == (
        "LDG.E.128 R4, [R2.64]", "0x7fffd2a41c30", "errorpc")
    # Nothing in the output names the kernel's start: the offset is unknown, and said so.
    assert parsed["instruction_offset"] is None and parsed["instruction_symbol"] is None
    assert any("offset within the kernel is unknown" in note for note in parsed["notes"])
    assert triage(parsed, ENTRIES)["message"].endswith("(Warp Illegal Address (CUDA_EXCEPTION_14) at PC 0x7fffd2a41c30)")


def test_frames_with_arguments_and_a_wrapped_location():
    parsed = parse_cuda_gdb(fixture("print_errorpc.txt"))
    [frame] = parsed["frames"]
    assert (frame["args"], frame["file"], frame["line"]) == ("(ptr=0x7f31a0000000, n=1024)", "fault.cu", 12)
    assert parsed["instruction_symbol"] == "_Z25illegalMemoryAccessKernelPii"
    assert any("printed but not disassembled" in note for note in parsed["notes"])


def test_a_print_of_another_register_is_not_the_exception_pc():
    # Negative control: '$1 = ...' after 'p $pc' is the warp's PC, not the faulting instruction.
    text = fixture("print_errorpc.txt").decode().replace("p $errorpc", "p $pc").replace("0x7f31abb9f6d0 <", "0x7f31abb9f6e0 <")
    text = text.replace("+208>", "+224>")
    parsed = parse_cuda_gdb(text)
    assert parsed["instruction_source"] is None and parsed["instruction_offset"] is None


def test_truncated_output_is_a_clear_error():
    with pytest.raises(CoreDumpParseError) as error:
        parse_cuda_gdb(fixture("truncated.txt"))
    message = str(error.value)
    assert message.startswith("truncated output: it ends mid-line inside the backtrace")
    assert "Warp Out-of-range Address" in message  # what was found
    assert "KERNEL<<<(grid),(block)>>>" in message  # what was expected


def test_garbage_bytes_are_a_clear_error():
    with pytest.raises(CoreDumpParseError, match=r"^garbled input: \d+ of the first \d+ characters are not "
                                                 r"printable text.*expected the text cuda-gdb prints"):
        parse_cuda_gdb(fixture("garbage.bin"))
    with pytest.raises(CoreDumpFormatError, match="neither a GPU core dump .* nor a saved cuda-gdb output"):
        detect_format(fixture("garbage.bin")[:64])


# ------------------------------------------------------------------ other shapes of input

STORY = fixture("sm120_cudnn_matmul_oob.txt").decode()


@pytest.mark.parametrize("text, expected", [
    ("", r"^empty input: expected what cuda-gdb prints"),
    ("   \n\n", r"^empty input"),
    ("No symbol table is loaded.  Use the \"file\" command.\nNo stack.\n",
     r"^no CUDA exception found: expected a line 'CUDA Exception: <name>'.*starts with: No symbol table"),
    ("Opening GPU coredump: /tmp/core.nvcudmp\n",
     r"^truncated output: cuda-gdb opened the GPU core dump \(/tmp/core.nvcudmp\) but no 'CUDA Exception"),
    ("CUDA Exception: Warp Illegal Address\nThe exception was triggered at PC 0x1234  k()\n",
     r"^truncated output: found the exception \(Warp Illegal Address\) but no backtrace frame"),
    ("CUDA Exception: Warp Illegal Address\n#0  0x0000000000001234 in helper (x=1) at a.cu:3\n",
     r"^no kernel launch frame: found the exception .* frames \(#0  0x0000000000001234 in helper"),
    (b"\x1f\x8b\x08\x00" + bytes(60), r"^garbled input: gzip-compressed data"),
])
def test_bad_input_says_what_was_missing_and_what_was_expected(text, expected):
    with pytest.raises(CoreDumpParseError, match=expected):
        parse_cuda_gdb(text)


def test_output_cut_after_the_first_frame_still_names_the_kernel_with_notes():
    cut = STORY[:STORY.index("*> 0x7f3e2b5d8a40") + len("*> 0x7f3e2b5d8a40 <cudnn_gen")]
    parsed = parse_cuda_gdb(cut)
    assert parsed["kernel"] == STORY_KERNEL and parsed["instruction"] is None
    assert any("ends mid-line" in note for note in parsed["notes"])
    assert any("x/i $errorpc" in note for note in parsed["notes"])
    assert triage(parsed, ENTRIES)["matched"]["id"] == CUDNN


def test_only_the_warps_pc_disassembled_is_noted():
    text = STORY.replace("*> 0x7f3e2b5d8a40", "   0x7f3e2b5d8a30").replace(
        "The exception was triggered at PC 0x7f3e2b5d8a40", "The exception was triggered at PC 0x7f3e2b5d8a40")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("   0x7f3e2b5d8a30")) + "\n"
    parsed = parse_cuda_gdb(text)
    assert parsed["instruction"] == "BAR.SYNC.DEFER_BLOCKING 0x0"
    assert parsed["instruction_source"] == "pc"
    assert parsed["pc"] == "0x7f3e2b5d8a40"
    assert any("not the exception PC" in note for note in parsed["notes"])


def test_debug_build_backtrace_with_a_device_function_and_wrapped_frames():
    # The shape of a -G build: frame #0 a device function with a source line, the kernel
    # (inlined, no address) at #1, its arguments wrapped by gdb onto indented lines.
    text = (
        "CUDA Exception: Warp Illegal Address\n"
        "The exception was triggered at PC 0x56204c84ebf0 (cuda_fp16.hpp:255)\n"
        "\n"
        'Thread 1 "decoding_exampl" received signal CUDA_EXCEPTION_14, Warp Illegal Address.\n'
        "[Switching focus to CUDA kernel 2, grid 406, block (0,0,0), thread (384,0,0), device 0, sm 0, warp 14, "
        "lane 0]\n"
        "0x000056204c84ec00 in operator* (lh=0x7f45aad14300, rh=0x7f45d4fffdb8)\n"
        "    at /usr/local/cuda/bin/../targets/x86_64-linux/include/cuda_fp16.hpp:255\n"
        "255     __device__ __forceinline__ __half operator*(const __half &lh, const __half &rh) { ... }\n"
        "(cuda-gdb) bt\n"
        "#0  0x000056204c84ec00 in operator* (lh=0x7f45aad14300, rh=0x7f45d4fffdb8)\n"
        "    at /usr/local/cuda/bin/../targets/x86_64-linux/include/cuda_fp16.hpp:255\n"
        "#1  fastertransformer::embeddingLookupPosEncoding<__half><<<(4,1,1),(512,1,1)>>> (from_tensor=0x7f45869a3400,\n"
        "    embedding_table=0x7f45a7c00000, position_encoding=0x7f4583c00000, batch_size=4, ite=0, scale=22.625)\n"
        "    at /src/fastertransformer/kernels/decoding_kernels.cu:112\n"
    )
    parsed = parse_cuda_gdb(text)
    assert parsed["kernel"] == "fastertransformer::embeddingLookupPosEncoding<__half>"
    assert parsed["launch"] == {"grid": "(4,1,1)", "block": "(512,1,1)"}
    assert parsed["source_location"] == "cuda_fp16.hpp:255" and parsed["exception_function"] is None
    frames = parsed["frames"]
    assert [f["level"] for f in frames] == [0, 1]
    assert frames[0]["function"] == "operator*" and frames[0]["line"] == 255
    assert frames[1]["pc"] is None and frames[1]["file"].endswith("decoding_kernels.cu") and frames[1]["line"] == 112
    assert "scale=22.625" in frames[1]["args"]
    assert (parsed["warp"], parsed["focus"]["thread"]) == (14, "(384,0,0)")
    assert parsed["instruction"] is None


@pytest.mark.parametrize("name, code", [
    ("Warp Out-of-range Address", "CUDA_EXCEPTION_5"),
    ("Warp Out of range Address", "CUDA_EXCEPTION_5"),  # the current manual's spelling
    ("Warp Illegal Instruction", "CUDA_EXCEPTION_4"),
    ("Device Illegal Address", "CUDA_EXCEPTION_10"),
    ("Something New", None),
])
def test_exception_codes(name, code):
    assert coredump.exception_code(name) == code


def test_output_saved_from_a_terminal_with_gdb_styling_parses():
    styled = STORY.replace("cudnn_generated", "\x1b[33mcudnn_generated").replace("<<<", "\x1b[m<<<")
    styled = styled.replace("0x7f3e2b5d8a40", "\x1b[34m0x7f3e2b5d8a40\x1b[m")
    parsed = parse_cuda_gdb(styled.encode())
    assert parsed["kernel"] == STORY_KERNEL and parsed["pc"] == "0x7f3e2b5d8a40"


def test_crlf_and_a_new_exception_name_parse_with_a_note():
    parsed = parse_cuda_gdb(STORY.replace("Warp Out-of-range Address", "Warp Something New").replace("\n", "\r\n"))
    assert parsed["exception"] == "Warp Something New" and parsed["exception_code"] is None
    assert any("not in cuda-gdb's exception table" in note for note in parsed["notes"])
    assert parsed["instruction"] == "STS.128 [R21+0x18c40], R4"


def test_sm121_kernel_and_mangled_names_match():
    sm121 = parse_cuda_gdb(STORY.replace("sm120_matMul", "sm121_matMul"))
    assert triage(sm121, ENTRIES)["matched"]["pattern"] == "cudnn_generated_fort_native_sm121_matMul*"
    catalogue = json.loads(json.dumps(CATALOGUE))
    catalogue["known_issues"][1]["kernel_patterns"] = ["_ZN4vllm30reshape_and_cache_flash_kernel*"]
    unknown = parse_cuda_gdb(fixture("unknown_kernel.txt"))
    result = triage(unknown, load_catalogue(catalogue))
    assert result["matched"]["id"] == catalogue["known_issues"][1]["id"]
    assert result["matched"]["matched_name"] == unknown["instruction_symbol"]


# ------------------------------------------------------------------ formats and cuda-gdb


def elf_header(osabi: int, machine: int) -> bytes:
    return (b"\x7fELF" + bytes([2, 1, 1, osabi, 0]) + bytes(7)
            + struct.pack("<HHIQQQIHHHHHH", 4, machine, 1, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0))


def test_detect_format():
    assert detect_format(standin_coredump().elf_header()) == "cudacore"
    assert detect_format(elf_header(0x33, 0xBE)) == "cudacore"
    assert detect_format(STORY.encode()[:64]) == "cuda_gdb_output"
    with pytest.raises(CoreDumpFormatError, match=r"not a GPU core dump \(OS/ABI 0x0, machine 0x3e.*a CPU core dump"):
        detect_format(elf_header(0, 0x3E))
    with pytest.raises(CoreDumpFormatError, match="gzip-compressed"):
        detect_format(b"\x1f\x8b\x08" + bytes(61))


def test_find_cuda_gdb(tmp_path):
    tool = tmp_path / "bin" / "cuda-gdb"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    assert find_cuda_gdb(str(tool)) is None  # not executable
    tool.chmod(0o755)
    assert find_cuda_gdb(str(tool)) == str(tool)
    assert find_cuda_gdb(path=str(tool.parent)) == str(tool)
    assert find_cuda_gdb(path=str(tmp_path), extra_dirs=(str(tool.parent),)) == str(tool)
    assert find_cuda_gdb(path=str(tmp_path), extra_dirs=()) is None


def test_the_command_disassembles_the_exception_pc_after_the_backtrace():
    argv = cuda_gdb_command("/usr/local/cuda/bin/cuda-gdb", "/d/core.nvcudmp")
    assert argv == ["/usr/local/cuda/bin/cuda-gdb", "-nx", "-batch", "-ex", "target cudacore /d/core.nvcudmp",
                    "-ex", "bt", "-ex", "x/i $errorpc", "-ex", "x/i $pc"]


def write_standin_dump(path: Path, cuda_error="an illegal memory access was encountered", capability=(12, 0),
                       rule="stochastic") -> dict:
    writer = standin_coredump()
    data = writer.record(rule, capability, cuda_error, random.Random(7), "gpu-node-01", 4242, 1767104122)
    writer.write(str(path), data)
    return data


def run_cuda_gdb(core: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cuda_gdb_command(str(CUDA_GDB), str(core)), capture_output=True, text=True, timeout=30)


def test_standin_cuda_gdb_reads_the_standin_dump_like_the_real_one(tmp_path):
    core = tmp_path / "core_gpu-node-01.4242.1767104122.nvcudmp"
    data = write_standin_dump(core)
    run = run_cuda_gdb(core)
    assert run.returncode == 0, run.stderr
    parsed = parse_cuda_gdb(run.stdout)
    assert parsed["kernel"] == STORY_KERNEL
    assert parsed["exception"] == "Warp Out-of-range Address"
    assert parsed["instruction"] == data["instruction"] and parsed["instruction_offset"] == data["errorpc_offset"]
    assert parsed["core_file"] == str(core)
    assert triage(parsed, ENTRIES)["matched"]["id"] == CUDNN

    misaligned = tmp_path / "misaligned.nvcudmp"
    write_standin_dump(misaligned, "misaligned address", capability=(12, 1))
    parsed = parse_cuda_gdb(run_cuda_gdb(misaligned).stdout)
    assert parsed["exception_code"] == "CUDA_EXCEPTION_6" and "sm121_matMul" in parsed["kernel"]
    assert triage(parsed, ENTRIES)["matched"]["id"] == CUDNN

    nvfp4_kv = tmp_path / "nvfp4.nvcudmp"
    write_standin_dump(nvfp4_kv, rule="first_batch")
    result = triage(parse_cuda_gdb(run_cuda_gdb(nvfp4_kv).stdout), ENTRIES)
    assert result["matched"] is None and result["message"].startswith("unknown kernel void vllm::")


def test_standin_cuda_gdb_fails_like_cuda_gdb_on_what_is_not_a_dump(tmp_path):
    run = run_cuda_gdb(RECORDED / "garbage.bin")
    assert run.returncode == 1
    assert "is not a CUDA GPU core dump" in run.stderr and "No stack." in run.stderr
    with pytest.raises(CoreDumpParseError, match="^no CUDA exception found"):
        parse_cuda_gdb(run.stdout + run.stderr)

    core = tmp_path / "core.nvcudmp"
    write_standin_dump(core)
    truncated = tmp_path / "truncated.nvcudmp"
    truncated.write_bytes(core.read_bytes()[:200])
    run = run_cuda_gdb(truncated)
    assert run.returncode == 1
    with pytest.raises(CoreDumpParseError, match=r"^truncated output: cuda-gdb opened the GPU core dump"):
        parse_cuda_gdb(run.stdout + run.stderr)


# ------------------------------------------------------------------ the stand-in vLLM writes the dump


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """The fake NVML and a site dir with the stand-in torch and the crashing cuDNN (9.19)."""
    from tests.fixtures.nvml.build import build_fake_nvml
    from tests.fixtures.wheels.build import build_wheelhouse

    root = tmp_path_factory.mktemp("gpu")
    nvml = build_fake_nvml(root / "nvml").parent
    wheelhouse = build_wheelhouse(root / "wheelhouse")
    site = root / "site"
    for wheel in ("torch-2.11.0-py3-none-manylinux_2_17_x86_64.whl",
                  "nvidia_cudnn_cu13-9.19.0.56-py3-none-manylinux_2_17_x86_64.whl"):
        with zipfile.ZipFile(wheelhouse / wheel) as whl:
            whl.extractall(site)
    return {"nvml": nvml, "site": site}


def serve_until_crash(gpu, tmp_path: Path, extra_env: dict) -> tuple[subprocess.CompletedProcess, str]:
    from tests.fixtures.nvml.build import PROFILES_DIR

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "CUDA_"))}
    env.update(PYTHONPATH=f"{STANDIN_SRC}{os.pathsep}{gpu['site']}", LD_LIBRARY_PATH=str(gpu["nvml"]),
               FAKE_NVML_CONFIG=str(PROFILES_DIR / "rtx_pro_6000.conf"), PYTHONUNBUFFERED="1",
               VLLM_STANDIN_LOAD_SECONDS="0.1", VLLM_STANDIN_TOKENS_PER_SECOND="50000",
               VLLM_STANDIN_STEP_SECONDS="0.005", VLLM_STANDIN_EXIT_DELAY_SECONDS="0.2",
               VLLM_STANDIN_SEED="3", VLLM_STANDIN_MEAN_STEPS_TO_CRASH="3", **extra_env)
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.cli", "serve", "/models/qwen3.6-35b-a3b-nvfp4", "--host", "127.0.0.1",
             "--port", str(port), "--max-model-len", "8192", "--kv-cache-dtype", "fp8"],
            env=env, cwd=tmp_path, stdout=stderr, stderr=stderr)  # vLLM logs on stdout
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", method="POST",
                data=json.dumps({"prompt": "word " * 300, "max_tokens": 64, "ignore_eos": True}).encode(),
                headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=5).read()
            except OSError:
                time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    return proc, err.read_text()


def engine_core_pid(output: str) -> int:
    return int(output.split("(EngineCore pid=", 1)[1].split(")", 1)[0])


def test_standin_vllm_writes_the_dump_where_cuda_coredump_file_says_and_aborts(gpu, tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    proc, stderr = serve_until_crash(gpu, tmp_path, {
        "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1", "CUDA_COREDUMP_SHOW_PROGRESS": "1",
        "CUDA_COREDUMP_FILE": f"{drop}/core_%h.%p.%t.nvcudmp"})
    # The driver aborts the faulting process after the dump: the EngineCore child (SIGABRT);
    # the API server sees its engine gone and exits 0, as 0.25.1 does.
    assert proc.returncode == 0, stderr[-3000:]
    assert "[shutdown] MPClient: engine core exited unexpectedly" in stderr
    [core] = list(drop.iterdir())
    host, pid, stamp = core.name[len("core_"):-len(".nvcudmp")].rsplit(".", 2)
    assert (host, int(pid)) == (socket.gethostname(), engine_core_pid(stderr)) and int(pid) != proc.pid
    assert abs(int(stamp) - time.time()) < 60
    assert "coredump: Detected an exception of type CUDBG_EXCEPTION_WARP_" in stderr
    assert f"coredump: Writing ELF file to {core}" in stderr
    assert "torch.AcceleratorError" not in stderr  # the process never got to see the error
    assert detect_format(core.read_bytes()[:64]) == "cudacore"
    result = triage(parse_cuda_gdb(run_cuda_gdb(core).stdout), ENTRIES)
    assert result["matched"]["id"] == CUDNN and result["kernel"] == STORY_KERNEL


def test_standin_vllm_without_abort_dumps_then_exits_0_like_0_25_1(gpu, tmp_path):
    proc, stderr = serve_until_crash(gpu, tmp_path, {
        "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1", "CUDA_COREDUMP_GENERATION_FLAGS": "skip_global_memory,skip_abort"})
    assert proc.returncode == 0, stderr[-3000:]
    [core] = list(tmp_path.glob("core_*_*_*.nvcudmp"))  # the default name, in the working directory
    assert core.name.endswith(f"_{engine_core_pid(stderr)}.nvcudmp")
    assert "torch.AcceleratorError: CUDA error" in stderr
    assert "coredump:" not in stderr  # no progress lines unless asked


# ------------------------------------------------------------------ the module, through Ansible once

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars_files: [cases.json]
  tasks:
    - name: Triage
      vllm_fleet.fleet.coredump_triage:
        path: "{{ item.value.path }}"
        format: "{{ item.value.format | default(omit) }}"
        cuda_gdb: "{{ item.value.cuda_gdb | default(omit) }}"
        catalogue: "{{ catalogue }}"
      loop: "{{ cases | dict2items }}"
      loop_control: {label: "{{ item.key }}"}
      check_mode: true   # it only reads
      register: triaged
      ignore_errors: true

    - name: Save the results by case
      ansible.builtin.copy:
        content: "{{ dict(triaged.results | map(attribute='item.key') | zip(triaged.results)) | to_json }}"
        dest: "{{ results_path }}"
        mode: "0600"
      check_mode: false
"""


@pytest.fixture(scope="module")
def module_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triage_module")
    core = tmp / "core_gpu-node-01.4242.1767104122.nvcudmp"
    write_standin_dump(core)
    cases = {
        "saved_output": {"path": str(RECORDED / "sm120_cudnn_matmul_oob.txt")},
        "saved_unknown": {"path": str(RECORDED / "unknown_kernel.txt"), "format": "cuda_gdb_output"},
        "cudacore_on_path": {"path": str(core)},
        "cudacore_explicit": {"path": str(core), "format": "cudacore", "cuda_gdb": str(CUDA_GDB)},
        "no_cuda_gdb": {"path": str(core), "cuda_gdb": str(tmp / "no-such-cuda-gdb")},
        "truncated": {"path": str(RECORDED / "truncated.txt")},
        "garbage_auto": {"path": str(RECORDED / "garbage.bin")},
        "garbage_as_core": {"path": str(RECORDED / "garbage.bin"), "format": "cudacore"},
        "missing": {"path": str(tmp / "nothing-here")},
    }
    (tmp / "cases.json").write_text(json.dumps({"catalogue": CATALOGUE, "cases": cases}))
    (tmp / "playbook.yml").write_text(PLAYBOOK)
    results_path = tmp / "results.json"
    env = dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp / "tmp"),
               ANSIBLE_NOCOLOR="1", PATH=f"{CUDA_GDB.parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"results_path={results_path}",
         str(tmp / "playbook.yml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return json.loads(results_path.read_text())


def test_module_triages_a_saved_output(module_results):
    result = module_results["saved_output"]
    assert not result.get("failed") and result["changed"] is False
    dump = result["coredump"]
    assert (dump["format"], dump["cuda_gdb"], dump["command"]) == ("cuda_gdb_output", None, None)
    assert dump["kernel"] == STORY_KERNEL and dump["instruction_offset"] == 2624
    assert dump["matched"]["id"] == CUDNN and "nvidia-cudnn-cu13>=9.23.1" in dump["matched"]["fix"]
    assert "Opening GPU coredump" in dump["output"]

    unknown = module_results["saved_unknown"]["coredump"]
    assert unknown["matched"] is None and UNKNOWN_HINT in unknown["message"]


def test_module_runs_cuda_gdb_on_a_dump(module_results):
    for case in ("cudacore_on_path", "cudacore_explicit"):
        result = module_results[case]
        assert not result.get("failed"), result
        dump = result["coredump"]
        assert dump["format"] == "cudacore"
        assert dump["cuda_gdb"] == str(CUDA_GDB)
        assert dump["command"][1:] == ["-nx", "-batch", "-ex", f"target cudacore {dump['path']}", "-ex", "bt",
                                       "-ex", "x/i $errorpc", "-ex", "x/i $pc"]
        assert dump["matched"]["id"] == CUDNN and dump["exception"] == "Warp Out-of-range Address"


@pytest.mark.parametrize("case, expected", [
    ("no_cuda_gdb", "no cuda-gdb to read the GPU core dump .* is not an executable file\\). Install the CUDA "
                    "toolkit's cuda-gdb .* format: cuda_gdb_output"),
    ("truncated", "the saved cuda-gdb output could not be triaged: truncated output: it ends mid-line"),
    ("garbage_auto", "neither a GPU core dump \\(an ELF file with OS/ABI 0x33\\) nor a saved cuda-gdb output"),
    # Refused before cuda-gdb sees it (a text file was once triaged as the cuDNN kernel).
    ("garbage_as_core", "garbage.bin is not a CUDA GPU core dump \\(not an ELF file .*\\): cuda-gdb was not run on it"),
    ("missing", "nothing-here is not a file"),
])
def test_module_failures_are_clear(module_results, case, expected):
    result = module_results[case]
    assert result["failed"] is True
    assert "Traceback" not in str(result.get("exception", "")) and "module_stderr" not in result
    assert result["msg"].startswith("coredump_triage: ")
    assert re.search(expected, squash(result["msg"])), result["msg"]


# ------------------------------------------------------------------ the node's mover

MOVER = ROOT / "roles" / "coredump" / "files" / "coredump-move"


@pytest.mark.skipif(os.geteuid() != 0, reason="the mover hands dumps to root: it needs root (as on the node)")
def test_mover_claims_dumps_root_only_and_refuses_what_is_not_a_dump(tmp_path):
    drop, store, outside = tmp_path / "drop", tmp_path / "store", tmp_path / "outside"
    for directory in (drop, store, outside):
        directory.mkdir()
    writer_uid = 65534  # nobody: the serving user in this test
    (outside / "secret").write_text("not yours")
    (drop / "core_a.1.1.nvcudmp").write_bytes(b"\x7fELF first part")
    os.chown(drop / "core_a.1.1.nvcudmp", writer_uid, writer_uid)
    os.chmod(drop / "core_a.1.1.nvcudmp", 0o644)
    (drop / "link.nvcudmp").symlink_to(outside / "secret")
    (drop / "a-dir").mkdir()
    (drop / "a-dir" / "inner").write_text("x")
    os.link(outside / "secret", drop / "hardlink.nvcudmp")
    (store / "core_a.1.1.nvcudmp").write_text("an older dump of the same name")
    # A dump still being written: the writer's descriptor outlives the move.
    growing = open(drop / "core_b.2.2.nvcudmp", "wb")
    growing.write(b"header ")
    growing.flush()

    run = subprocess.run([sys.executable, str(MOVER), str(drop), str(store)], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, run.stderr
    growing.write(b"and the rest")
    growing.close()

    assert list(drop.iterdir()) == []
    assert sorted(p.name for p in store.iterdir()) == ["core_a.1.1.nvcudmp", "core_a.1.1.nvcudmp.1",
                                                       "core_b.2.2.nvcudmp"]
    for name in ("core_a.1.1.nvcudmp.1", "core_b.2.2.nvcudmp"):
        st = (store / name).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600), name
    assert (store / "core_a.1.1.nvcudmp").read_text() == "an older dump of the same name"
    assert (store / "core_a.1.1.nvcudmp.1").read_bytes() == b"\x7fELF first part"
    assert (store / "core_b.2.2.nvcudmp").read_bytes() == b"header and the rest"
    # What the serving user could have planted is deleted, and what it pointed at is untouched.
    assert (outside / "secret").read_text() == "not yours" and (outside / "secret").stat().st_mode & 0o777 == 0o644
    assert "moved core_a.1.1.nvcudmp to" in run.stdout and "written by uid 65534" in run.stdout
    for refused in ("link.nvcudmp: cannot open it without following links", "a-dir: not a regular file",
                    "hardlink.nvcudmp: 2 hard links"):
        assert f"refused {refused}" in run.stdout, run.stdout
    assert "2 dump(s) moved" in run.stdout


def test_mover_refuses_two_filesystems(tmp_path):
    if os.stat(tmp_path).st_dev == os.stat("/dev/shm").st_dev:
        pytest.skip("no second filesystem to try")
    run = subprocess.run([sys.executable, str(MOVER), str(tmp_path), "/dev/shm"], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 1 and "different filesystems" in run.stderr
