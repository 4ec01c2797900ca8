"""Volumes through the real Python SDKs: e2b's `Volume` (create, its file calls with no sandbox
running, `volume_mounts` on `Sandbox.create`, destroy) and daytona's `daytona.volume` with
`volumes=[VolumeMount(...)]` on create. Two sandboxes share a volume and see each other's
writes, the volume outlives both, deleting a mounted volume is refused. The e2b content calls go
to E2B_VOLUME_API_URL (pytest.test.ts points it at the server's /e2b)."""

import uuid

import pytest
from daytona import CreateSandboxFromSnapshotParams, Daytona, DaytonaError, DaytonaNotFoundError, VolumeMount
from e2b import Sandbox, Volume, VolumeException, VolumeNotFoundException


def test_e2b_volume_files_and_two_sandboxes_sharing_it():
    name = f"py-{uuid.uuid4().hex[:12]}"
    vol = Volume.create(name)
    try:
        assert vol.name == name
        assert name in [v.name for v in Volume.list()]
        stat = vol.write_file("/dir/hello.txt", "from python\n", force=True)
        assert stat.name == "hello.txt" and stat.size == 12
        assert vol.read_file("/dir/hello.txt") == "from python\n"
        assert [e.name for e in vol.list("/")] == ["dir"]
        a = Sandbox.create(allow_internet_access=False, volume_mounts={"/mnt/v": vol})
        b = Sandbox.create(allow_internet_access=False, volume_mounts={"/data": name})
        try:
            assert a.files.read("/mnt/v/dir/hello.txt") == "from python\n"
            b.files.write("/data/from-b.txt", "from b\n")
            assert a.commands.run("cat /mnt/v/from-b.txt").stdout == "from b\n"
            with pytest.raises(VolumeException):
                Volume.destroy(vol.volume_id)
        finally:
            a.kill()
            b.kill()
        # It outlives both sandboxes.
        assert Volume.connect(vol.volume_id).read_file("/from-b.txt") == "from b\n"
    finally:
        assert Volume.destroy(vol.volume_id) is True
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)


def test_daytona_volume_shared_by_two_sandboxes():
    daytona = Daytona()
    name = f"py-{uuid.uuid4().hex[:12]}"
    volume = daytona.volume.get(name, create=True)
    assert volume.state == "ready"
    a = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, volumes=[VolumeMount(volume_id=volume.id, mount_path="/home/daytona/v")]))
    b = daytona.create(CreateSandboxFromSnapshotParams(network_block_all=True, volumes=[VolumeMount(volume_id=name, mount_path="/mnt/v", subpath="sub")]))
    try:
        a.fs.upload_file(b"from a\n", "/home/daytona/v/sub/a.txt")
        assert b.fs.download_file("/mnt/v/a.txt") == b"from a\n"
        with pytest.raises(DaytonaError):
            daytona.volume.delete(volume)
    finally:
        daytona.delete(a)
        daytona.delete(b)
    daytona.volume.delete(volume)
    with pytest.raises(DaytonaNotFoundError):
        daytona.volume.get(name)
