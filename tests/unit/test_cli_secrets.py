"""A secret given to the CLI (issue 14, item 5): through -e inline, -e @file, a vault-encrypted
-e @file and a file with an inline !vault value (with --vault-password-file / --vault-id), it
reaches the play, and it is in no file of the artifacts tree afterwards (ansible-runner's
env/extravars is removed). A real ansible-runner run against localhost."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vllm_fleet.cli import Plan, build_parser
from vllm_fleet.extravars import is_vaulted, parse_extra_vars, vault_files
from vllm_fleet.runner import RunRequest, run, scrub_extravars

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KEYS = {"inline": "inlineKEY0123456789abcdef", "file": "fileKEY0123456789abcdef",
        "vaultfile": "vaultfileKEY0123456789abcdef", "inlinevault": "inlinevaultKEY0123456789ab"}
PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - name: Use every key without showing it
      ansible.builtin.assert:
        that: [k_inline | length > 16, k_file | length > 16, k_vaultfile | length > 16, k_inlinevault | length > 16]
        quiet: true
      no_log: true
    - name: Prove the vaulted values were decrypted (a digest, not the value)
      ansible.builtin.debug:
        msg: "{{ (k_vaultfile ~ k_inlinevault) | hash('sha256') }}"
"""


def vault(tmp_path: Path, password_file: Path, *args: str) -> str:
    proc = subprocess.run([str(BIN / "ansible-vault"), *args, "--vault-password-file", str(password_file)],
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    return proc.stdout


def test_a_key_given_through_every_cli_path_is_in_no_artifact(tmp_path):
    password = tmp_path / "vault-pass"
    password.write_text("correct horse battery staple\n")
    plain = tmp_path / "plain.yml"
    plain.write_text(f"k_file: {KEYS['file']}\n")
    encrypted = tmp_path / "encrypted.yml"
    encrypted.write_text(f"k_vaultfile: {KEYS['vaultfile']}\n")
    vault(tmp_path, password, "encrypt", str(encrypted))
    inline = tmp_path / "inline-vault.yml"
    inline.write_text(vault(tmp_path, password, "encrypt_string", KEYS["inlinevault"], "--name", "k_inlinevault"))
    assert is_vaulted(encrypted) and is_vaulted(inline) and not is_vaulted(plain)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text(f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                                        f"      ansible_python_interpreter: {sys.executable}\n")

    args = build_parser().parse_args(["preflight", "-e", f"k_inline={KEYS['inline']}", "-e", f"@{plain}",
                                      "-e", f"@{encrypted}", "-e", f"@{inline}",
                                      "--vault-password-file", str(password)])
    extravars = parse_extra_vars(args.extra_vars, project_dir=ROOT, cwd=tmp_path)
    assert extravars == {"k_inline": KEYS["inline"], "k_file": KEYS["file"]}
    assert vault_files(args.extra_vars, cwd=tmp_path) == [encrypted.resolve(), inline.resolve()]
    artifacts = tmp_path / "run"
    result = run(RunRequest(project_dir=ROOT, playbook=tmp_path / "play.yml", inventories=[tmp_path / "hosts.yml"],
                            private_data_dir=artifacts, ident="secrets", extravars=extravars,
                            vault_files=vault_files(args.extra_vars, cwd=tmp_path),
                            vault_password_files=[password]), on_event=lambda event: None)
    stdout = (result.artifact_dir / "stdout").read_text()
    assert result.rc == 0, stdout[-3000:]
    import hashlib
    assert hashlib.sha256((KEYS["vaultfile"] + KEYS["inlinevault"]).encode()).hexdigest() in stdout
    assert not (artifacts / "env" / "extravars").exists()
    files = [p for p in artifacts.rglob("*") if p.is_file()]
    assert len(files) > 5  # job events, stdout, command, status
    for path in files:
        text = path.read_bytes()
        for name, key in KEYS.items():
            assert key.encode() not in text, f"{name} key in {path.relative_to(artifacts)}"


def test_scrub_removes_what_ansible_runner_wrote(tmp_path):  # and the negative control: it was there
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "extravars").write_text('{"k": "secret"}')
    (tmp_path / "env" / "envvars").write_text("{}")
    scrub_extravars(tmp_path)
    assert not (tmp_path / "env" / "extravars").exists() and (tmp_path / "env" / "envvars").exists()


def test_vault_options_are_parsed():
    args = build_parser().parse_args(["preflight", "--vault-id", "prod@prompt", "--vault-id", "dev@/x"])
    assert args.vault_id == ["prod@prompt", "dev@/x"] and Plan is not None


def test_without_the_scrub_the_key_would_stay_in_the_artifacts(tmp_path, monkeypatch):  # negative control
    import vllm_fleet.runner as runner
    monkeypatch.setattr(runner, "scrub_extravars", lambda private_data_dir: None)
    (tmp_path / "play.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks: []\n")
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    result = runner.run(RunRequest(project_dir=ROOT, playbook=tmp_path / "play.yml",
                                   inventories=[tmp_path / "hosts.yml"], private_data_dir=tmp_path / "run",
                                   ident="leak", extravars={"k_inline": KEYS["inline"]}), on_event=lambda e: None)
    assert result.rc == 0
    assert KEYS["inline"] in (tmp_path / "run" / "env" / "extravars").read_text()
