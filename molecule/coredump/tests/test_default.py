"""coredump enable on a simulated node with a running instance: the drop-in in effect (the
instance restarted into it), the directories' modes, and a dump the serving user writes
moved root-only into the store, where that user cannot read it."""
import time

UNIT = "vllm@gpu0.service"
DROP = "/var/lib/vllm-fleet/coredump-drop"
STORE = "/var/lib/vllm-fleet/coredumps"


def show(host, prop):
    return host.check_output(f"systemctl show -P {prop} {UNIT}")


def test_the_running_instance_restarted_with_capture_on(host):
    assert host.service(UNIT).is_running
    assert show(host, "MainPID") != host.file("/run/vf-pid-before").content_string.strip()
    env = show(host, "Environment").split()
    assert "CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1" in env
    assert f"CUDA_COREDUMP_FILE={DROP}/core_%h.%p.%t.nvcudmp" in env
    assert show(host, "LimitCORE") == "infinity"


def test_the_drop_directory_takes_files_but_shows_none(host):
    drop, store = host.file(DROP), host.file(STORE)
    assert (drop.user, drop.group, drop.mode) == ("root", "vllm", 0o730)
    assert (store.user, store.group, store.mode) == ("root", "root", 0o700)
    assert host.run(f"runuser -u vllm -- ls {DROP}").rc != 0


def test_a_dump_the_serving_user_writes_is_moved_root_only(host):
    assert host.service("vllm-fleet-coredump.path").is_running
    name = f"core_molecule.{int(time.time())}.nvcudmp"
    host.check_output(f"runuser -u vllm -- sh -c 'echo dump > {DROP}/{name}'")
    moved = host.file(f"{STORE}/{name}")
    for _ in range(50):
        if moved.exists:
            break
        time.sleep(0.2)
    assert moved.exists and not host.file(f"{DROP}/{name}").exists
    assert (moved.user, moved.group, moved.mode) == ("root", "root", 0o600)
    # Negative control: the user that wrote it cannot read it back from the store.
    assert host.run(f"runuser -u vllm -- cat {STORE}/{name}").rc != 0
