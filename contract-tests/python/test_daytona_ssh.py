"""SSH access with the real `daytona` Python SDK: create_ssh_access, validate_ssh_access,
revoke_ssh_access, and Debian's OpenSSH client running the `ssh_command` the SDK got.
(validate_ssh_access of a dead token is not called: the server answers sandboxId null, as
Daytona's does, which this SDK's model refuses to parse.)"""

import subprocess

import pytest
from daytona import CreateSandboxFromSnapshotParams, Daytona

SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]


def run_ssh_command(ssh_command, remote):
    words = ssh_command.split(" ")
    return subprocess.run([words[0], *SSH_OPTIONS, *words[1:], remote], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def sb():
    daytona = Daytona()
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True))
    yield sandbox
    daytona.delete(sandbox)


def test_ssh_access_runs_a_command_and_revoke_refuses_the_token(sb):
    access = sb.create_ssh_access(30)
    assert access.sandbox_id == sb.id
    assert len(access.token) == 32 and access.token.isalnum()
    assert access.ssh_command.endswith(f"{access.token}@127.0.0.1")
    ok = run_ssh_command(access.ssh_command, "echo ok; exit 7")
    assert (ok.returncode, ok.stdout) == (7, "ok\n"), ok.stderr
    validation = sb.validate_ssh_access(access.token)
    assert validation.valid is True and validation.sandbox_id == sb.id
    sb.revoke_ssh_access(access.token)
    refused = run_ssh_command(access.ssh_command, "echo no")
    assert refused.returncode == 255 and refused.stdout == ""
