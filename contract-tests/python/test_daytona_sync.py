"""The real `daytona` Python SDK's synchronous client (`Daytona`) against Nestbox: lifecycle,
process.exec / code_run, sessions, PTY, files, git (a bare repository inside the sandbox is the
remote: no network), preview links to a server in the sandbox, and the SDK's error classes.
Paths are absolute under /tmp, so nothing depends on the sandbox's default user or home."""

import os
import uuid

import httpx
import pytest
from daytona import (
    CodeRunParams,
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaAuthenticationError,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    FileUpload,
    ListSandboxesQuery,
    PtySize,
    SandboxState,
    SessionExecuteRequest,
)

from conftest import wait_until


@pytest.fixture(scope="module")
def daytona():
    return Daytona()


@pytest.fixture(scope="module")
def sb(daytona):
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, env_vars={"FROM_SANDBOX": "sandbox-env"}))
    yield sandbox
    daytona.delete(sandbox)


# --- lifecycle ---


def test_create_get_list_stop_start_and_delete(daytona):
    tag = uuid.uuid4().hex
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, labels={"suite": "python-sync", "tag": tag}))
    try:
        assert sandbox.state == SandboxState.STARTED
        got = daytona.get(sandbox.id)
        assert got.id == sandbox.id
        assert got.labels["tag"] == tag
        assert [s.id for s in daytona.list(ListSandboxesQuery(labels={"tag": tag}))] == [sandbox.id]

        sandbox.stop()
        assert daytona.get(sandbox.id).state == SandboxState.STOPPED
        sandbox.start()
        assert daytona.get(sandbox.id).state == SandboxState.STARTED
        assert sandbox.process.exec("echo back").result == "back\n"

        daytona.delete(sandbox)
        assert list(daytona.list(ListSandboxesQuery(labels={"tag": tag}))) == []
        with pytest.raises(DaytonaNotFoundError):
            daytona.get(sandbox.id)
    except BaseException:
        daytona.delete(sandbox)
        raise


def test_unknown_sandbox_raises_not_found(daytona):
    with pytest.raises(DaytonaNotFoundError):
        daytona.get("nosuchsandbox0000000")


def test_a_wrong_api_key_raises_authentication_error():
    stranger = Daytona(DaytonaConfig(api_key="not-a-nestbox-key", api_url=os.environ["DAYTONA_API_URL"]))
    with pytest.raises(DaytonaAuthenticationError):
        stranger.get("nosuchsandbox0000000")
    with pytest.raises(DaytonaAuthenticationError):
        stranger.create(CreateSandboxFromSnapshotParams(network_block_all=True))


# --- process ---


def test_exec_with_cwd_env_and_exit_code(sb):
    r = sb.process.exec("pwd; echo $FOO $FROM_SANDBOX", cwd="/tmp", env={"FOO": "bar"})
    assert r.exit_code == 0
    assert r.result == "/tmp\nbar sandbox-env\n"
    failed = sb.process.exec("echo nope; exit 4")
    assert failed.exit_code == 4
    assert failed.result == "nope\n"


def test_code_run_python_with_argv_and_env(sb):
    r = sb.process.code_run(
        'import os, sys\nprint("py", sum([1, 2, 3]), sys.argv[1:], os.environ["CODE_VAR"])',
        params=CodeRunParams(argv=["a", "b"], env={"CODE_VAR": "set"}),
    )
    assert r.exit_code == 0
    assert r.result == "py 6 ['a', 'b'] set\n"
    failed = sb.process.code_run("raise SystemExit(3)")
    assert failed.exit_code == 3


# --- sessions ---


def test_sessions_keep_state_run_async_commands_and_keep_logs(sb):
    sb.process.create_session("py-s1")
    first = sb.process.execute_session_command("py-s1", SessionExecuteRequest(command="cd /tmp && export V=42 && echo out; echo err >&2"))
    assert first.exit_code == 0
    assert first.stdout == "out\n"
    assert first.stderr == "err\n"
    second = sb.process.execute_session_command("py-s1", SessionExecuteRequest(command='echo "$V $(pwd)"'))
    assert second.stdout == "42 /tmp\n"

    started = sb.process.execute_session_command(
        "py-s1", SessionExecuteRequest(command="for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.2; done", run_async=True)
    )
    assert started.cmd_id
    wait_until("the async command to finish", lambda: sb.process.get_session_command("py-s1", started.cmd_id).exit_code is not None, timeout=20)
    assert sb.process.get_session_command("py-s1", started.cmd_id).exit_code == 0
    logs = sb.process.get_session_command_logs("py-s1", started.cmd_id)
    assert logs.stdout == "line1\nline2\nline3\n"
    assert logs.stderr == "e1\ne2\ne3\n"

    session = sb.process.get_session("py-s1")
    assert session.session_id == "py-s1"
    assert [c.command for c in session.commands][0] == "cd /tmp && export V=42 && echo out; echo err >&2"
    assert len(session.commands) == 3
    assert "py-s1" in [s.session_id for s in sb.process.list_sessions()]

    sb.process.delete_session("py-s1")
    with pytest.raises(DaytonaNotFoundError):
        sb.process.get_session("py-s1")


# --- pty ---


def test_pty_session_over_the_websocket(sb):
    pty = sb.process.create_pty_session("py-pty1", cwd="/tmp", envs={"PTY_VAR": "from-env"}, pty_size=PtySize(rows=30, cols=100))
    try:
        pty.wait_for_connection()
        assert pty.resize(PtySize(rows=40, cols=120)).cols == 120
        assert "py-pty1" in [s.id for s in sb.process.list_pty_sessions()]
        assert sb.process.get_pty_session_info("py-pty1").active is True
        pty.send_input("echo value=$PTY_VAR; stty size; pwd; exit 3\n")
        chunks = []
        result = pty.wait(on_data=chunks.append, timeout=30)
        assert result.exit_code == 3
        text = b"".join(chunks).decode()
        assert "value=from-env" in text
        assert "40 120" in text
        assert "/tmp\r\n" in text
    finally:
        pty.disconnect()
    with pytest.raises(DaytonaNotFoundError):
        sb.process.get_pty_session_info("py-no-such-pty")


# --- files ---


def test_upload_download_list_info_move_delete(sb):
    base = "/tmp/py-daytona-sync/files"
    sb.fs.create_folder(base, "755")
    sb.fs.upload_file(b"alpha", f"{base}/a.txt")
    sb.fs.upload_files([FileUpload(source=bytes([0, 1, 2, 255]), destination=f"{base}/b.bin"), FileUpload(source=b"gamma", destination=f"{base}/sub/c.txt")])
    assert sb.fs.download_file(f"{base}/a.txt") == b"alpha"
    assert sb.fs.download_file(f"{base}/b.bin") == bytes([0, 1, 2, 255])

    listed = {f.name: f for f in sb.fs.list_files(base)}
    assert set(listed) == {"a.txt", "b.bin", "sub"}
    assert listed["sub"].is_dir is True
    assert listed["a.txt"].size == 5
    info = sb.fs.get_file_info(f"{base}/b.bin")
    assert (info.name, info.size, info.is_dir) == ("b.bin", 4, False)

    sb.fs.move_files(f"{base}/a.txt", f"{base}/moved.txt")
    assert sb.fs.download_file(f"{base}/moved.txt") == b"alpha"
    sb.fs.set_file_permissions(f"{base}/moved.txt", mode="600")
    assert sb.process.exec(f"stat -c %a {base}/moved.txt").result == "600\n"
    sb.fs.delete_file(f"{base}/moved.txt")
    with pytest.raises(DaytonaNotFoundError):
        sb.fs.download_file(f"{base}/moved.txt")
    sb.fs.delete_file(f"{base}/sub", recursive=True)
    assert "sub" not in {f.name for f in sb.fs.list_files(base)}


def test_find_search_and_replace_in_files(sb):
    base = "/tmp/py-daytona-sync/grep"
    sb.fs.upload_files(
        [
            FileUpload(source=b"hello world\nsecond line\n", destination=f"{base}/one.txt"),
            FileUpload(source=b"nothing here\nhello again\n", destination=f"{base}/two.md"),
        ]
    )
    matches = sorted((m.file, m.line, m.content) for m in sb.fs.find_files(base, "hello"))
    assert matches == [(f"{base}/one.txt", 1, "hello world"), (f"{base}/two.md", 2, "hello again")]
    assert sb.fs.search_files(base, "*.md").files == [f"{base}/two.md"]

    results = sb.fs.replace_in_files([f"{base}/one.txt", f"{base}/two.md"], "hello", "bye")
    assert sorted(r.file for r in results if r.success) == [f"{base}/one.txt", f"{base}/two.md"]
    assert sb.fs.download_file(f"{base}/one.txt") == b"bye world\nsecond line\n"


# --- git (the remote is a bare repository in the same sandbox) ---


def test_git_init_commit_push_clone_pull_branches(sb):
    remote, work, clone = "/tmp/py-git/remote.git", "/tmp/py-git/work", "/tmp/py-git/clone"
    sb.git.init(remote, bare=True, initial_branch="main")
    sb.git.init(work, initial_branch="main")
    sb.git.remote_add(work, "origin", remote)
    assert sb.git.remote_get(work, "origin") == remote

    sb.fs.upload_file(b"one\n", f"{work}/a.txt")
    status = sb.git.status(work)
    assert status.current_branch == "main"
    assert [(f.name, f.staging) for f in status.file_status] == [("a.txt", "Untracked")]
    sb.git.add(work, ["a.txt"])
    first = sb.git.commit(work, "first commit", "Ada", "ada@example.com")
    assert len(first.sha) == 40
    sb.git.push(work, branch="main", remote="origin", set_upstream=True)
    status = sb.git.status(work)
    assert (status.ahead, status.behind, status.branch_published, status.file_status) == (0, 0, True, [])

    sb.git.clone(remote, clone, branch="main")
    assert sb.fs.download_file(f"{clone}/a.txt") == b"one\n"
    assert sb.process.exec(f'git -C {clone} log --format="%H %an %s"').result.strip() == f"{first.sha} Ada first commit"

    sb.fs.upload_file(b"two\n", f"{work}/b.txt")
    sb.git.add(work, ["."])
    second = sb.git.commit(work, "second", "Ada", "ada@example.com")
    sb.git.push(work)
    sb.git.pull(clone)
    assert sb.process.exec(f"git -C {clone} rev-parse HEAD").result.strip() == second.sha

    sb.git.create_branch(work, "feature")
    assert sorted(sb.git.branches(work).branches) == ["feature", "main"]
    sb.git.checkout_branch(work, "main")
    assert sb.git.status(work).current_branch == "main"
    sb.git.delete_branch(work, "feature")
    assert sb.git.branches(work).branches == ["main"]
    with pytest.raises(DaytonaNotFoundError):
        sb.git.checkout_branch(work, "no-such-branch")


def test_git_clone_of_a_missing_repository_fails(sb):
    with pytest.raises(DaytonaError):
        sb.git.clone("/tmp/py-git/no-such-repo.git", "/tmp/py-git/never")


# --- preview links: a server inside the sandbox, reached on loopback through Nestbox ---


def test_preview_link_reaches_a_server_in_the_sandbox(sb):
    sb.process.exec("mkdir -p /tmp/py-site && echo preview-ok > /tmp/py-site/index.html")
    sb.process.exec("cd /tmp/py-site && (nohup python3 -m http.server 3111 --bind 0.0.0.0 >/dev/null 2>&1 &)")
    preview = sb.get_preview_link(3111)
    assert sb.id in preview.url and "3111" in preview.url
    assert preview.token

    def served():
        res = httpx.get(preview.url, headers={"X-Daytona-Preview-Token": preview.token})
        return res if res.status_code == 200 else None

    res = wait_until("the preview server", served, timeout=20)
    assert res.text == "preview-ok\n"
    # Without the token a private sandbox's port is refused.
    assert httpx.get(preview.url).status_code in (401, 403)

    signed = sb.create_signed_preview_url(3111, expires_in_seconds=60)
    via_signed = httpx.get(signed.url)
    assert via_signed.status_code == 200
    assert via_signed.text == "preview-ok\n"
