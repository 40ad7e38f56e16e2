"""Producer and consumer in separate processes; crashes; fork."""
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gpubuf
from conftest import SRC, buffer_refs, env_for

EXAMPLES = SRC / "examples" / "python"


def test_examples_producer_then_consumer(daemon):
    env = env_for(daemon)
    # The consumer starts first and waits for the name.
    consumer = subprocess.Popen([sys.executable, str(EXAMPLES / "consumer.py"), "--name",
                                 "ex/frame", "--timeout", "20", "--delete"],
                                env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    out = subprocess.run([sys.executable, str(EXAMPLES / "producer.py"), "--name", "ex/frame",
                          "--size", "3M"], env=env, check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    assert "published 'ex/frame'" in out and "3145728 bytes, host memory" in out
    stdout, _ = consumer.communicate(timeout=30)
    assert consumer.returncode == 0, stdout
    assert "ex/frame: 3145728 bytes, 0 mismatches (checked in host memory)" in stdout
    with gpubuf.Client(daemon.socket) as c:  # --delete unpublished it
        with pytest.raises(FileNotFoundError):
            c.stat("ex/frame")


def test_consumer_detects_a_wrong_pattern(daemon):
    with gpubuf.Client(daemon.socket) as c:
        b = c.alloc(4096, "ex/wrong")
        b.seal(sync=True)  # zeros, not the pattern
        r = subprocess.run([sys.executable, str(EXAMPLES / "consumer.py"), "--name", "ex/wrong"],
                           env=env_for(daemon), stdout=subprocess.PIPE, text=True)
        assert r.returncode == 1 and "4080 mismatches" in r.stdout
        b.release()


def _child_writes(sock, name, value):
    with gpubuf.Client(sock) as c, c.open(name, timeout=10) as b:
        np.frombuffer(b, dtype=np.int64)[:] = value


def test_spawned_process_writes_what_the_parent_reads(client, daemon):
    b = client.alloc(8 * 1000, "mp/shared")
    b.seal()
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_child_writes, args=(daemon.socket, "mp/shared", 42))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert (np.frombuffer(b, dtype=np.int64) == 42).all()
    assert buffer_refs(client, "mp/shared") == 1  # the child's reference went with it
    b.release()


def _child_holds_and_hangs(sock, name, ready):
    c = gpubuf.Client(sock)
    b = c.open(name, timeout=10)
    arr = np.from_dlpack(b)  # noqa: F841 - an export alive when the process dies
    ready.set()
    time.sleep(60)


def test_killed_consumer_gives_its_references_back(client, daemon):
    b = client.alloc(4096, "mp/crash")
    b.seal()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_child_holds_and_hangs, args=(daemon.socket, "mp/crash", ready))
    p.start()
    assert ready.wait(120)
    assert buffer_refs(client, "mp/crash") == 2
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    for _ in range(6000):
        if buffer_refs(client, "mp/crash") == 1:
            break
        time.sleep(0.01)
    assert buffer_refs(client, "mp/crash") == 1
    b.release()


def test_forked_child_cannot_use_the_parents_connection(client, daemon):
    b = client.alloc(64, "fork/b")
    b.seal(sync=True)
    o = client.open("fork/b")
    arr = np.from_dlpack(o)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: every call on the inherited connection refuses
        code = 0
        try:
            for call in (client.status, lambda: client.open("fork/b"), lambda: o.seal()):
                try:
                    call()
                    code = 1
                except gpubuf.DisconnectedError as e:
                    if "fork" not in e.message:
                        code = 2
            # dropping inherited views sends nothing on the parent's socket
            o.release()
            del arr
            with gpubuf.Client(daemon.socket) as mine:  # a connection of its own works
                if mine.stat("fork/b")["refs"] != 2:
                    code = 3
        except BaseException:  # noqa: BLE001
            code = 4
        os.write(w, bytes([code]))
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    # The parent's stream is intact and its references unchanged.
    assert buffer_refs(client, "fork/b") == 2
    del arr
    o.release()
    b.release()
    client.flush()
    assert buffer_refs(client, "fork/b") == 0
