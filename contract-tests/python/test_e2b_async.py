"""The real `e2b` Python SDK's asyncio client (`AsyncSandbox`) against Nestbox: the same surface
as test_e2b_sync.py through the async code paths (its own transports, callbacks and handles)."""

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import pytest_asyncio
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from conftest import async_wait_until

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(scope="module")
async def sbx():
    sandbox = await AsyncSandbox.create(allow_internet_access=False, timeout=600, envs={"FROM_SANDBOX": "sandbox-env"})
    yield sandbox
    await sandbox.kill()


# --- lifecycle ---


async def test_create_get_info_list_connect_set_timeout_and_kill():
    tag = uuid.uuid4().hex
    sandbox = await AsyncSandbox.create(allow_internet_access=False, timeout=300, metadata={"suite": "python-async", "tag": tag})
    try:
        info = await sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"suite": "python-async", "tag": tag}
        assert info.end_at - info.started_at == timedelta(seconds=300)
        assert await sandbox.is_running()

        page = await AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert [s.sandbox_id for s in page] == [sandbox.sandbox_id]

        await sandbox.files.write("/tmp/connect-marker", tag)
        again = await AsyncSandbox.connect(sandbox.sandbox_id)
        assert await again.files.read("/tmp/connect-marker") == tag

        before = datetime.now(timezone.utc)
        await sandbox.set_timeout(900)
        end_at = (await sandbox.get_info()).end_at
        assert before + timedelta(seconds=890) <= end_at <= datetime.now(timezone.utc) + timedelta(seconds=910)

        await sandbox.kill()
        assert not await sandbox.is_running()
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info(sandbox.sandbox_id)
        assert await AsyncSandbox.kill(sandbox.sandbox_id) is False
    finally:
        await AsyncSandbox.kill(sandbox.sandbox_id)


async def test_connect_to_an_unknown_sandbox_raises_not_found():
    with pytest.raises(NotFoundException):
        await AsyncSandbox.connect("nosuchsandbox0000000")


# --- commands ---


async def test_run_with_cwd_envs_and_output_callbacks(sbx):
    out, err = [], []
    result = await sbx.commands.run(
        "echo out; echo err >&2; pwd; echo $FOO; echo $FROM_SANDBOX",
        cwd="/tmp",
        envs={"FOO": "bar"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "out\n/tmp\nbar\nsandbox-env\n"
    assert result.stderr == "err\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == "err\n"


async def test_non_zero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as caught:
        await sbx.commands.run("echo partial; echo bad >&2; exit 3")
    assert (caught.value.exit_code, caught.value.stdout, caught.value.stderr) == (3, "partial\n", "bad\n")


async def test_command_timeout_raises_timeout_exception(sbx):
    with pytest.raises(TimeoutException):
        await sbx.commands.run("sleep 31", timeout=1)

    async def gone():
        return not any("sleep 31" in " ".join(p.args) for p in await sbx.commands.list())

    await async_wait_until("the timed-out command to be gone", gone, timeout=10)


async def test_background_command_stdin_callbacks_and_kill(sbx):
    seen = []
    handle = await sbx.commands.run("cat", background=True, stdin=True, on_stdout=seen.append)
    assert any(p.pid == handle.pid for p in await sbx.commands.list())
    await sbx.commands.send_stdin(handle.pid, "hello async stdin\n")

    async def echoed():
        return "".join(seen) == "hello async stdin\n"

    await async_wait_until("cat to echo stdin", echoed, timeout=10)
    assert await handle.kill() is True
    with pytest.raises(CommandExitException) as caught:
        await handle.wait()
    assert caught.value.exit_code == 137
    assert await sbx.commands.kill(handle.pid) is False


async def test_close_stdin_ends_a_reader(sbx):
    handle = await sbx.commands.run("wc -c", background=True, stdin=True)
    await sbx.commands.send_stdin(handle.pid, "1234567")
    await handle.close_stdin()
    assert (await handle.wait()).stdout.strip() == "7"


async def test_concurrent_commands_on_one_sandbox(sbx):
    results = await asyncio.gather(*(sbx.commands.run(f"echo job-{i}") for i in range(5)))
    assert [r.stdout for r in results] == [f"job-{i}\n" for i in range(5)]


# --- pty ---


async def test_pty_runs_an_interactive_shell_and_resizes(sbx):
    chunks = []
    handle = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=chunks.append, cwd="/tmp", envs={"PTY_VAR": "in-async-pty"})
    await sbx.pty.resize(handle.pid, PtySize(rows=33, cols=90))
    await sbx.pty.send_stdin(handle.pid, b"stty size; echo $PTY_VAR; pwd; exit 5\n")
    with pytest.raises(CommandExitException) as caught:
        await handle.wait()
    assert caught.value.exit_code == 5
    text = b"".join(chunks).decode()
    assert "33 90" in text
    assert "in-async-pty" in text
    assert "/tmp\r\n" in text


async def test_pty_kill(sbx):
    handle = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=lambda _: None)
    assert await sbx.pty.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        await handle.wait()


# --- files ---


async def test_write_read_list_stat_rename_remove(sbx):
    base = "/tmp/py-async/tree"
    await sbx.files.write(f"{base}/a.txt", "aaa")
    payload = bytes(range(256)) * 32
    await sbx.files.write(f"{base}/sub/blob.bin", payload)
    assert await sbx.files.read(f"{base}/a.txt") == "aaa"
    assert await sbx.files.read(f"{base}/sub/blob.bin", format="bytes") == payload
    streamed = b"".join([chunk async for chunk in await sbx.files.read(f"{base}/sub/blob.bin", format="stream")])
    assert streamed == payload

    assert await sbx.files.make_dir(f"{base}/empty") is True
    entries = {e.name: e for e in await sbx.files.list(base)}
    assert set(entries) == {"a.txt", "sub", "empty"}
    assert entries["sub"].type == FileType.DIR
    stat = await sbx.files.get_info(f"{base}/sub/blob.bin")
    assert (stat.type, stat.size) == (FileType.FILE, len(payload))
    assert await sbx.files.exists(f"{base}/a.txt") is True

    await sbx.files.rename(f"{base}/a.txt", f"{base}/b.txt")
    assert await sbx.files.exists(f"{base}/a.txt") is False
    assert await sbx.files.read(f"{base}/b.txt") == "aaa"
    await sbx.files.remove(f"{base}/b.txt")
    assert await sbx.files.exists(f"{base}/b.txt") is False

    with pytest.raises(NotFoundException):
        await sbx.files.read(f"{base}/b.txt")


async def test_watch_dir_streams_events_to_a_callback(sbx):
    await sbx.files.make_dir("/tmp/py-async/watched")
    events = []
    handle = await sbx.files.watch_dir("/tmp/py-async/watched", on_event=events.append, recursive=True)
    try:
        await sbx.files.make_dir("/tmp/py-async/watched/inner")
        await sbx.files.write("/tmp/py-async/watched/inner/deep.txt", "x")

        async def created():
            return any(e.name == "inner/deep.txt" and e.type == FilesystemEventType.CREATE for e in events)

        await async_wait_until("a CREATE event for inner/deep.txt", created, timeout=15)
        assert any(e.name == "inner" and e.type == FilesystemEventType.CREATE for e in events)
    finally:
        await handle.stop()


# --- signed URLs ---


async def test_signed_upload_and_download_urls(sbx):
    upload_url = sbx.upload_url("/tmp/py-async/signed/up.bin", use_signature_expiration=60)
    async with httpx.AsyncClient() as client:
        up = await client.post(upload_url, files={"file": ("up.bin", b"\x00async upload\xff")})
        assert up.status_code == 200, up.text
        down = await client.get(sbx.download_url("/tmp/py-async/signed/up.bin", use_signature_expiration=60))
        assert down.status_code == 200
        assert down.content == b"\x00async upload\xff"
        tampered = await client.get(sbx.download_url("/tmp/py-async/signed/up.bin").replace("up.bin", "up.txt"))
        assert tampered.status_code == 401
    assert await sbx.files.read("/tmp/py-async/signed/up.bin", format="bytes") == b"\x00async upload\xff"
