"""The strict YAML loader (plugins/module_utils/strict_yaml.py) and the filters that use it:
anchors, aliases, merge keys, duplicate keys and oversized files are refused, naming the file
and the line; plain YAML (every shipped catalogue, schema and profile) still loads."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_fleet.fleet.plugins.filter.catalogue import catalogue
from ansible_collections.vllm_fleet.fleet.plugins.filter.yaml_file import yaml_file
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.strict_yaml import (
    FastStrictLoader,
    StrictLoader,
    StrictYAMLError,
    load_file,
    loads,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "catalogue" / "known_issues.yml", ROOT / "catalogue" / "vllm_serve_args.yml",
           *sorted((ROOT / "profiles").glob("*.yml"))]
# 414 bytes of YAML that PyYAML's safe_load expands to 9**9 references.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("bcdefgh", "cdefghi"))
# loads() uses libyaml's parser where PyYAML has it, else the pure-Python one: both refuse the same.
LOADERS = [StrictLoader] + ([FastStrictLoader] if FastStrictLoader else [])


def test_libyaml_is_used_where_pyyaml_has_it():
    assert (FastStrictLoader is not None) == yaml.__with_libyaml__


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
def test_every_shipped_file_loads_as_safe_load_reads_it(path, loader):  # negative control
    assert loads(path.read_text(), loader=loader) == yaml.safe_load(path.read_text())
    assert load_file(str(path)) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
def test_an_alias_bomb_is_refused_at_once(loader):
    assert len(ALIAS_BOMB) < 600
    started = time.monotonic()
    with pytest.raises(StrictYAMLError, match=r"bomb\.yml is not YAML \(line 1, column 4\): an anchor \(&a\)"):
        loads(ALIAS_BOMB, source="bomb.yml", loader=loader)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("text, expected", [
    ("a: 1\nb: *x\n", "line 2"),  # an alias alone is an error either way
    ("a: &x 1\n", "an anchor (&x) is not allowed"),
    ("base: {a: 1}\nother:\n  <<: {a: 1}\n", "a merge key (<<) is not allowed"),
    ("id: one\nid: two\n", "(line 2, column 1): duplicate key 'id' (first at line 1)"),
    ("known_issues:\n  - {id: a, id: b}\n", "duplicate key 'id'"),
    ("a: [\n", "is not YAML (line 2"),
])
@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
def test_what_the_loader_refuses(text, expected, loader):
    with pytest.raises(StrictYAMLError) as info:
        loads(text, source="f.yml", loader=loader)
    assert expected in str(info.value) and str(info.value).startswith("f.yml is not YAML")


def test_a_file_over_the_limit_is_not_read(tmp_path):
    path = tmp_path / "big.yml"
    path.write_text("a: " + "x" * 2000 + "\n")
    with pytest.raises(StrictYAMLError, match=r"big\.yml is larger than 1000 bytes"):
        load_file(str(path), max_bytes=1000)
    assert load_file(str(path), max_bytes=4000) == {"a": "x" * 2000}  # negative control


def test_the_filters_name_the_variable(tmp_path):
    path = tmp_path / "dup.yml"
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(AnsibleFilterError, match=r"^vllm_fleet_catalogue_path: .*dup\.yml is not YAML .*duplicate key"):
        catalogue(str(path))
    with pytest.raises(AnsibleFilterError, match=r"^vllm_fleet_service_schema_path: .*duplicate key 'a'"):
        yaml_file(str(path), "vllm_fleet_service_schema_path")
    with pytest.raises(AnsibleFilterError, match=r"^vllm_fleet_catalogue_path: cannot read /nonexistent"):
        catalogue("/nonexistent/known_issues.yml")
