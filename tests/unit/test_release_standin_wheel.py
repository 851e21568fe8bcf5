"""The stand-in vllm wheel that releases are built from in the tests."""
import ast
import sys
import zipfile

from tests.fixtures.wheels.build import (
    TORCH_VERSION,
    VLLM_SOURCE,
    build_vllm_wheel,
    dist_info_dir,
    vllm_cli_entry,
)

# Top-level imports of the stand-in that its Requires-Dist provides.
PROVIDED = {"vllm", "torch", "pynvml", "yaml"}


def test_wheel_carries_the_source_the_pins_and_the_console_script(tmp_path):
    wheel = build_vllm_wheel(tmp_path)
    info = dist_info_dir("vllm", "0.25.1")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"{info}/METADATA").decode()
        entry_points = whl.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in names else ""
    assert "vllm/__init__.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    sources = {p.relative_to(VLLM_SOURCE).as_posix() for p in VLLM_SOURCE.rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= names
    assert "Version: 0.25.1" in metadata
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert requires == [f"torch=={TORCH_VERSION}", "nvidia-ml-py", "pyyaml"]
    entry = vllm_cli_entry()
    if entry:  # the stand-in's CLI module, when its author has written one
        assert entry_points == f"[console_scripts]\nvllm = {entry}\n"


def test_wheel_is_byte_identical_for_the_same_source(tmp_path):
    first = build_vllm_wheel(tmp_path / "a").read_bytes()
    assert build_vllm_wheel(tmp_path / "b").read_bytes() == first


def test_every_import_of_the_stand_in_is_installed_with_it():
    """A release installs only the Requires-Dist: an import beyond them fails on the node."""
    stray = {}
    for path in VLLM_SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in PROVIDED and top not in sys.stdlib_module_names and top != "__future__":
                    stray.setdefault(top, []).append(str(path.relative_to(VLLM_SOURCE)))
    assert not stray, f"the stand-in imports what its wheel does not require: {stray}"
