"""examples/ci and execution-environment.yml: the files an operator copies, checked offline.

- The pipelines pass yamllint and validate against the published schemas (SchemaStore's
  GitHub workflow and GitLab CI schemas, as vendored in check-jsonschema, pinned in
  pyproject.toml: no network).
- Every `vllm-fleet ...` command in them parses with the CLI's own argparse parser, the
  paths they publish are the ones that command writes (--artifacts DIR: junit.xml,
  summary.json, rollout.html for a rollout), a rollout only runs by hand behind a
  protected environment, and no secret is interpolated into a script or echoed.
- `ansible-builder create` turns execution-environment.yml into a build context whose
  pins are pyproject.toml's and whose collections cover what the roles call.

Each check is a function that returns problems, so a negative control (a composed, broken
copy) shows the check would fail.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from vllm_fleet import cli
from vllm_fleet import report as html_report

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / "examples" / "ci" / "github-actions.yml"
GITLAB = ROOT / "examples" / "ci" / "gitlab-ci.yml"
EE = ROOT / "execution-environment.yml"
BIN = Path(sys.executable).parent

# yamllint's defaults with lines up to 120 (ansible-lint, which lints these too, allows 160).
YAMLLINT = YamlLintConfig("""
extends: default
rules:
  line-length: {max: 120}
""")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# ---------------------------------------------------------------- yamllint and schemas

def yamllint_problems(text: str) -> list[str]:
    return [f"{p.line}:{p.column} {p.rule}: {p.desc}" for p in linter.run(text, YAMLLINT) if p.level == "error"]


@pytest.mark.parametrize("path", [GITHUB, GITLAB, EE], ids=lambda p: p.name)
def test_passes_yamllint(path):
    assert yamllint_problems(path.read_text()) == []


def test_yamllint_negative_control():
    # composed: a duplicated key, which YAML loaders silently resolve to the last one
    broken = GITLAB.read_text().replace("stages:\n", "stages:\n  - preflight\nstages:\n", 1)
    assert any("key-duplicates" in p for p in yamllint_problems(broken))


SCHEMAS = {GITHUB: ["--builtin-schema", "vendor.github-workflows"],
           GITLAB: ["--builtin-schema", "vendor.gitlab-ci", "--data-transform", "gitlab-ci"]}


def schema_check(path: Path, kind: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "check-jsonschema"), *SCHEMAS[kind], str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("path", [GITHUB, GITLAB], ids=lambda p: p.name)
def test_validates_against_the_published_schema(path):
    result = schema_check(path, path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path, old, new", [
    (GITHUB, "    runs-on: [self-hosted, linux, vllm-fleet]\n", "    runs_on: [self-hosted]\n"),
    (GITLAB, "    when: always\n", "    when: allways\n"),
], ids=["github-runs_on", "gitlab-when-allways"])
def test_schema_negative_control(tmp_path, path, old, new):
    broken = tmp_path / path.name  # composed: one misspelt key or value
    broken.write_text(path.read_text().replace(old, new))
    result = schema_check(broken, path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "validation errors" in result.stdout


# ---------------------------------------------------------------- the commands

OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ">", ">>", "<"}


def shell_commands(script: str) -> list[list[str]]:
    """Each `vllm-fleet ...` simple command in a script: its words up to a shell operator."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = list(lexer)
        for i, word in enumerate(words):
            if word == "vllm-fleet" and (i == 0 or words[i - 1] in OPERATORS):
                end = next((j for j in range(i + 1, len(words)) if words[j] in OPERATORS), len(words))
                found.append(words[i + 1:end])
    return found


def github_jobs(doc: dict) -> dict[str, dict]:
    """job -> {"env", "scripts", "steps"}."""
    return {name: {"env": job.get("env", {}), "steps": job.get("steps", []),
                   "scripts": [s["run"] for s in job.get("steps", []) if "run" in s]}
            for name, job in doc["jobs"].items()}


def gitlab_job(doc: dict, name: str) -> dict:
    """A job with its `extends` merged in, as GitLab does: hashes deep-merged, the rest
    (lists included) replaced by the job's own."""
    def merge(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    job = doc[name]
    parents = job.get("extends", [])
    merged: dict = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = merge(merged, gitlab_job(doc, parent))
    return merge(merged, {k: v for k, v in job.items() if k != "extends"})


def flatten(items) -> list[str]:
    """GitLab flattens nested lists in scripts (a YAML alias of a list, inside a list)."""
    out = []
    for item in items or []:
        out += flatten(item) if isinstance(item, list) else [item]
    return out


def gitlab_jobs(doc: dict) -> dict[str, dict]:
    jobs = {}
    for name in doc:
        if name.startswith(".") or not isinstance(doc[name], dict) or name in ("workflow", "variables", "default"):
            continue
        job = gitlab_job(doc, name)
        if "script" in job:
            scripts = [line for key in ("before_script", "script", "after_script") for line in flatten(job.get(key))]
            jobs[name] = {"env": job.get("variables", {}), "scripts": scripts, "job": job}
    return jobs


def expand(word: str, env: dict) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: str(env.get(m.group(1), m.group(0))), word)


def parse(words: list[str]):
    try:
        return cli.build_parser().parse_args(words), None
    except cli.UsageError as exc:
        return None, str(exc)


def command_problems(jobs: dict[str, dict]) -> list[str]:
    problems = []
    for name, job in jobs.items():
        for script in job["scripts"]:
            for words in shell_commands(script):
                args, error = parse(words)
                if error:
                    problems.append(f"{name}: vllm-fleet {' '.join(words)}: {error}")
                elif args.command != "report" and args.artifacts is None:
                    problems.append(f"{name}: vllm-fleet {args.command} without --artifacts: CI would not "
                                    "know where its JUnit XML is")
    return problems


def runs(jobs: dict[str, dict]) -> list[tuple[str, object, dict]]:
    """(job, parsed args, job) for every vllm-fleet command that parses."""
    out = []
    for name, job in jobs.items():
        for script in job["scripts"]:
            for words in shell_commands(script):
                args, error = parse(words)
                if not error:
                    out.append((name, args, job))
    return out


@pytest.mark.parametrize("path, jobs_of", [(GITHUB, github_jobs), (GITLAB, gitlab_jobs)], ids=["github", "gitlab"])
def test_every_command_parses_with_the_real_cli(path, jobs_of):
    jobs = jobs_of(load(path))
    assert command_problems(jobs) == []
    seen = {(args.command, args.limit) for _, args, _ in runs(jobs)}
    # what issue 16 asks of both: preflight, and the rollout of the canary
    assert ("preflight", None) in seen
    assert ("rollout", "canary") in seen


@pytest.mark.parametrize("old, new, expected", [
    ("vllm-fleet rollout --limit canary", "vllm-fleet rollout --limt canary", "unrecognized arguments: --limt"),
    ("vllm-fleet preflight", "vllm-fleet prefligt", "invalid choice: 'prefligt'"),
    ("--artifacts reports/ci/preflight", "", "without --artifacts"),
], ids=["misspelt-flag", "misspelt-subcommand", "no-artifacts"])
def test_command_check_negative_control(old, new, expected):
    doc = load(GITLAB)
    text = GITLAB.read_text()
    assert old in text
    broken = yaml.safe_load(text.replace(old, new))  # composed
    assert doc != broken
    problems = command_problems(gitlab_jobs(broken))
    assert any(expected in p for p in problems), problems


def published(job_name: str, doc: dict, kind: str) -> tuple[set[str], set[str]]:
    """(uploaded paths, JUnit paths) of one job."""
    if kind == "github":
        uploads, junit = set(), set()
        for step in doc["jobs"][job_name]["steps"]:
            uses = step.get("uses", "")
            if uses.startswith("actions/upload-artifact@"):
                uploads |= {p.strip() for p in step["with"]["path"].splitlines() if p.strip()}
            if uses.startswith("mikepenz/action-junit-report@"):
                junit.add(step["with"]["report_paths"])
        return uploads, junit
    artifacts = gitlab_job(doc, job_name).get("artifacts", {})
    return set(artifacts.get("paths", [])), {artifacts.get("reports", {}).get("junit")}


def report_problems(doc: dict, kind: str) -> list[str]:
    """The files each run writes (cli.main: <artifacts>/junit.xml, summary.json, and
    rollout.html for the HTML_REPORT_COMMANDS) are the ones its job publishes."""
    problems = []
    jobs = github_jobs(doc) if kind == "github" else gitlab_jobs(doc)
    for name, args, job in runs(jobs):
        run_dir = expand(str(args.artifacts), job["env"])
        uploads, junit = published(name, doc, kind)
        wanted = [f"{run_dir}/junit.xml", f"{run_dir}/summary.json"]
        if args.command in cli.HTML_REPORT_COMMANDS:
            wanted.append(f"{run_dir}/{html_report.REPORT_FILE}")
        problems += [f"{name}: {path} is written but not uploaded" for path in wanted if path not in uploads]
        if junit != {f"{run_dir}/junit.xml"}:
            problems.append(f"{name}: JUnit published from {sorted(map(str, junit))}, written to {run_dir}/junit.xml")
    return problems


@pytest.mark.parametrize("path, kind", [(GITHUB, "github"), (GITLAB, "gitlab")], ids=["github", "gitlab"])
def test_published_reports_are_the_files_the_cli_writes(path, kind):
    assert report_problems(load(path), kind) == []


def test_report_check_negative_control():
    doc = load(GITLAB)  # composed: the canary job publishes a JUnit file the CLI never writes
    doc["canary"]["artifacts"]["reports"]["junit"] = "reports/ci/canary/report.xml"
    doc["canary"]["artifacts"]["paths"].remove("reports/ci/canary/rollout.html")
    problems = report_problems(doc, "gitlab")
    assert any("rollout.html is written but not uploaded" in p for p in problems)
    assert any("JUnit published from ['reports/ci/canary/report.xml']" in p for p in problems)


# ---------------------------------------------------------------- manual rollout, secrets

def github_dispatch_only(doc: dict, name: str) -> bool:
    """The job runs only from workflow_dispatch: its own `if` says so, or a job it needs
    does (a skipped need skips it, unless its `if` overrides that with always())."""
    job = doc["jobs"][name]
    condition = str(job.get("if", ""))
    if "workflow_dispatch" in condition:
        return True
    if "always()" in condition:
        return False
    needs = job.get("needs", [])
    return any(github_dispatch_only(doc, need) for need in ([needs] if isinstance(needs, str) else needs))


def gate_problems(doc: dict, kind: str) -> list[str]:
    """A job that runs a rollout starts only by hand, deploying to an environment (which
    the operator protects), one at a time, never cancelled halfway."""
    problems = []
    jobs = github_jobs(doc) if kind == "github" else gitlab_jobs(doc)
    for name in sorted({n for n, args, _ in runs(jobs) if args.command == "rollout"}):
        if kind == "github":
            job = doc["jobs"][name]
            manual = github_dispatch_only(doc, name)
            queued = job.get("concurrency", {}).get("cancel-in-progress") is False
        else:
            job = gitlab_job(doc, name)
            manual = any(rule.get("when") == "manual" for rule in job.get("rules", []))
            queued = "resource_group" in job and job.get("interruptible") is False
        if not manual:
            problems.append(f"{name}: a rollout that starts without a person")
        if not job.get("environment"):
            problems.append(f"{name}: a rollout with no (protected) environment")
        if not queued:
            problems.append(f"{name}: two rollouts could run at once, or one be cancelled halfway")
    return problems


@pytest.mark.parametrize("path, kind", [(GITHUB, "github"), (GITLAB, "gitlab")], ids=["github", "gitlab"])
def test_rollouts_are_manual_protected_and_serial(path, kind):
    assert gate_problems(load(path), kind) == []


def test_gate_check_negative_control():
    gitlab = load(GITLAB)  # composed: the canary job runs on every push, unprotected
    gitlab["canary"]["rules"] = [{"if": "$CI_COMMIT_BRANCH"}]  # overrides .rollout's
    del gitlab["canary"]["environment"]
    problems = gate_problems(gitlab, "gitlab")
    assert "canary: a rollout that starts without a person" in problems
    assert "canary: a rollout with no (protected) environment" in problems
    github = load(GITHUB)  # composed: the canary job runs on push, and may be cancelled
    github["jobs"]["canary"]["if"] = "github.event_name == 'push'"
    github["jobs"]["canary"]["concurrency"]["cancel-in-progress"] = True
    problems = gate_problems(github, "github")
    assert "canary: two rollouts could run at once, or one be cancelled halfway" in problems
    assert "canary: a rollout that starts without a person" in problems
    assert "fleet: a rollout that starts without a person" in problems  # it needs canary


# The variables that hold a secret's value (GitLab's File variables hold only a path).
SECRET_VALUE = re.compile(r"\$\{?(SSH_PRIVATE_KEY|VAULT_PASSWORD|VLLM_API_KEY)\b")


def secret_problems(text: str, doc: dict, kind: str) -> list[str]:
    """Secrets reach scripts as env vars or files, never interpolated into the script text
    (GitHub's ${{ secrets.X }} in run:), never echoed, never traced (set -x)."""
    problems = []
    jobs = github_jobs(doc) if kind == "github" else gitlab_jobs(doc)
    for name, job in jobs.items():
        for script in job["scripts"]:
            if "secrets." in script:
                problems.append(f"{name}: a secret interpolated into a script")
            if re.search(r"set -\w*x|bash -\w*x", script):
                problems.append(f"{name}: shell tracing would print the secrets")
            for line in script.splitlines():
                if re.match(r"\s*(echo|cat)\b", line) and SECRET_VALUE.search(line):
                    problems.append(f"{name}: prints a secret: {line.strip()}")
    if kind == "gitlab" and re.search(r"(?m)^\s*(CI_DEBUG_TRACE|CI_DEBUG_SERVICES):", text):
        problems.append("debug tracing prints every variable")
    return problems


@pytest.mark.parametrize("path, kind", [(GITHUB, "github"), (GITLAB, "gitlab")], ids=["github", "gitlab"])
def test_secrets_are_never_in_a_script_or_printed(path, kind):
    assert secret_problems(path.read_text(), load(path), kind) == []


def test_secret_check_negative_control():
    github = load(GITHUB)  # composed: the two classic leaks
    github["jobs"]["preflight"]["steps"].append({"run": "echo ${{ secrets.VLLM_API_KEY }}"})
    github["jobs"]["canary"]["steps"].append({"run": 'set -x\necho "$VAULT_PASSWORD"'})
    problems = secret_problems("", github, "github")
    assert "preflight: a secret interpolated into a script" in problems
    assert "canary: shell tracing would print the secrets" in problems
    assert 'canary: prints a secret: echo "$VAULT_PASSWORD"' in problems


# ---------------------------------------------------------------- execution environment

def pyproject_pins() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = {}
    for requirement in data["project"]["dependencies"]:
        name, sep, version = requirement.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


def ee_pin_problems(spec: dict) -> list[str]:
    """Every Python requirement of the EE is pinned to pyproject.toml's version."""
    pins, problems = pyproject_pins(), []
    deps = spec["dependencies"]
    wanted = [deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"], *deps.get("python", [])]
    for requirement in wanted:
        name, sep, version = requirement.partition("==")
        name = name.strip().lower()
        if not sep:
            problems.append(f"{requirement}: not pinned")
        elif pins.get(name) != version.strip():
            problems.append(f"{requirement}: pyproject.toml pins {name}=={pins.get(name)}")
    return problems


def used_collections() -> set[str]:
    """Collections the roles and playbooks call, other than ansible.builtin and this one."""
    fqcn = re.compile(r"^\s*-?\s*([a-z_]+\.[a-z_]+)\.[a-z_]+:", re.M)
    found = set()
    for path in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml"),
                 *ROOT.glob("playbooks/*.yml"), ROOT / "rollout.yml"]:
        found |= set(fqcn.findall(path.read_text()))
    return found - {"ansible.builtin", "vllm_fleet.fleet"}


def test_execution_environment_pins_are_pyprojects():
    assert ee_pin_problems(yaml.safe_load(EE.read_text())) == []


def test_ee_pin_check_negative_control():
    spec = yaml.safe_load(EE.read_text())  # composed: drifted and unpinned requirements
    spec["dependencies"]["ansible_core"]["package_pip"] = "ansible-core==2.18.0"
    spec["dependencies"]["python"].append("packaging")
    problems = ee_pin_problems(spec)
    assert "ansible-core==2.18.0: pyproject.toml pins ansible-core==2.19.14" in problems
    assert "packaging: not pinned" in problems


def builder_create(spec: Path, context: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-builder"), "create", "-f", str(spec), "-c", str(context),
                           "--output-filename", "Containerfile"],
                          capture_output=True, text=True, timeout=120, check=False)


def test_ansible_builder_create_makes_the_build_context(tmp_path):
    result = builder_create(EE, tmp_path / "context")
    assert result.returncode == 0, result.stdout + result.stderr
    build = tmp_path / "context" / "_build"
    spec = yaml.safe_load(EE.read_text())
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    assert f'ARG EE_BASE_IMAGE="{spec["images"]["base_image"]["name"]}"' in containerfile
    pins = pyproject_pins()
    refs = f'ARG ANSIBLE_INSTALL_REFS="ansible-core=={pins["ansible-core"]} ansible-runner=={pins["ansible-runner"]}"'
    assert refs in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.11"' in containerfile  # pyproject: requires-python 3.11
    assert (build / "requirements.txt").read_text().split() == spec["dependencies"]["python"]
    collections = {c["name"]: c["version"] for c in yaml.safe_load((build / "requirements.yml").read_text())["collections"]}
    assert used_collections() <= set(collections), used_collections()
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", str(v)) for v in collections.values()), collections
    assert "openssh-clients [platform:rpm]" in (build / "bindep.txt").read_text().splitlines()


def test_ansible_builder_negative_control(tmp_path):
    broken = tmp_path / "execution-environment.yml"  # composed: a misspelt top-level key
    broken.write_text(EE.read_text().replace("\ndependencies:\n", "\ndependancies:\n"))
    result = builder_create(broken, tmp_path / "context")
    assert result.returncode != 0
    assert "dependancies" in result.stdout + result.stderr
    assert not (tmp_path / "context" / "Containerfile").exists()


# ---------------------------------------------------------------- the credential steps, run

KEY = "ci-test-key-0123456789.~+/=-"  # composed: a key of the allowed characters (docs/SECURITY.md)
VAULT_PASSWORD = "ci-test-vault-password"


def github_credentials_step(doc: dict, job: str) -> dict:
    return next(s for s in doc["jobs"][job]["steps"] if s.get("name", "").startswith("Credentials"))


def run_credentials(script: str, tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a credential script as the CI would (bash -e), with this venv's ansible-vault."""
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False,
                            env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), **env})
    return result, env


def leak_problems(result: subprocess.CompletedProcess, api_key_file: Path, files_dir: Path) -> list[str]:
    from vllm_fleet.extravars import is_vaulted  # the CLI's own test: passed to ansible-playbook by path

    problems = []
    if result.returncode != 0:
        return [f"the step failed: {result.stderr[-500:]}"]
    if KEY in result.stdout + result.stderr or VAULT_PASSWORD in result.stdout + result.stderr:
        problems.append("a secret in the step's output")
    if not is_vaulted(api_key_file):
        problems.append(f"{api_key_file.name} is not vaulted: the CLI would read it and hand the key to "
                        "ansible-runner's env/extravars")
    for path in files_dir.rglob("*"):
        if path.is_file():
            if path.stat().st_mode & 0o077:
                problems.append(f"{path.name} is readable by others ({oct(path.stat().st_mode & 0o777)})")
            if KEY in path.read_text():
                problems.append(f"{path.name} holds the API key in plaintext")
    return problems


def decrypted_key(api_key_file: Path, vault_password_file: Path, tmp_path: Path) -> str:
    result = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-m", "ansible.builtin.debug",
                             "-a", "var=vllm_fleet_service_api_key", "-e", f"@{api_key_file}",
                             "--vault-password-file", str(vault_password_file)],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path),
                                 "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_github_credential_step_writes_private_files_and_a_vaulted_key(tmp_path):
    step = github_credentials_step(load(GITHUB), "canary")
    runner_temp, github_env = tmp_path / "runner", tmp_path / "github_env"
    runner_temp.mkdir()
    result, _ = run_credentials(step["run"], tmp_path, {
        "RUNNER_TEMP": str(runner_temp), "GITHUB_ENV": str(github_env),
        "SSH_PRIVATE_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----\ncomposed\n-----END OPENSSH PRIVATE KEY-----",
        "SSH_KNOWN_HOSTS": "node01 ssh-ed25519 AAAAcomposed", "VAULT_PASSWORD": VAULT_PASSWORD, "VLLM_API_KEY": KEY})
    exported = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    api_key_file = Path(exported["API_KEY_VARS"])
    assert leak_problems(result, api_key_file, runner_temp) == []
    assert Path(exported["ANSIBLE_PRIVATE_KEY_FILE"]).read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert KEY in decrypted_key(api_key_file, Path(exported["VAULT_PASSWORD_FILE"]), tmp_path)


def test_gitlab_api_key_lines_write_a_vaulted_key(tmp_path):
    lines = flatten(load(GITLAB)[".rollout"]["before_script"])
    setup = flatten(load(GITLAB)[".vllm-fleet"]["before_script"])
    own = [line for line in lines if line not in setup]  # the API-key lines, not the install
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    vault_file = secrets / "vault_password"  # what GitLab writes for a File variable
    vault_file.write_text(VAULT_PASSWORD + "\n")
    vault_file.chmod(0o600)
    script = "\n".join(own) + '\ncp "$API_KEY_VARS" "$OUT"'
    result, _ = run_credentials(script, tmp_path, {"TMPDIR": str(secrets), "VLLM_API_KEY": KEY,
                                                   "FLEET_VAULT_PASSWORD": str(vault_file),
                                                   "OUT": str(secrets / "api_key.yml")})
    assert leak_problems(result, secrets / "api_key.yml", secrets) == []
    assert KEY in decrypted_key(secrets / "api_key.yml", vault_file, tmp_path)


def test_credential_check_negative_control(tmp_path):
    step = github_credentials_step(load(GITHUB), "canary")
    # composed: the key written as plain YAML, world-readable (no umask)
    script = step["run"].replace("umask 077\n", "umask 022\n").replace(
        """printf '%s' "$VLLM_API_KEY" | ansible-vault encrypt_string \\
  --vault-password-file "$creds/vault_password" \\
  --stdin-name vllm_fleet_service_api_key > "$creds/api_key.yml\"""",
        """printf 'vllm_fleet_service_api_key: %s\\n' "$VLLM_API_KEY" > "$creds/api_key.yml\"""")
    assert script.count("ansible-vault") == 0
    runner_temp = tmp_path / "runner"
    runner_temp.mkdir()
    result, _ = run_credentials(script, tmp_path, {
        "RUNNER_TEMP": str(runner_temp), "GITHUB_ENV": str(tmp_path / "github_env"), "SSH_PRIVATE_KEY": "k",
        "SSH_KNOWN_HOSTS": "h", "VAULT_PASSWORD": VAULT_PASSWORD, "VLLM_API_KEY": KEY})
    problems = leak_problems(result, runner_temp / "vllm-fleet-credentials" / "api_key.yml", runner_temp)
    assert any("api_key.yml is not vaulted" in p for p in problems), problems
    assert "api_key.yml holds the API key in plaintext" in problems
    assert any("readable by others" in p for p in problems), problems
