"""The behaviour differences of issue 13, pinned through the Python SDKs (each failed on the server
before its fix): E2B list filters, symlink stat, remove of a missing path, WRITE events, connect
only extending a timeout, the default user, every port reachable; Daytona's exec timeout, session
input and the terminal delete body."""

import os
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from daytona import AsyncDaytona, CreateSandboxFromSnapshotParams, Daytona, DaytonaTimeoutError, SessionExecuteRequest
from e2b import FilesystemEventType, Sandbox, SandboxQuery

from conftest import async_wait_until, wait_until


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(allow_internet_access=False)
    yield sandbox
    sandbox.kill()


def test_e2b_list_started_after_and_template(sbx):
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(started_after=later)).next_items()]
    earlier = datetime.now(timezone.utc) - timedelta(hours=1)
    assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(started_after=earlier)).next_items()]
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(template="no-such-template")).next_items()]


def test_e2b_symlink_stat_gives_the_absolute_target(sbx):
    sbx.commands.run("mkdir -p /tmp/k && echo x > /tmp/k/t && ln -sf t /tmp/k/l")
    assert sbx.files.get_info("/tmp/k/l").symlink_target == "/tmp/k/t"


def test_e2b_remove_of_a_missing_path_succeeds(sbx):
    sbx.files.remove("/tmp/k/never-existed")
    assert not sbx.files.exists("/tmp/k/never-existed")


def test_e2b_overwrite_is_a_write_event(sbx):
    sbx.files.make_dir("/tmp/w")
    sbx.files.write("/tmp/w/w.txt", "a")
    handle = sbx.files.watch_dir("/tmp/w")
    try:
        sbx.files.write("/tmp/w/w.txt", "b")
        seen = []

        def got_write():
            seen.extend(handle.get_new_events())
            return any(e.type == FilesystemEventType.WRITE and e.name == "w.txt" for e in seen)

        wait_until("a WRITE event", got_write, timeout=10)
    finally:
        handle.stop()


def test_e2b_connect_does_not_shorten_a_timeout(sbx):
    sbx.set_timeout(600)
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    assert sbx.get_info().end_at > datetime.now(timezone.utc) + timedelta(seconds=500)


def test_e2b_default_user_home_sudo_and_python(sbx):
    assert sbx.commands.run("whoami").stdout == "user\n"
    assert sbx.commands.run("pwd").stdout == "/home/user\n"
    assert sbx.commands.run("sudo -n whoami").stdout == "root\n"
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"
    assert sbx.commands.run("python --version").exit_code == 0
    sbx.files.write("relative.txt", "mine")
    assert sbx.commands.run("stat -c %U /home/user/relative.txt").stdout == "user\n"


def test_e2b_every_port_is_reachable_by_routing_headers(sbx):
    sbx.files.write("/tmp/port/index.html", "from-port-8123")
    sbx.commands.run("cd /tmp/port && python3 -m http.server 8123 --bind 0.0.0.0", background=True)
    url = os.environ["E2B_SANDBOX_URL"]

    def answered():
        try:
            r = httpx.get(url + "/index.html", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8123"}, timeout=5)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    assert wait_until("the port to answer", answered, timeout=15).text == "from-port-8123"


def test_daytona_exec_timeout_is_a_timeout_error():
    daytona = Daytona()
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
    try:
        started = time.monotonic()
        with pytest.raises(DaytonaTimeoutError):
            sandbox.process.exec("sleep 30", timeout=1)
        assert time.monotonic() - started < 25
    finally:
        daytona.delete(sandbox)


def test_daytona_session_input_gets_its_newline_and_is_echoed():
    daytona = Daytona()
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
    try:
        sandbox.process.create_session("k")
        cmd = sandbox.process.execute_session_command("k", SessionExecuteRequest(command='read name; echo "hello $name"', run_async=True))
        sandbox.process.send_session_command_input("k", cmd.cmd_id, "nestbox")
        wait_until("the command to end", lambda: sandbox.process.get_session_command("k", cmd.cmd_id).exit_code is not None, timeout=15)
        logs = sandbox.process.get_session_command_logs("k", cmd.cmd_id)
        assert "hello nestbox" in logs.stdout
    finally:
        daytona.delete(sandbox)


@pytest.mark.asyncio
async def test_daytona_async_kill_pty_session():
    async with AsyncDaytona() as daytona:
        sandbox = await daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
        try:
            pty = await sandbox.process.create_pty_session("kp", on_data=lambda _: None)
            await pty.wait_for_connection()
            await sandbox.process.kill_pty_session("kp")

            async def gone():
                return "kp" not in [s.id for s in await sandbox.process.list_pty_sessions() if s.active]

            await async_wait_until("the killed terminal to end", gone, timeout=10)
        finally:
            await daytona.delete(sandbox)
