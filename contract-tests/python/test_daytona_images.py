"""The real `daytona` Python SDK (sync client) building an image snapshot on Nestbox:
`daytona.snapshot.create(CreateSnapshotParams(name, image=Image...), on_logs=...)`, then
`daytona.create` from that snapshot; and `daytona.create` from an `Image`, built on demand. The base is Nestbox's `default` image, so the build needs
no registry and no network. No local files: the Python SDK uploads contexts with obstore, which
refuses a plain-HTTP storageUrl (BadScheme) and this test server speaks HTTP (COVERAGE.md)."""

import uuid

import pytest
from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, CreateSnapshotParams, Daytona, DaytonaNotFoundError, Image


@pytest.fixture(scope="module")
def daytona():
    return Daytona()


def test_snapshot_create_from_an_image_then_create_from_it(daytona):
    name = f"py-img-{uuid.uuid4().hex[:8]}"
    image = (
        Image.base("default")
        .run_commands("echo built-by-python > /py-built.txt", "mkdir -p /srv && echo from python > /srv/hello.txt")
        .env({"PY_IMAGE": "yes please"})
        .workdir("/srv")
    )
    logs = []
    snapshot = daytona.snapshot.create(CreateSnapshotParams(name=name, image=image), on_logs=logs.append)
    assert snapshot.state == "active"
    assert snapshot.name == name
    text = "\n".join(logs)
    assert f"Creating snapshot {name}" in text
    assert "RUN echo built-by-python" in text
    assert f"Created snapshot {name}" in text
    assert daytona.snapshot.get(name).id == snapshot.id
    assert name in [s.name for s in daytona.snapshot.list().items]

    sandbox = daytona.create(CreateSandboxFromSnapshotParams(snapshot=name, network_block_all=True))
    try:
        assert sandbox.snapshot == name
        result = sandbox.process.exec('cat /py-built.txt /srv/hello.txt; echo "$PY_IMAGE"; pwd')
        assert result.result == "built-by-python\nfrom python\nyes please\n/srv\n"
    finally:
        daytona.delete(sandbox)
    daytona.snapshot.delete(daytona.snapshot.get(name))
    with pytest.raises(DaytonaNotFoundError):
        daytona.snapshot.get(name)


def test_create_from_an_image_builds_on_demand(daytona):
    image = Image.base("default").run_commands("echo on-demand from python > /od.txt")
    logs = []
    sandbox = daytona.create(
        CreateSandboxFromImageParams(image=image, network_block_all=True), timeout=0, on_snapshot_create_logs=logs.append
    )
    try:
        assert sandbox.state == "started"
        assert "RUN echo on-demand from python" in "\n".join(logs)
        # The SDK's toolbox client keeps the id the create answered (the pending one): it still works.
        assert sandbox.process.exec("cat /od.txt").result == "on-demand from python\n"
    finally:
        daytona.delete(sandbox)
