#!/usr/bin/env bash
# Prepare this machine for vllm-fleet's tests: host packages, podman settings, the venv.
# Idempotent: prints one line per step it actually did, nothing when all is in place.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
CONF=/etc/containers/containers.conf

if [[ $EUID -ne 0 ]]; then
    echo "setup-host: run as root (rootful podman, apt-get)" >&2
    exit 1
fi

# --- (a) host packages -------------------------------------------------------------
# podman+runc boot the simulated nodes, debootstrap builds their image, haproxy fronts
# the fleet, gcc/make build the fake GPU libraries, python3-venv in case python3.11 is
# Debian's own; prometheus (with promtool) checks and runs the fleet_monitoring rules (the
# tests start their own on a free loopback port, apart from the package's service on 9090).
packages=(podman runc debootstrap haproxy gcc make iproute2 ca-certificates python3-venv chromium fonts-dejavu-core
          prometheus)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "setup-host: installed ${missing[*]}"
fi

# --- (b) podman engine settings -------------------------------------------------------
# crun cannot run on this hybrid cgroup host, and podman's default ulimits exceed what
# the host allows (setrlimit EPERM): runc, and the host's own hard limits.
nofile="$(ulimit -Hn)"
nproc="$(ulimit -Hu)"
pid_max="$(cat /proc/sys/kernel/pid_max)"
if [[ $nproc == unlimited ]] || ((nproc > pid_max)); then nproc=$pid_max; fi
[[ $nofile == unlimited ]] && nofile=1048576

rc=0
/usr/bin/python3 - "$CONF" "$nofile" "$nproc" <<'PY' || rc=$?
# Set just our keys in their TOML tables, keep every other line; exit 10 when changed.
import pathlib, re, sys

path, nofile, nproc = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
wanted = {
    "containers": {"default_ulimits": f'["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]'},
    "engine": {"runtime": '"runc"'},
}
old = path.read_text() if path.exists() else ""
lines, table, seen = old.splitlines(), None, set()
out, skipping = [], False
for line in lines:
    if skipping:  # rest of a multi-line array we replaced
        skipping = "]" not in line
        continue
    header = re.match(r"\s*\[([^\[\]]+)\]\s*$", line)
    if header:
        # add keys missing from the table we are leaving
        out += [f"{k} = {v}" for k, v in wanted.get(table, {}).items() if (table, k) not in seen]
        seen |= {(table, k) for k in wanted.get(table, {})}
        table = header.group(1).strip()
    key = re.match(r"\s*([A-Za-z_]+)\s*=", line)
    if key and key.group(1) in wanted.get(table, {}):
        skipping = line.count("[") > line.count("]")
        line = f"{key.group(1)} = {wanted[table][key.group(1)]}"
        seen.add((table, key.group(1)))
    out.append(line)
out += [f"{k} = {v}" for k, v in wanted.get(table, {}).items() if (table, k) not in seen]
seen |= {(table, k) for k in wanted.get(table, {})}
for t, keys in wanted.items():
    if t not in {tt for tt, _ in seen}:
        out += ["", f"[{t}]"] + [f"{k} = {v}" for k, v in keys.items()]
new = "\n".join(out).lstrip("\n") + "\n"
if new != old:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    sys.exit(10)
PY
case $rc in
    0) ;;
    10) echo "setup-host: set runtime=runc and default_ulimits nofile=$nofile nproc=$nproc in $CONF" ;;
    *) exit "$rc" ;;
esac

# --- (c) the project venv (Python 3.11, as pyproject pins) --------------------------
py=""
for cand in "$(command -v python3.11 || true)" /usr/bin/python3.11; do
    if [[ -x $cand ]] && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        py="$cand"; break
    fi
done
if [[ -z $py ]]; then
    echo "setup-host: no python3.11 found (pyenv or Debian's)" >&2
    exit 1
fi
if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    "$py" -m venv --clear "$VENV"
    echo "setup-host: created $VENV with $("$VENV/bin/python" -V)"
fi
stamp="$VENV/.pyproject.sha256"
want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    # setuptools' build warnings go to the log; shown only when the install fails
    log="$VENV/pip-install.log"
    if ! "$VENV/bin/pip" install -e "$REPO[test]" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "setup-host: pip install failed, full log in $log" >&2
        exit 1
    fi
    echo "$want" >"$stamp"
    echo "setup-host: installed $REPO[test] into $VENV"
fi
