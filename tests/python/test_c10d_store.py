"""The symmetric heap reads torch's store through symmpool's C10dStore. A
key that comes late and a store that is gone are different failures: the
first names the late rank (the heap's "rank r never arrived"), the second
must blame no rank. It used to call a dead TCPStore server a timeout."""

import datetime
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

import symmpool

SERVER = ("import time, torch.distributed as d; "
          "s = d.TCPStore('127.0.0.1', 0, 2, True, wait_for_workers=False); print(s.port, flush=True); time.sleep(120)")


@pytest.fixture
def server_and_client():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=10))
        yield server, client
    finally:
        server.kill()
        server.wait()


def test_a_key_is_read_as_the_heap_reads_it(server_and_client):
    _, client = server_and_client
    client.set("here", "a value")
    assert symmpool._C._store_get(client, "here", 1000) == "a value"


def test_a_late_key_is_a_timeout_naming_the_key(server_and_client):
    _, client = server_and_client
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"waiting 300 ms for store key 'late' failed"):
        symmpool._C._store_get(client, "late", 300)
    assert time.monotonic() - start >= 0.25


def test_a_gone_store_is_a_store_failure_not_a_timeout(server_and_client):
    server, client = server_and_client
    server.kill()
    server.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the store failed while waiting 5000 ms for key 'late' "
                                           r"\(its server may be gone\)") as raised:
        symmpool._C._store_get(client, "late", 5000)
    assert "failed:" not in str(raised.value).split("(its server")[0], str(raised.value)
    assert time.monotonic() - start < 4.0, "the failure waited for the timeout"
