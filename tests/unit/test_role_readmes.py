"""Every role has a README, and one with a generated variables section (scripts/role_readme.py)
names every entry point and variable its meta/argument_specs.yml declares."""
from pathlib import Path

import pytest

from scripts.role_readme import BEGIN, END, ReadmeError, load_specs, missing, render, section

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
SPECS = {
    "main": {"short_description": "Do C(it) | O(x)", "options": {
        "vf_one": {"type": "int", "default": 3, "description": ["First. Second sentence."]},
        "vf_two": {"type": "list", "elements": "str", "required": True, "description": "V(a) or V(b)."},
    }},
    "extra": {"short_description": "Nothing to set"},
}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_role_has_a_readme_that_covers_its_variables(role):
    readme = role / "README.md"
    assert readme.is_file(), f"{role.name} has no README.md (scripts/role_readme.py fills one's variables)"
    text = readme.read_text()
    if BEGIN in text:
        assert missing(text, load_specs(role)) == [], f"run scripts/role_readme.py {role.name}"
    else:
        # The hand-written READMEs point at the spec for their variables.
        assert f"ansible-doc -t role vllm_fleet.fleet.{role.name}" in text


def test_the_section_names_every_entry_point_and_variable_with_type_and_default():
    text = section(SPECS)
    assert missing(text, SPECS) == []
    assert "| `vf_one` | int | `3` | First. |" in text
    assert "| `vf_two` | list of str | required | `a` or `b`. |" in text
    assert "Do `it` \\| `x`" in text
    assert "### `extra`\n\nNothing to set\n\nNo variables of its own." in text


def test_a_variable_the_readme_does_not_name_is_reported():  # negative control
    text = section(SPECS)
    grown = {**SPECS, "main": {**SPECS["main"], "options": {**SPECS["main"]["options"], "vf_new": {}}}}
    assert missing(text, grown) == ["vf_new"]
    assert missing(text.replace("`vf_one`", "vf_one"), SPECS) == ["vf_one"]


def test_render_replaces_only_the_section_and_is_stable():
    readme = f"# role\n\nBy hand.\n\n{BEGIN}\nstale\n{END}\n\n## Testing\n\nBy hand too.\n"
    once = render(readme, SPECS)
    assert "stale" not in once and once.startswith("# role\n\nBy hand.\n\n") and once.endswith("By hand too.\n")
    assert render(once, SPECS) == once


def test_a_readme_without_the_markers_is_refused():
    with pytest.raises(ReadmeError, match="BEGIN argument_specs"):
        render("# role\n", SPECS)

