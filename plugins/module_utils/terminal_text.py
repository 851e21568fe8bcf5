"""Text that reaches an operator's terminal, a journal or an XML file from somewhere else (a
lease another run wrote, a task's output, a file name a node chose): escape sequences and
control characters there can retitle a terminal (OSC), rewrite the screen (CSI), forge a
line (CR) or hide text (bidi overrides). Plain Python, no Ansible import: the CLI uses it too.
"""
from __future__ import annotations

import re

# Escape sequences (ECMA-48): CSI, OSC, DCS/SOS/PM/APC strings (ended by ST or BEL, else by
# the end of the line), and two-character escapes; in their 7-bit (ESC ...) and 8-bit (C1)
# spellings.
ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?")
# Every other character that is not text: C0 and C1 controls, DEL, the bidi embeddings,
# overrides and isolates, the Unicode line and paragraph separators, and lone surrogates
# (a file name that is not UTF-8: no encoder writes them).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def escaped(text: str, keep: str = "") -> str:
    """text with each control character (escape sequences included, one ESC at a time)
    written out as \\xNN or \\uNNNN, but those in keep: what was there stays visible, and
    nothing of it acts."""
    return CONTROL.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)


def for_terminal(text: str) -> str:
    """text as a terminal may show it: escape sequences removed (a tool's colours, or
    someone's title or hyperlink), CR and CRLF made newlines, every other control but
    newline and tab escaped."""
    text = ESCAPE_SEQUENCE.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return escaped(text, keep="\n\t")


def one_line(text: str) -> str:
    """text as one line of a terminal: escape sequences removed, every control but tab
    escaped (a newline too, so nothing can start a line of its own)."""
    return escaped(ESCAPE_SEQUENCE.sub("", text), keep="\t")


def control_problem(text: str) -> str | None:
    """Why text is not one line of printable text, or None."""
    bad = CONTROL.search(text)
    if bad is None:
        return None
    return "holds the control character %s at offset %d" % (_escape(bad), bad.start())
