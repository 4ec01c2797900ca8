"""The real `e2b` Python SDK's synchronous client (`from e2b import Sandbox`) against Nestbox:
lifecycle, commands, PTY, files, watch, signed URLs and the SDK's error classes. Paths are
absolute under /tmp, so nothing depends on the sandbox's default user or home."""

import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileType,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from conftest import wait_until


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(allow_internet_access=False, timeout=600, envs={"FROM_SANDBOX": "sandbox-env"})
    yield sandbox
    sandbox.kill()


# --- lifecycle ---


def test_create_get_info_list_connect_set_timeout_and_kill():
    tag = uuid.uuid4().hex
    sandbox = Sandbox.create(allow_internet_access=False, timeout=300, metadata={"suite": "python-sync", "tag": tag})
    try:
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"suite": "python-sync", "tag": tag}
        assert info.end_at - info.started_at == timedelta(seconds=300)
        assert sandbox.is_running()

        page = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert [s.sandbox_id for s in page] == [sandbox.sandbox_id]
        assert page[0].metadata["suite"] == "python-sync"
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING], metadata={"tag": tag})).next_items()
        assert [s.sandbox_id for s in running] == [sandbox.sandbox_id]

        # A second handle on the same sandbox sees the same machine.
        sandbox.files.write("/tmp/connect-marker", tag)
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.files.read("/tmp/connect-marker") == tag

        # set_timeout moves the end to now + timeout.
        before = datetime.now(timezone.utc)
        sandbox.set_timeout(900)
        end_at = sandbox.get_info().end_at
        assert before + timedelta(seconds=890) <= end_at <= datetime.now(timezone.utc) + timedelta(seconds=910)

        sandbox.kill()
        assert not sandbox.is_running()
        assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sandbox.sandbox_id)
        # Killing what is gone answers False, not an error.
        assert Sandbox.kill(sandbox.sandbox_id) is False
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_connect_to_an_unknown_sandbox_raises_not_found():
    with pytest.raises(NotFoundException):
        Sandbox.connect("nosuchsandbox0000000")


def test_a_wrong_api_key_raises_authentication_exception():
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40, allow_internet_access=False)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 40).next_items()


# --- commands ---


def test_run_with_cwd_envs_and_output_callbacks(sbx):
    out, err = [], []
    result = sbx.commands.run(
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


def test_non_zero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo partial; echo bad >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "partial\n"
    assert caught.value.stderr == "bad\n"


def test_command_timeout_raises_timeout_exception(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    wait_until("the timed-out command to be gone", lambda: not any("sleep 30" in " ".join(p.args) for p in sbx.commands.list()), timeout=10)


def test_background_command_list_stdin_and_kill(sbx):
    handle = sbx.commands.run("cat", background=True, stdin=True)
    assert handle.pid > 0
    listed = [p for p in sbx.commands.list() if p.pid == handle.pid]
    assert len(listed) == 1 and listed[0].args[-1] == "cat"

    seen = []
    attached = sbx.commands.connect(handle.pid)
    sbx.commands.send_stdin(handle.pid, "hello stdin\n")
    for stdout, _, _ in attached:
        if stdout:
            seen.append(stdout)
        if "hello stdin\n" in "".join(seen):
            break
    assert "".join(seen) == "hello stdin\n"

    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code == 137
    assert sbx.commands.kill(handle.pid) is False
    assert all(p.pid != handle.pid for p in sbx.commands.list())


def test_close_stdin_ends_a_reader(sbx):
    handle = sbx.commands.run("wc -c", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "12345")
    handle.close_stdin()
    assert handle.wait().stdout.strip() == "5"


# --- pty ---


def test_pty_runs_an_interactive_shell_and_resizes(sbx):
    chunks = []
    handle = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"PTY_VAR": "in-pty"})
    sbx.pty.resize(handle.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(handle.pid, b"stty size; echo $PTY_VAR; pwd; tty; exit 7\n")
    with pytest.raises(CommandExitException) as caught:
        handle.wait(on_pty=chunks.append)
    assert caught.value.exit_code == 7
    text = b"".join(chunks).decode()
    assert "40 100" in text
    assert "in-pty" in text
    assert "/tmp\r\n" in text
    assert "/dev/pts/" in text


def test_pty_kill(sbx):
    handle = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert sbx.pty.kill(handle.pid) is False


# --- files ---


def test_write_and_read_text_bytes_and_stream(sbx):
    info = sbx.files.write("/tmp/py-sync/files/hello.txt", "hello world")
    assert info.path == "/tmp/py-sync/files/hello.txt"
    assert info.name == "hello.txt"
    assert sbx.files.read("/tmp/py-sync/files/hello.txt") == "hello world"

    payload = bytes(range(256)) * 64
    sbx.files.write("/tmp/py-sync/files/blob.bin", payload)
    assert sbx.files.read("/tmp/py-sync/files/blob.bin", format="bytes") == payload
    assert b"".join(sbx.files.read("/tmp/py-sync/files/blob.bin", format="stream")) == payload


def test_write_files_list_stat_exists_make_dir_rename_remove(sbx):
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    base = "/tmp/py-sync/tree"
    sbx.files.write_files([WriteEntry(path=f"{base}/a.txt", data="aaa"), WriteEntry(path=f"{base}/sub/b.txt", data=b"bb")])
    assert sbx.files.make_dir(f"{base}/empty") is True
    assert sbx.files.make_dir(f"{base}/empty") is False

    entries = {e.name: e for e in sbx.files.list(base)}
    assert set(entries) == {"a.txt", "sub", "empty"}
    assert entries["a.txt"].type == FileType.FILE and entries["a.txt"].size == 3
    assert entries["sub"].type == FileType.DIR
    deep = {e.path for e in sbx.files.list(base, depth=2)}
    assert f"{base}/sub/b.txt" in deep

    stat = sbx.files.get_info(f"{base}/a.txt")
    assert (stat.name, stat.path, stat.type, stat.size) == ("a.txt", f"{base}/a.txt", FileType.FILE, 3)
    assert stat.permissions == "-rw-r--r--"

    assert sbx.files.exists(f"{base}/a.txt") is True
    assert sbx.files.exists(f"{base}/missing") is False

    moved = sbx.files.rename(f"{base}/a.txt", f"{base}/renamed.txt")
    assert moved.path == f"{base}/renamed.txt"
    assert sbx.files.read(f"{base}/renamed.txt") == "aaa"
    assert sbx.files.exists(f"{base}/a.txt") is False

    sbx.files.remove(f"{base}/sub")
    assert sbx.files.exists(f"{base}/sub") is False


def test_missing_files_raise_not_found(sbx):
    with pytest.raises(NotFoundException):
        sbx.files.read("/tmp/py-sync/does-not-exist")
    with pytest.raises(NotFoundException):
        sbx.files.get_info("/tmp/py-sync/does-not-exist")
    with pytest.raises(NotFoundException):
        sbx.files.list("/tmp/py-sync/does-not-exist")


def test_watch_dir_reports_created_and_removed_files(sbx):
    sbx.files.make_dir("/tmp/py-sync/watched")
    handle = sbx.files.watch_dir("/tmp/py-sync/watched")
    try:
        sbx.files.write("/tmp/py-sync/watched/new.txt", "x")
        sbx.files.remove("/tmp/py-sync/watched/new.txt")
        events = []

        def removed():
            events.extend(handle.get_new_events())
            return any(e.type == FilesystemEventType.REMOVE for e in events)

        wait_until("a REMOVE event", removed, timeout=15)
        assert {e.name for e in events} == {"new.txt"}
        assert FilesystemEventType.CREATE in {e.type for e in events}
    finally:
        handle.stop()


# --- signed URLs (a secure sandbox signs its file URLs with its access token) ---


def test_signed_upload_and_download_urls(sbx):
    upload_url = sbx.upload_url("/tmp/py-sync/signed/up.txt", use_signature_expiration=60)
    assert "signature=" in upload_url
    up = httpx.post(upload_url, files={"file": ("up.txt", b"signed upload")})
    assert up.status_code == 200, up.text

    download_url = sbx.download_url("/tmp/py-sync/signed/up.txt")
    down = httpx.get(download_url)
    assert down.status_code == 200
    assert down.content == b"signed upload"

    # The signature covers the path: another path with the same signature is refused.
    tampered = httpx.get(download_url.replace("up.txt", "other.txt"))
    assert tampered.status_code == 401
    # A signature past its expiration is refused.
    expired = httpx.get(sbx.download_url("/tmp/py-sync/signed/up.txt", use_signature_expiration=-10))
    assert expired.status_code == 401


def test_envd_calls_without_the_access_token_are_refused(sbx):
    # What the SDK sends to reach a sandbox through one server (sandbox_url), less the token.
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    url = f"{sbx.envd_api_url}/files?path=/tmp/py-sync/signed/up.txt"
    assert httpx.get(url, headers=headers).status_code == 401
    assert httpx.get(url, headers={**headers, "X-Access-Token": "wrong"}).status_code == 401


# --- git (the SDK's git module, deprecated but shipped, runs git through commands; the remote is
# a bare repository in the same sandbox: no network) ---


def test_git_init_commit_push_clone_and_branches(sbx):
    remote, work, clone = "/tmp/py-e2b-git/remote.git", "/tmp/py-e2b-git/work", "/tmp/py-e2b-git/clone"
    sbx.git.init(remote, bare=True, initial_branch="main")
    sbx.git.init(work, initial_branch="main")
    sbx.git.remote_add(work, "origin", remote)
    assert sbx.git.remote_get(work, "origin") == remote
    sbx.files.write(f"{work}/a.txt", "one\n")
    sbx.git.add(work)
    sbx.git.commit(work, "first", author_name="Ada", author_email="ada@example.com")
    sbx.git.push(work, remote="origin", branch="main")
    status = sbx.git.status(work)
    assert status.current_branch == "main"
    assert status.file_status == []

    sbx.git.clone(remote, clone, branch="main")
    assert sbx.files.read(f"{clone}/a.txt") == "one\n"
    assert sbx.commands.run(f"git -C {clone} log --format='%an %s'").stdout == "Ada first\n"
    sbx.git.create_branch(work, "feature")
    branches = sbx.git.branches(work)
    assert sorted(branches.branches) == ["feature", "main"]
    assert branches.current_branch == "feature"
