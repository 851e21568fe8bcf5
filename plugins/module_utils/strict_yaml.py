# SPDX-License-Identifier: Apache-2.0
"""One YAML loader for every file the collection reads on the controller (the known-issues
catalogue, the serve-args schema, the profiles) and for the CLI's ``-e @file``.

PyYAML's SafeLoader (with libyaml's parser where PyYAML has it) and these refusals, each naming
the file and the line:
- an anchor or an alias (``&a`` / ``*a``): a 414-byte alias bomb expands to hundreds of MB of
  module arguments, and none of these files needs one;
- a merge key (``<<``), and a duplicate key in a mapping (PyYAML keeps the last one silently);
- a file over ``max_bytes`` (read no further than that).
Plain Python (no ``ansible`` import): the filter plugin and the CLI are thin wrappers.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1024 * 1024


class StrictYAMLError(ValueError):
    """The file cannot be read, is not YAML, or uses what this loader refuses."""


class _Strict:
    """Refuses merge keys and duplicate keys as the mapping is built."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "a merge key (<<) is not allowed: write the keys out", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # SafeLoader's own error follows
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class StrictLoader(_Strict, yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """SafeLoader that refuses merge keys and duplicate keys (loads() refuses anchors first)."""


# libyaml's parser, where PyYAML was built with it (its wheels are): about 10x faster on the
# catalogue, which each node's preflight reads in every run. The checks are the same Python.
FastStrictLoader = (type("FastStrictLoader", (_Strict, yaml.CSafeLoader), {})
                    if getattr(yaml, "__with_libyaml__", False) else None)


def loads(text: str, *, source: str = "<text>", loader=None) -> Any:
    """Parse ``text``; raise StrictYAMLError naming ``source``, the line and column.
    ``loader``: StrictLoader or FastStrictLoader (the fast one where there is one)."""
    loader = loader or FastStrictLoader or StrictLoader
    try:
        # Anchors and aliases first, from the parser's events: an alias bomb is refused before
        # anything is built.
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                kind = "an alias" if isinstance(event, yaml.AliasEvent) else "an anchor"
                raise yaml.constructor.ConstructorError(
                    None, None, f"{kind} ({'*' if kind == 'an alias' else '&'}{event.anchor}) is not allowed: "
                    "write the value out", event.start_mark)
        return yaml.load(text, Loader=loader)  # nosec B506: both loaders are SafeLoaders
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise StrictYAMLError(f"{source} is not YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except ValueError as exc:  # int() past Python's digit limit: a number nobody means
        raise StrictYAMLError(f"{source} holds a number too long to read ({str(exc).split(':')[0]}): "
                              "no setting takes one") from None


def load_file(path: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse the file at ``path`` (at most ``max_bytes``)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise StrictYAMLError(f"cannot read {path}: {exc.strerror}") from None
    if len(raw) > max_bytes:
        raise StrictYAMLError(f"{path} is larger than {max_bytes} bytes: it is not read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictYAMLError(f"{path} is not YAML: not UTF-8 text (byte {exc.start})") from None
    return loads(text, source=path)
