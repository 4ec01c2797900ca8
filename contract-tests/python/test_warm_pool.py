"""Daytona's warm pools through the real Python SDK (issue 20): `daytona.warm_pool` list, create,
update and delete over an organisation's own pool of the default snapshot; the pool fills to
`pool` (current_size), a create of the snapshot is answered while it is full, a second pool for
the same snapshot and region is a 409, `pool=0` drains, an unknown id is a 404."""

import time

import pytest
from daytona import CreateSandboxFromSnapshotParams, Daytona


def status_of(err: BaseException) -> int | None:
    """The HTTP status of the SDK's error, whichever form it takes (the generated client's
    ApiException, or a DaytonaError the SDK translated it into)."""
    return getattr(err, "status", None) or getattr(err, "status_code", None)


def wait_for_size(daytona: Daytona, pool_id: str, size: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if next(p for p in daytona.warm_pool.list() if p.id == pool_id).current_size == size:
            return
        time.sleep(0.2)
    raise AssertionError(f"warm pool {pool_id} never reached current_size {size}")


def test_daytona_warm_pool_crud_and_claim():
    daytona = Daytona()
    pool = daytona.warm_pool.create("default", pool=1)
    try:
        assert pool.snapshot == "default" and pool.pool == 1 and pool.os_user == "daytona" and pool.env == {}
        assert pool.id in [p.id for p in daytona.warm_pool.list()]
        with pytest.raises(Exception) as conflict:
            daytona.warm_pool.create("default", pool=1)
        assert status_of(conflict.value) == 409
        with pytest.raises(Exception) as bad:
            # More than an organisation may keep warm (NESTBOX_ORG_WARM_POOL_MAX, 10 by default).
            daytona.warm_pool.update(pool.id, pool=1000)
        assert status_of(bad.value) == 400 and "pool" in str(bad.value)
        wait_for_size(daytona, pool.id, 1)
        sb = daytona.create(CreateSandboxFromSnapshotParams(snapshot="default"))
        try:
            # A claimed sandbox is an ordinary one (Daytona sets warm_pool_id only on unclaimed members).
            assert sb.warm_pool_id is None
            assert sb.process.exec("echo warm").result.strip() == "warm"
        finally:
            daytona.delete(sb)
        assert daytona.warm_pool.update(pool.id, pool=0).pool == 0
        wait_for_size(daytona, pool.id, 0)
    finally:
        daytona.warm_pool.delete(pool.id)
    assert pool.id not in [p.id for p in daytona.warm_pool.list()]
    with pytest.raises(Exception) as missing:
        daytona.warm_pool.delete(pool.id)
    assert status_of(missing.value) == 404
