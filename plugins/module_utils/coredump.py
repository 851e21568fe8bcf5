"""GPU core-dump triage: read what cuda-gdb prints for a CUDA core dump, name the exception,
the kernel and the faulting instruction, and match the kernel against the known-issues
catalogue (``kernel_patterns``).

Plain Python on purpose (no ``ansible`` import): the coredump_triage module is a thin
wrapper, and everything here is unit-tested on cuda-gdb outputs composed from the manual
and published sessions (tests/fixtures/coredumps/; none captured from a GPU yet).

What cuda-gdb prints (CUDA-GDB manual, "GPU core dump support" and "Disassembly"; the
vLLM blog "CUDA Core Dump: An Effective Tool to Debug Memory Access Issues"):

    $ cuda-gdb -nx -batch -ex "target cudacore FILE" -ex bt -ex 'x/i $errorpc' -ex 'x/i $pc'
    Opening GPU coredump: FILE

    CUDA Exception: Warp Illegal Address
    The exception was triggered at PC 0x7f31abb9f6d0  illegalMemoryAccessKernel(int*, int)
    [Current focus set to CUDA kernel 0, grid 1, block (0,0,0), thread (0,0,0), device 0, sm 124, warp 0, lane 0]
    #0  0x00007f31abb9f6e0 in illegalMemoryAccessKernel(int*, int)<<<(1,1,1),(256,1,1)>>> ()
    #0  0x00007f31abb9f6e0 in illegalMemoryAccessKernel(int*, int)<<<(1,1,1),(256,1,1)>>> ()
    *> 0x7f31abb9f6d0 <_Z25illegalMemoryAccessKernelPii+208>:	STG.E [R2.64], R5
    => 0x7f31abb9f6e0 <_Z25illegalMemoryAccessKernelPii+224>:	EXIT

Warp errors are reported after the warp moved on, so the frame's PC is not the faulting
one: ``$errorpc`` is (the manual: "The reported $errorpc shall contain the precise address
of the instruction that caused the exception"), and the disassembly marks it ``*>``
(``=>`` is the current PC, ``*=>`` both). A live session prints ``Thread 1 "python3"
received signal CUDA_EXCEPTION_14, Warp Illegal Address.`` and ``[Switching focus to ...]``
instead; both shapes are read.

Also read: an instruction line without ``<symbol+offset>`` (``=> 0x7fffd2a41c30:\tLDG.E.128
R4, [R2.64]``, a kernel without symbols: it is the faulting one when its address is the
exception PC), ``$errorpc`` printed alone (``$1 = (void (*)(void)) 0x... <kernel+208>``,
the exception PC, and its offset), ``bt`` frames with and without arguments, and the
``info cuda kernels`` table (the kernel and its launch when no frame carries
``<<<grid,block>>>``). Without any symbol the offset is derived from another address of the
same kernel that has one; with none at all it stays null and a note says so.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import tempfile
from typing import Any

from ansible_collections.vllm_fleet.fleet.plugins.module_utils.known_issues import match_kernel

# cuda-gdb's exception names and their codes (CUDA-GDB manual, "GPU Error Reporting";
# the older manuals' names for the codes the newer ones mark deprecated). Keys are
# normalised: lower case, dashes as spaces ("Warp Out-of-range Address" in older
# releases, "Warp Out of range Address" in the current table).
EXCEPTION_CODES = {
    "device unknown exception": 0,
    "lane illegal address": 1,
    "lane user stack overflow": 2,
    "device hardware stack overflow": 3,
    "warp illegal instruction": 4,
    "warp out of range address": 5,
    "warp misaligned address": 6,
    "warp invalid address space": 7,
    "warp invalid pc": 8,
    "warp hardware stack overflow": 9,
    "device illegal address": 10,
    "lane misaligned address": 11,
    "warp assert": 12,
    "lane syscall error": 13,
    "warp illegal address": 14,
    "invalid managed memory access": 15,
}

# A GPU core dump is an ELF file with OS/ABI ELFOSABI_CUDA and machine EM_CUDA
# (cudacoredump.h in the CUDA toolkit's extras/Debugger/include): ELF64, little-endian,
# type ET_CORE, a 64-byte header (what `readelf -h` shows of one).
ELF_MAGIC = b"\x7fELF"
ELFOSABI_CUDA = 0x33
ELFOSABI_CUDA_V2 = 0x29  # LLVM's ELF.h names both
EM_CUDA = 0xBE
ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ET_CORE, ELF64_EHSIZE = 2, 1, 1, 4, 64
GZIP_MAGIC = b"\x1f\x8b"
# What the module asks cuda-gdb after loading the dump; see cuda_gdb_command.
CUDA_GDB_COMMANDS = ("bt", "x/i $errorpc", "x/i $pc")
DEFAULT_CUDA_GDB_DIRS = ("/usr/local/cuda/bin",)
CATALOGUE_FILE = "catalogue/known_issues.yml"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # gdb's styling, in an output saved from a terminal
_OPENING = re.compile(r"^Opening GPU coredump:\s*(?P<file>.+?)\s*$", re.M)
_EXCEPTION = re.compile(r"^CUDA Exception:\s*(?P<name>\S.*?)\s*$", re.M)
_SIGNAL = re.compile(r"received signal (?P<code>CUDA_EXCEPTION_(?P<num>\d+)),\s*(?P<name>[^.\n]+?)\.?\s*$", re.M)
_TRIGGER = re.compile(r"^The exception was triggered at PC\s+(?P<pc>0x[0-9a-fA-F]+)(?:[ \t]+(?P<rest>\S.*?))?[ \t]*$",
                      re.M)
_FOCUS = re.compile(
    r"\[(?:Current focus set to|Switching focus to)\s+CUDA\s+kernel\s+(?P<kernel>\d+),\s*grid\s+(?P<grid>-?\d+),"
    r"\s*block\s+(?P<block>\([\d,\s]+\)),\s*thread\s+(?P<thread>\([\d,\s]+\)),\s*device\s+(?P<device>\d+),"
    r"\s*sm\s+(?P<sm>\d+),\s*warp\s+(?P<warp>\d+),\s*lane\s+(?P<lane>\d+)\]")
_FRAME = re.compile(r"^#(?P<level>\d+)\s+(?:(?P<pc>0x[0-9a-fA-F]+)\s+in\s+)?(?P<rest>.*)$")
_LAUNCH = re.compile(r"^(?P<name>.*?)<<<(?P<grid>\([^)]*\)),\s*(?P<block>\([^)]*\))>>>\s*(?P<tail>.*)$")
_LOCATION = re.compile(r"\s+at\s+(?P<file>\S+):(?P<line>\d+)\s*$")
# x/i and disas lines; the symbol may hold templates (<...>), so the offset is the last "+N>:".
# A kernel without symbols prints the address alone: "=> 0x7fffd2a41c30:\tLDG.E.128 ...".
_INSN = re.compile(r"^\s*(?P<mark>\*=>|\*>|=>)?\s*(?P<address>0x[0-9a-fA-F]+)(?:\s+<(?P<symbol>.*)\+(?P<offset>\d+)>)?:"
                   r"\s*(?P<text>(?!0x)\S.*?)?\s*$")
# "p $errorpc" / "p $pc": "$1 = (void (*)(void)) 0x7f31abb9f6d0 <_Z...Pii+208>", or the address alone.
_PRINT = re.compile(r"^\$\d+\s*=\s*(?:\(.*\)\s*)?(?P<address>0x[0-9a-fA-F]+)(?:\s+<(?P<symbol>.*)\+(?P<offset>\d+)>)?\s*$")
# The command a live session echoes before a print: "(cuda-gdb) p $errorpc", "print/x $pc".
_PRINT_COMMAND = re.compile(r"^\(cuda-gdb\)\s+p(?:rint)?(?:/\w+)?\s+\$(?P<register>errorpc|pc)\s*$")
# "info cuda kernels": a header, then one row per kernel, the focused one starred:
#   "*      0      -   0    1 Active 0x00ffffff (148,1,1) (384,1,1) kernel(args...)"
#   (the manual's newer tables end in "Name Args": "... (384,1,1) kernel parms=...")
_KERNELS_HEADER = re.compile(r"^\s*Kernel\s+Parent\s+Dev\s+Grid\s+Status\s+SMs\s+Mask\s+GridDim\s+BlockDim\s+"
                             r"(?:Invocation|Name\s+Args)\s*$")
_KERNELS_ROW = re.compile(r"^\s*(?P<focus>\*)?\s*(?P<kernel>\d+)\s+\S+\s+\d+\s+-?\d+\s+\w+\s+0x[0-9a-fA-F]+\s+"
                          r"(?P<grid>\([\d,\s]+\))\s+(?P<block>\([\d,\s]+\))\s+(?P<invocation>\S.*?)\s*$")


class CoreDumpParseError(ValueError):
    """The input is not (complete) cuda-gdb output for a GPU core dump; the message says
    what was missing and what was expected."""


class CoreDumpFormatError(ValueError):
    """A file is neither a GPU core dump nor a saved cuda-gdb output."""


def normalise_exception(name: str) -> str:
    return " ".join(name.replace("-", " ").lower().split())


def exception_code(name: str) -> str | None:
    """'Warp Out-of-range Address' -> 'CUDA_EXCEPTION_5'; None for a name not in the table."""
    number = EXCEPTION_CODES.get(normalise_exception(name))
    return None if number is None else f"CUDA_EXCEPTION_{number}"


# --- reading the input -----------------------------------------------------------------

def _as_text(data: str | bytes) -> str:
    """Text of a saved output; bytes that are not text raise CoreDumpParseError."""
    if isinstance(data, str):
        text = data
    else:
        if data.startswith(GZIP_MAGIC):
            raise CoreDumpParseError("garbled input: gzip-compressed data, not cuda-gdb output; "
                                     "decompress it first (gunzip)")
        text = data.decode("utf-8", errors="replace")
    text = _ANSI.sub("", text)
    sample = text[:65536]
    bad = sum(1 for ch in sample if ch == "\ufffd" or (ord(ch) < 32 and ch not in "\t\n\r\f\v"))
    if sample and bad > max(2, len(sample) // 100):
        raise CoreDumpParseError(
            f"garbled input: {bad} of the first {len(sample)} characters are not printable text, so this is "
            "not cuda-gdb output; expected the text cuda-gdb prints after 'target cudacore FILE' (a GPU core "
            "dump itself needs format cudacore and cuda-gdb)")
    return text.replace("\r\n", "\n")


def _excerpt(text: str, lines: int = 4, width: int = 160) -> str:
    shown = [line.strip()[:width] for line in text.splitlines() if line.strip()][:lines]
    return " | ".join(shown) if shown else "(nothing)"


def _logical_lines(text: str) -> list[str]:
    """Lines with gdb's wrapped frame continuations ('    at file.cu:12', wrapped
    arguments) joined onto their frame line."""
    out: list[str] = []
    in_frame = False
    for line in text.split("\n"):
        if in_frame and line[:1] in (" ", "\t") and line.strip() and not _INSN.match(line) \
                and not _KERNELS_HEADER.match(line):
            out[-1] = out[-1].rstrip() + " " + line.strip()
            continue
        out.append(line)
        in_frame = bool(_FRAME.match(line))
    return out


def _parse_frame(match: re.Match) -> dict:
    rest = match.group("rest").strip()
    frame: dict[str, Any] = {"level": int(match.group("level")), "pc": match.group("pc"), "function": None,
                             "launch": None, "args": None, "file": None, "line": None, "text": match.group(0).strip()}
    location = _LOCATION.search(rest)
    if location:
        frame["file"], frame["line"] = location.group("file"), int(location.group("line"))
        rest = rest[:location.start()].rstrip()
    launch = _LAUNCH.match(rest)
    if launch:
        frame["function"] = launch.group("name").strip()
        frame["launch"] = {"grid": launch.group("grid"), "block": launch.group("block")}
        frame["args"] = launch.group("tail").strip() or None
    else:
        name, sep, args = rest.partition(" (")
        frame["function"] = name.strip() or None
        frame["args"] = ("(" + args).strip() if sep else None
    return frame


def _frames(lines: list[str]) -> list[dict]:
    """The backtrace. cuda-gdb prints frame #0 when it loads the dump and bt prints the
    whole stack again: of the runs of frames (each starting at #0), the last one that
    reaches a kernel launch frame, else the last one."""
    runs: list[list[dict]] = []
    for line in lines:
        match = _FRAME.match(line)
        if not match:
            continue
        frame = _parse_frame(match)
        if frame["level"] == 0 or not runs:
            runs.append([])
        runs[-1].append(frame)
    with_kernel = [run for run in runs if any(f["launch"] for f in run)]
    return (with_kernel or runs or [[]])[-1]


def _instructions(lines: list[str]) -> list[dict]:
    """x/i lines, and printed PCs (``$N = ... 0x...``) as instructions without text; a print
    echoed after '(cuda-gdb) p $errorpc' is marked as the exception PC."""
    out = []
    register = None
    for line in lines:
        command = _PRINT_COMMAND.match(line.strip())
        match = _INSN.match(line) or _PRINT.match(line.strip())
        if match:
            printed = match.re is _PRINT
            mark = ("*>" if register == "errorpc" else None) if printed else match.group("mark")
            offset = match.group("offset")
            out.append({"mark": mark, "address": match.group("address"),
                        "symbol": (match.group("symbol") or "").strip() or None,
                        "offset": int(offset) if offset is not None else None,
                        "text": None if printed else (match.group("text") or None), "line": line.strip(),
                        "printed": printed})
        register = command.group("register") if command else None
    return out


def _same_address(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and int(a, 16) == int(b, 16)


def _faulting_instruction(insns: list[dict], error_pc: str | None) -> tuple[dict | None, str | None]:
    """The instruction at the exception PC, merged from every line that names its address
    (x/i gives the text, a print may give the symbol), and where it came from."""
    found, source = None, None
    for insn in insns:
        if insn["mark"] in ("*>", "*=>"):
            found, source = insn, "errorpc"
            break
    if found is None:
        for insn in insns:
            if _same_address(insn["address"], error_pc):
                found, source = insn, "errorpc"
                break
    if found is None:
        for insn in insns:
            if insn["mark"] == "=>":
                found, source = insn, "pc"
                break
    if found is None:
        return None, None
    merged = dict(found)
    for other in insns:
        if _same_address(other["address"], found["address"]):
            for key in ("text", "symbol", "offset"):
                if merged[key] is None and other[key] is not None:
                    merged[key] = other[key]
    if merged["offset"] is None:
        # No symbol on this address: the kernel's start from another address of it that has one.
        starts = {(i["symbol"], int(i["address"], 16) - i["offset"]) for i in insns if i["offset"] is not None}
        if len(starts) == 1:
            (symbol, start), = starts
            if int(merged["address"], 16) >= start:
                merged["symbol"], merged["offset"] = symbol, int(merged["address"], 16) - start
    return merged, source


def _cuda_kernels(lines: list[str]) -> dict | None:
    """The focused (else the only) row of 'info cuda kernels': name, grid, block."""
    rows, in_table = [], False
    for line in lines:
        if _KERNELS_HEADER.match(line):
            in_table = True
            continue
        row = _KERNELS_ROW.match(line) if in_table else None
        if row:
            rows.append(row)
        elif in_table and line.strip():
            in_table = False
    chosen = next((r for r in rows if r.group("focus")), rows[0] if len(rows) == 1 else None)
    if chosen is None:
        return None
    invocation = chosen.group("invocation")
    if "(" in invocation:
        frame = _parse_frame(_FRAME.match(f"#0  {invocation}"))
        function, args = frame["function"], frame["args"]
    else:
        function, _, args = invocation.partition(" ")
    return {"function": function, "args": args.strip() or None if args else None,
            "launch": {"grid": re.sub(r"\s+", "", chosen.group("grid")),
                       "block": re.sub(r"\s+", "", chosen.group("block"))}}


def _base_name(kernel: str) -> str:
    """'void ns::k<int>(int, float)' -> 'ns::k<int>': the name without return type and
    parameter list, for patterns written against the bare name."""
    name = kernel.strip()
    if name.startswith("void "):
        name = name[len("void "):]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth <= 0 and i > 0:
            return name[:i].strip()
    return name


def parse_cuda_gdb(data: str | bytes) -> dict:
    """What cuda-gdb printed for a GPU core dump, as a dict:

    exception, exception_code, kernel, kernel_base, launch {grid, block}, pc (the exception
    PC), frame_pc, instruction, instruction_address, instruction_symbol, instruction_offset,
    instruction_source (errorpc | pc | null), focus {kernel, grid, block, thread, device,
    sm, warp, lane}, device, sm, warp, lane, frames (innermost first), core_file (as cuda-gdb
    opened it), exception_function and source_location (from the exception PC line), notes
    (what the output lacked that triage can do without).

    Raises CoreDumpParseError for input that is empty, not text, truncated, or not the
    output of ``target cudacore``; the message says what was missing and what was expected.
    """
    text = _as_text(data)
    if not text.strip():
        raise CoreDumpParseError("empty input: expected what cuda-gdb prints after 'target cudacore FILE' "
                                 "(a 'CUDA Exception: ...' line and a backtrace)")
    cut = "" if text.endswith("\n") else " (the output ends mid-line: truncated?)"
    notes: list[str] = []
    if cut:
        notes.append("the output ends mid-line: it may be truncated")
    opening = _OPENING.search(text)
    exception, code = _exception(text, opening, cut, notes)
    lines = _logical_lines(text)
    frames, kernel_frame = _kernel_frames(lines, exception, cut)

    trigger = _TRIGGER.search(text)
    error_pc = trigger.group("pc") if trigger else None
    insn, source = _faulting_instruction(_instructions(lines), error_pc)
    if error_pc is None and insn is not None and source == "errorpc":
        error_pc = insn["address"]
    notes += _instruction_notes(error_pc, insn, source)
    trigger_rest = trigger.group("rest") if trigger else None
    location = trigger_rest[1:-1] if trigger_rest and re.fullmatch(r"\(\S+:\d+\)", trigger_rest) else None
    focus = _focus(text)
    kernel = kernel_frame["function"]
    return {
        "exception": exception,
        "exception_code": code,
        "kernel": kernel,
        "kernel_base": _base_name(kernel),
        "launch": kernel_frame["launch"],
        "pc": error_pc or frames[0]["pc"],
        "frame_pc": frames[0]["pc"],
        "instruction": insn["text"] if insn else None,
        "instruction_address": insn["address"] if insn else None,
        "instruction_symbol": insn["symbol"] if insn else None,
        "instruction_offset": insn["offset"] if insn else None,
        "instruction_source": source,
        "focus": focus,
        **{key: focus[key] if focus else None for key in ("device", "sm", "warp", "lane")},
        "frames": frames,
        "core_file": opening.group("file") if opening else None,
        "exception_function": None if location else trigger_rest,
        "source_location": location,
        "notes": notes,
    }


def _exception(text: str, opening, cut: str, notes: list) -> tuple[str, str | None]:
    """The exception's name and code; no exception line is an error that says what was seen."""
    exception_match = _EXCEPTION.search(text)
    signal = _SIGNAL.search(text)
    if exception_match:
        exception = exception_match.group("name")
    elif signal:
        exception = signal.group("name").strip()
    elif opening:
        raise CoreDumpParseError(
            f"truncated output: cuda-gdb opened the GPU core dump ({opening.group('file')}) but no "
            f"'CUDA Exception: <name>' line follows{cut}; expected the exception, its PC and a backtrace. "
            "A dump taken without an exception (user-triggered) has nothing to triage.")
    else:
        raise CoreDumpParseError(
            "no CUDA exception found: expected a line 'CUDA Exception: <name>' (what cuda-gdb prints after "
            "'target cudacore FILE') or 'received signal CUDA_EXCEPTION_<n>, <name>.'; the input starts with: "
            f"{_excerpt(text)}{cut}")
    code = signal.group("code") if signal else exception_code(exception)
    if code is None:
        notes.append(f"exception {exception!r} is not in cuda-gdb's exception table: no code")
    return exception, code


def _kernel_frames(lines: list, exception: str, cut: str) -> tuple[list, dict]:
    """The backtrace (innermost first) and its kernel launch frame; 'info cuda kernels' names
    the kernel where no frame shows <<<...>>>."""
    frames = _frames(lines)
    table = _cuda_kernels(lines)
    if table and not any(f["launch"] for f in frames):
        frames = [dict(frames[0], function=table["function"], launch=table["launch"],
                       args=frames[0]["args"] or table["args"])] + frames[1:] if frames else \
            [{"level": 0, "pc": None, "file": None, "line": None, "text": "info cuda kernels", **table}]
    if not frames:
        raise CoreDumpParseError(
            f"truncated output: found the exception ({exception}) but no backtrace frame{cut}; expected "
            "'#0  0x... in KERNEL<<<(grid),(block)>>> (...)' as printed on load and by bt")
    kernel_frame = next((f for f in frames if f["launch"]), None)
    if kernel_frame is None:
        shown = "; ".join(f["text"][:160] for f in frames[:3])
        if cut:
            raise CoreDumpParseError(
                f"truncated output: it ends mid-line inside the backtrace ({shown}); found the exception "
                f"({exception}) but no complete kernel frame; expected '#0  0x... in KERNEL<<<(grid),(block)>>> "
                "(...)' as printed on load and by bt")
        raise CoreDumpParseError(
            f"no kernel launch frame: found the exception ({exception}) and frames ({shown}) but none with "
            "'KERNEL<<<(grid),(block)>>>'; expected the kernel's frame in the backtrace (bt)")
    return frames, kernel_frame


def _instruction_notes(error_pc: str | None, insn: dict | None, source: str | None) -> list[str]:
    """What the output lacked about the faulting instruction, and what to run for it."""
    notes = []
    if error_pc is None:
        notes.append("no exception PC in the output ('The exception was triggered at PC ...'): pc is the "
                     "frame's PC, which for a warp error may be past the faulting instruction")
    if insn is None:
        notes.append("no faulting instruction in the output: run 'x/i $errorpc' after 'target cudacore FILE' "
                     "(cuda-gdb needs cuobjdump on PATH to disassemble)")
    elif insn["offset"] is None:
        notes.append("the faulting instruction's line has no <symbol+offset> and no other address of the kernel "
                     "has one: its offset within the kernel is unknown")
    elif insn["text"] is None:
        notes.append("the exception PC was printed but not disassembled: run 'x/i $errorpc' for the instruction")
    elif source == "pc":
        notes.append("the instruction is the one at the warp's PC ('=>'), not the exception PC ('*>'): "
                     "the warp may have moved past the faulting instruction")
    return notes


def _focus(text: str) -> dict | None:
    """The focus cuda-gdb reported (kernel, grid, block, thread, device, sm, warp, lane)."""
    match = _FOCUS.search(text)
    if not match:
        return None
    return {key: (int(value) if key not in ("block", "thread") else re.sub(r"\s+", "", value))
            for key, value in match.groupdict().items()}


# --- matching the catalogue ------------------------------------------------------------

def _entry_view(entry, pattern: str, name: str) -> dict:
    return {"id": entry.id, "title": entry.title, "severity": entry.severity, "symptom": entry.symptom,
            "evidence": list(entry.evidence), "fix": entry.fix, "pattern": pattern, "matched_name": name}


def _where(parsed: dict) -> str:
    if parsed.get("instruction_offset") is not None:
        insn = f": {parsed['instruction']}" if parsed.get("instruction") else ""
        return f" at +{parsed['instruction_offset']}{insn}"
    return f" at PC {parsed['pc']}" if parsed.get("pc") else ""


def triage(parsed: dict, entries: list) -> dict:
    """``parsed`` plus the catalogue entry whose kernel_patterns match the kernel.

    Tries the kernel name as printed, its bare name and the symbol of the faulting
    instruction (which may be mangled), in that order. Adds ``matched`` (id, title,
    severity, symptom, evidence, fix, pattern, matched_name) or ``matched: None``, and a
    readable ``message``.
    """
    candidates = []
    for name in (parsed.get("kernel"), parsed.get("kernel_base"), parsed.get("instruction_symbol"),
                 parsed.get("exception_function")):
        if name and name not in candidates:
            candidates.append(name)
    matched = None
    for name in candidates:
        found = match_kernel(entries, name)
        if found:
            matched = _entry_view(*found, name)
            break
    code = f" ({parsed['exception_code']})" if parsed.get("exception_code") else ""
    fault = f"{parsed['exception']}{code}{_where(parsed)}"
    if matched:
        message = (f"{parsed['exception']}{code} in kernel {parsed['kernel']}{_where(parsed)}: known issue {matched['id']} ({matched['severity']}): "
                   f"{matched['title']}. Fix: {matched['fix']}")
    else:
        message = (f"unknown kernel {parsed['kernel']}: no catalogue entry matches; add kernel_patterns to "
                   f"{CATALOGUE_FILE} ({fault})")
    return {**parsed, "matched": matched, "message": message}


# --- files and cuda-gdb ----------------------------------------------------------------

def detect_format(head: bytes) -> str:
    """'cudacore' or 'cuda_gdb_output' from a file's first bytes (64 are enough).

    Raises CoreDumpFormatError for an ELF file that is not a GPU core dump (a CPU core),
    a gzip-compressed file, and other binary data.
    """
    if head.startswith(ELF_MAGIC):
        osabi = head[7] if len(head) > 7 else None
        machine = int.from_bytes(head[18:20], "little" if head[5:6] != b"\x02" else "big") if len(head) >= 20 else None
        if osabi == ELFOSABI_CUDA or machine == EM_CUDA:
            return "cudacore"
        raise CoreDumpFormatError(
            f"an ELF file, but not a GPU core dump (OS/ABI {osabi if osabi is None else hex(osabi)}, machine "
            f"{machine if machine is None else hex(machine)}; a GPU core dump has OS/ABI 0x33 and machine 0xbe): "
            "a CPU core dump or a program? GPU core dumps are the files CUDA_COREDUMP_FILE names")
    if head.startswith(GZIP_MAGIC):
        raise CoreDumpFormatError("gzip-compressed (CUDA_COREDUMP_GENERATION_FLAGS gzip_compress?): "
                                  "decompress it first (gunzip), then triage the dump")
    try:
        _as_text(head)
    except CoreDumpParseError:
        raise CoreDumpFormatError(
            "neither a GPU core dump (an ELF file with OS/ABI 0x33) nor a saved cuda-gdb output (text): "
            "the file is binary data of another kind, or garbled") from None
    return "cuda_gdb_output"


def core_header_problem(head: bytes) -> str | None:
    """Why the file whose first 64 bytes are head is not a GPU core dump, or None. Checked
    before cuda-gdb sees it: a file the serving user wrote is not parsed by a debugger on the
    controller unless it has the header a dump has."""
    if len(head) < ELF64_EHSIZE:
        return f"{len(head)} bytes, shorter than the 64-byte ELF64 header a GPU core dump begins with"
    if not head.startswith(ELF_MAGIC):
        return "not an ELF file (a GPU core dump begins with \\x7fELF)"
    e_type, e_machine, e_version = struct.unpack_from("<HHI", head, 16)
    (e_ehsize,) = struct.unpack_from("<H", head, 52)
    wrong = [f"{name} {got:#x} (a dump has {want:#x})" for name, got, want in (
        ("class", head[4], ELFCLASS64), ("data encoding", head[5], ELFDATA2LSB), ("ident version", head[6], EV_CURRENT),
        ("type", e_type, ET_CORE), ("machine", e_machine, EM_CUDA), ("version", e_version, EV_CURRENT),
        ("header size", e_ehsize, ELF64_EHSIZE)) if got != want]
    if head[7] not in (ELFOSABI_CUDA, ELFOSABI_CUDA_V2):
        wrong.insert(0, f"OS/ABI {head[7]:#x} (a dump has {ELFOSABI_CUDA:#x})")
    return "an ELF file, but not a GPU core dump: " + ", ".join(wrong) if wrong else None


# cuda-gdb parses a file the serving user wrote, on the controller (the host that holds root
# SSH to the fleet): it runs with a private environment (nothing of the controller's: no SSH
# agent, no vault or cloud credentials), a private working directory, limits on CPU time,
# memory and file size, no core file, in its own process group, and as the dump file's owner
# when the module runs as root. A network namespace needs root or unprivileged user
# namespaces, which not every controller has: not used.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_MEMORY = 4 << 30  # for cuda-gdb itself, beside twice the dump it maps
SANDBOX_OUTPUT = 16 << 20  # a triage prints a few KiB
SANDBOX_OPEN_FILES = 256


def sandbox_env(cuda_gdb: str, home: str) -> dict:
    return {"PATH": f"{os.path.dirname(cuda_gdb)}{os.pathsep}{SANDBOX_PATH}", "HOME": home, "TMPDIR": home,
            "LC_ALL": "C", "LANG": "C"}


def sandbox_limits(cpu_seconds: int, dump_bytes: int) -> list:
    """(resource, limit) pairs: CPU seconds, address space, the size of any file written,
    no core file, open files."""
    return [(resource.RLIMIT_CPU, max(1, int(cpu_seconds))), (resource.RLIMIT_AS, SANDBOX_MEMORY + 2 * dump_bytes),
            (resource.RLIMIT_FSIZE, SANDBOX_OUTPUT), (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, SANDBOX_OPEN_FILES)]


def _enter_sandbox(limits: list, owner: tuple[int, int] | None):
    def enter():  # in the child, before exec
        os.umask(0o077)
        for which, value in limits:
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        if owner is not None:
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
    return enter


def run_sandboxed(argv: list[str], dump_path: str, timeout: int) -> tuple[int, bytes]:
    """Run cuda-gdb (argv) on dump_path in the sandbox above; (exit status, output, at most
    SANDBOX_OUTPUT bytes: stdout and stderr together). Raises subprocess.TimeoutExpired
    after timeout seconds (the whole process group killed) and OSError when it cannot start."""
    st = os.stat(dump_path)
    owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 and st.st_uid != 0 else None
    with tempfile.TemporaryDirectory(prefix="coredump-triage-") as home:
        if owner is not None:
            os.chown(home, *owner)
        out_path = os.path.join(home, "cuda-gdb.out")
        with open(out_path, "wb") as out:
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=home, env=sandbox_env(argv[0], home), close_fds=True,
                                    start_new_session=True,
                                    preexec_fn=_enter_sandbox(sandbox_limits(timeout, st.st_size), owner))
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # what it left running
                except ProcessLookupError:
                    pass
        with open(out_path, "rb") as out:
            return rc, out.read(SANDBOX_OUTPUT)


def find_cuda_gdb(explicit: str | None = None, path: str | None = None,
                  extra_dirs: tuple[str, ...] = DEFAULT_CUDA_GDB_DIRS) -> str | None:
    """The cuda-gdb to run: ``explicit`` if given (None when it is not an executable
    file), else the one on ``path`` (default $PATH), else one in ``extra_dirs``."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    found = shutil.which("cuda-gdb", path=path)
    if found:
        return found
    for directory in extra_dirs:
        candidate = os.path.join(directory, "cuda-gdb")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def cuda_gdb_command(cuda_gdb: str, core_file: str) -> list[str]:
    """Load the dump, print the backtrace, then the instruction at the exception PC ($errorpc,
    marked '*>') and at the warp's PC ('=>'). -nx: no ~/.cuda-gdbinit; -batch: exit after
    the commands (quiet, no banner). A command that fails (no cuobjdump to disassemble) does
    not stop the ones after it."""
    argv = [cuda_gdb, "-nx", "-batch", "-ex", f"target cudacore {core_file}"]
    for command in CUDA_GDB_COMMANDS:
        argv += ["-ex", command]
    return argv
