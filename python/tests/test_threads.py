"""Threads: calls release the GIL, waits and releases run at once."""
import random
import threading
import time

import numpy as np
import pytest

import gpubuf
from conftest import buffer_refs


def test_waiting_open_releases_the_gil(client, daemon):
    got = {}

    def waiter():
        with gpubuf.Client(daemon.socket) as c:
            with c.open("t/late", timeout=10) as b:
                got["data"] = b.to_pybytes()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)  # the waiter blocks in the daemon meanwhile
    # This thread runs Python while the other waits: with the GIL held by the
    # waiting call, this loop and the seal below would never run.
    spins = 0
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        spins += 1
    b = client.alloc(4, "t/late")
    b.copy_from_host(b"late")
    b.seal()
    t.join(10)
    assert not t.is_alive() and got["data"] == b"late" and spins > 100
    b.release()


def test_waits_and_releases_at_once(client, daemon):
    """8 threads wait for names on connections of their own while 4 threads
    share one connection for alloc, seal, open, export and release."""
    n_waiters, n_workers, rounds = 8, 4, 40
    errors = []
    shared = gpubuf.Client(daemon.socket)

    def waiter(i):
        try:
            with gpubuf.Client(daemon.socket) as c:
                for r in range(5):
                    with c.open(f"t/w{i}/{r}", timeout=20) as b:
                        assert b.to_pybytes() == bytes([i, r]) * 4
                        arr = np.from_dlpack(b)
                    assert arr[0] == i
                    del arr
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def worker(k):
        try:
            for r in range(rounds):
                name = f"t/k{k}/{r}"
                b = shared.alloc(1024 + r, name)
                b.copy_from_host(bytes([k]) * 16)
                b.seal()
                o = shared.open(name)
                views = [o.slice(0, 16), memoryview(o), o.as_array("u1")]
                random.shuffle(views)
                o.release()
                assert np.asarray(views[0])[0] == k
                for v in views:
                    if isinstance(v, gpubuf.Buffer):
                        v.release()
                    elif isinstance(v, memoryview):
                        v.release()
                del views, v
                b.release()
                shared.delete(name)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(n_waiters)]
    threads += [threading.Thread(target=worker, args=(k,)) for k in range(n_workers)]
    for t in threads:
        t.start()
    producers = []
    for r in range(5):
        for i in range(n_waiters):
            b = client.alloc(8, f"t/w{i}/{r}")
            b.copy_from_host(bytes([i, r]) * 4)
            b.seal()
            producers.append(b)
        time.sleep(0.01)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for b in producers:
        b.release()
    client.flush()
    shared.flush()
    st = client.status()
    assert all(b["refs"] == 0 for b in st["buffers"]), st["buffers"]
    assert all(c["references"] == 0 for c in st["clients"])
    shared.close()


def test_release_while_another_thread_copies(client):
    for _ in range(20):
        b = client.alloc(1 << 20)
        stop = threading.Event()
        outcome = []

        def reader():
            try:
                while not stop.is_set():
                    b.copy_to_host(0, 1 << 20)
            except ValueError as e:  # released under it: a clean error
                outcome.append(str(e))

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.002)
        b.release()
        stop.set()
        t.join(10)
        assert not t.is_alive()
        assert outcome in ([], ["the gpubuf Buffer was released"])


def test_close_ends_a_wait_in_another_thread(daemon):
    c = gpubuf.Client(daemon.socket)
    result = []

    def waiter():
        try:
            c.open("t/never", timeout=float("inf"))
        except gpubuf.DisconnectedError as e:
            result.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    c.close()
    # The wait has no timeout of its own: only the close can end it (the
    # join's deadline is for a loaded machine, not a measure).
    t.join(60)
    assert not t.is_alive() and result
    assert c.closed


def test_waits_do_not_block_other_connections(client, daemon):
    """A waiting open occupies its own connection only."""
    c = gpubuf.Client(daemon.socket)
    ended = []

    def waiter():
        try:
            c.open("t/x", timeout=120)
        except gpubuf.DisconnectedError as e:  # the close below ends it
            ended.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    # Answered while the other connection still waits (its open gives up only
    # after 120 s): the wait held nothing but its own connection.
    for _ in range(20):
        client.status()
    assert t.is_alive()
    c.close()
    t.join(60)
    assert not t.is_alive() and ended
