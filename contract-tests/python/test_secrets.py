"""Organisation secrets and runtime env changes through the real Python SDKs (issue 19):
`daytona.secret.*`, `create(secrets=...)`, `update_secrets`, `update_env`; E2B's `Secret`
module and `Secret.fill` as an env value. A value is never in an SDK answer."""

import uuid

from daytona import CreateSandboxFromSnapshotParams, CreateSecretParams, Daytona, UpdateSecretParams
from e2b import Sandbox, Secret


def test_daytona_secrets_and_update_env():
    daytona = Daytona()
    value = f"py-{uuid.uuid4().hex}"
    name = f"PY_SECRET_{uuid.uuid4().hex[:8]}"
    secret = daytona.secret.create(CreateSecretParams(name=name, value=value, hosts=["api.example.com"]))
    assert secret.name == name and secret.hosts == ["api.example.com"]
    assert value not in secret.model_dump_json()
    assert daytona.secret.get(secret.id).name == name
    assert name in [s.name for s in daytona.secret.list(name=name).items]
    sb = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, secrets={"TOKEN": name}))
    try:
        assert sb.process.exec('printf %s "$TOKEN"').result == value
        sb.update_secrets({"OTHER": name})
        assert sb.process.exec('printf "%s|%s" "${TOKEN-unset}" "$OTHER"').result == f"unset|{value}"
        sb.update_env({"MODE": "py"}, unset=["NOTHING"])
        assert sb.process.exec('printf %s "$MODE"').result == "py"
        daytona.secret.update(secret.id, UpdateSecretParams(description="changed"))
        assert daytona.secret.get(secret.id).description == "changed"
    finally:
        daytona.delete(sb)
        daytona.secret.delete(secret.id)


def test_e2b_secret_module_and_fill():
    value = f"py-{uuid.uuid4().hex}"
    name = f"py-secret-{uuid.uuid4().hex[:8]}"
    info = Secret.create(name, value)
    assert info.name == name and info.version == 1
    assert Secret.update(name, value + "2").version == 2
    assert Secret.get_info(info.secret_id).name == name
    assert Secret.exists(name)
    sbx = Sandbox.create(envs={"API_KEY": Secret.fill(name)}, allow_internet_access=False)
    try:
        assert sbx.commands.run('printf %s "$API_KEY"').stdout == value + "2"
    finally:
        sbx.kill()
    assert Secret.destroy(name) is True
    assert Secret.exists(name) is False
