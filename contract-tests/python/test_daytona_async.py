"""The real `daytona` Python SDK's asyncio client (`AsyncDaytona`) against Nestbox: the same
surface as test_daytona_sync.py through the async code paths (aiohttp clients, streamed session
logs, the async PTY handle)."""

import asyncio
import uuid

import httpx
import pytest
import pytest_asyncio
from daytona import (
    AsyncDaytona,
    CodeRunParams,
    CreateSandboxFromSnapshotParams,
    DaytonaNotFoundError,
    FileUpload,
    ListSandboxesQuery,
    PtySize,
    SandboxState,
    SessionExecuteRequest,
)

from conftest import async_wait_until

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(scope="module")
async def daytona():
    async with AsyncDaytona() as client:
        yield client


@pytest_asyncio.fixture(scope="module")
async def sb(daytona):
    sandbox = await daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
    yield sandbox
    await daytona.delete(sandbox)


async def listed(daytona, query):
    return [s.id async for s in daytona.list(query)]


# --- lifecycle ---


async def test_create_get_list_stop_start_and_delete(daytona):
    tag = uuid.uuid4().hex
    sandbox = await daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, labels={"suite": "python-async", "tag": tag}))
    try:
        assert sandbox.state == SandboxState.STARTED
        assert (await daytona.get(sandbox.id)).labels["tag"] == tag
        assert await listed(daytona, ListSandboxesQuery(labels={"tag": tag})) == [sandbox.id]

        await sandbox.stop()
        assert (await daytona.get(sandbox.id)).state == SandboxState.STOPPED
        await sandbox.start()
        assert (await sandbox.process.exec("echo back")).result == "back\n"

        await daytona.delete(sandbox)
        assert await listed(daytona, ListSandboxesQuery(labels={"tag": tag})) == []
        with pytest.raises(DaytonaNotFoundError):
            await daytona.get(sandbox.id)
    except BaseException:
        await daytona.delete(sandbox)
        raise


async def test_unknown_sandbox_raises_not_found(daytona):
    with pytest.raises(DaytonaNotFoundError):
        await daytona.get("nosuchsandbox0000000")


# --- process ---


async def test_exec_and_code_run(sb):
    r = await sb.process.exec("pwd; echo $FOO", cwd="/tmp", env={"FOO": "async-bar"})
    assert (r.exit_code, r.result) == (0, "/tmp\nasync-bar\n")
    assert (await sb.process.exec("exit 6")).exit_code == 6
    code = await sb.process.code_run("import sys\nprint(sys.argv[1:])", params=CodeRunParams(argv=["x"]))
    assert (code.exit_code, code.result) == (0, "['x']\n")


async def test_concurrent_execs(sb):
    results = await asyncio.gather(*(sb.process.exec(f"echo job-{i}") for i in range(5)))
    assert [r.result for r in results] == [f"job-{i}\n" for i in range(5)]


# --- sessions ---


async def test_sessions_with_streamed_logs(sb):
    await sb.process.create_session("py-as1")
    first = await sb.process.execute_session_command("py-as1", SessionExecuteRequest(command="cd /tmp && export W=7"))
    assert first.exit_code == 0
    second = await sb.process.execute_session_command("py-as1", SessionExecuteRequest(command='echo "$W $(pwd)"; echo warn >&2'))
    assert (second.stdout, second.stderr) == ("7 /tmp\n", "warn\n")

    started = await sb.process.execute_session_command(
        "py-as1", SessionExecuteRequest(command="for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.2; done", run_async=True)
    )
    out, err = [], []
    # Follows the command's output until it ends.
    await sb.process.get_session_command_logs_async("py-as1", started.cmd_id, out.append, err.append)
    assert "".join(out) == "line1\nline2\nline3\n"
    assert "".join(err) == "e1\ne2\ne3\n"
    assert (await sb.process.get_session_command("py-as1", started.cmd_id)).exit_code == 0
    logs = await sb.process.get_session_command_logs("py-as1", started.cmd_id)
    assert (logs.stdout, logs.stderr) == ("line1\nline2\nline3\n", "e1\ne2\ne3\n")

    assert "py-as1" in [s.session_id for s in await sb.process.list_sessions()]
    await sb.process.delete_session("py-as1")
    with pytest.raises(DaytonaNotFoundError):
        await sb.process.get_session("py-as1")


# --- pty ---


async def test_pty_session_over_the_websocket(sb):
    chunks = []
    pty = await sb.process.create_pty_session("py-apty1", on_data=chunks.append, cwd="/tmp", envs={"PTY_VAR": "async-env"}, pty_size=PtySize(rows=30, cols=100))
    try:
        await pty.wait_for_connection()
        assert (await pty.resize(PtySize(rows=35, cols=110))).rows == 35
        await pty.send_input("echo value=$PTY_VAR; stty size; exit 2\n")
        result = await asyncio.wait_for(pty.wait(), 30)
        assert result.exit_code == 2
        text = b"".join(chunks).decode()
        assert "value=async-env" in text
        assert "35 110" in text
    finally:
        await pty.disconnect()


# --- files ---


async def test_files_upload_download_list_find_replace(sb):
    base = "/tmp/py-daytona-async/files"
    await sb.fs.create_folder(base, "755")
    await sb.fs.upload_files([FileUpload(source=b"hello async\n", destination=f"{base}/a.txt"), FileUpload(source=bytes(range(256)), destination=f"{base}/b.bin")])
    assert await sb.fs.download_file(f"{base}/a.txt") == b"hello async\n"
    assert await sb.fs.download_file(f"{base}/b.bin") == bytes(range(256))
    assert sorted(f.name for f in await sb.fs.list_files(base)) == ["a.txt", "b.bin"]
    assert (await sb.fs.get_file_info(f"{base}/b.bin")).size == 256

    matches = await sb.fs.find_files(base, "async")
    assert [(m.file, m.line) for m in matches] == [(f"{base}/a.txt", 1)]
    await sb.fs.replace_in_files([f"{base}/a.txt"], "async", "there")
    assert await sb.fs.download_file(f"{base}/a.txt") == b"hello there\n"

    await sb.fs.delete_file(f"{base}/a.txt")
    with pytest.raises(DaytonaNotFoundError):
        await sb.fs.download_file(f"{base}/a.txt")


# --- git ---


async def test_git_commit_push_and_clone(sb):
    remote, work, clone = "/tmp/py-agit/remote.git", "/tmp/py-agit/work", "/tmp/py-agit/clone"
    await sb.git.init(remote, bare=True, initial_branch="main")
    await sb.git.init(work, initial_branch="main")
    await sb.git.remote_add(work, "origin", remote)
    await sb.fs.upload_file(b"async one\n", f"{work}/a.txt")
    await sb.git.add(work, ["a.txt"])
    commit = await sb.git.commit(work, "async commit", "Ada", "ada@example.com")
    await sb.git.push(work, branch="main", remote="origin", set_upstream=True)
    await sb.git.clone(remote, clone, branch="main")
    assert await sb.fs.download_file(f"{clone}/a.txt") == b"async one\n"
    assert (await sb.process.exec(f"git -C {clone} rev-parse HEAD")).result.strip() == commit.sha
    status = await sb.git.status(clone)
    assert (status.current_branch, status.file_status) == ("main", [])


# --- preview links ---


async def test_preview_link_reaches_a_server_in_the_sandbox(sb):
    await sb.process.exec("mkdir -p /tmp/py-asite && echo async-preview > /tmp/py-asite/index.html")
    await sb.process.exec("cd /tmp/py-asite && (nohup python3 -m http.server 3112 --bind 0.0.0.0 >/dev/null 2>&1 &)")
    preview = await sb.get_preview_link(3112)
    async with httpx.AsyncClient() as client:

        async def served():
            res = await client.get(preview.url, headers={"X-Daytona-Preview-Token": preview.token})
            return res if res.status_code == 200 else None

        res = await async_wait_until("the preview server", served, timeout=20)
        assert res.text == "async-preview\n"
