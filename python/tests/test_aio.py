"""asyncio: open_async, alloc_async, seal_async on one event loop through the
client's fd (issue 23): cancellation, wait_for, TaskGroup, 10,000 awaits, no
thread per request."""
import asyncio
import os
import random
import threading

import pytest

import gpubuf
from conftest import buffer_refs


def threads():
    """Threads of this process, from the kernel (Python's count misses C ones)."""
    return len(os.listdir("/proc/self/task"))


def settled(client):
    """A round trip on the same connection: the daemon handled (in order)
    every request started before it, so those opens wait now."""
    client.status()


def produce(client, name, data):
    b = client.alloc(len(data), name, pool="host")
    b.copy_from_host(data)
    b.seal()
    client.flush()
    return b


def test_open_alloc_seal_async(daemon):
    async def main():
        with gpubuf.Client(daemon.socket) as c:
            waiter = asyncio.ensure_future(c.open_async("aio/a"))
            b = await c.alloc_async(16, "aio/a", pool="host")
            b.copy_from_host(b"x" * 16)
            assert await c.seal_async(b) is None
            got = await waiter
            assert got.name == "aio/a" and got.to_pybytes() == b"x" * 16
            with pytest.raises(gpubuf.NotFoundError):
                await c.open_async("aio/none", timeout=0)
            with pytest.raises(gpubuf.WaitTimeoutError):
                await c.open_async("aio/none", timeout=0.05)
            got.release()
            b.release()

    asyncio.run(main())


def test_cancel_and_wait_for_release_everything(daemon):
    async def main():
        with gpubuf.Client(daemon.socket) as c:
            t = asyncio.ensure_future(c.open_async("aio/c"))
            await asyncio.sleep(0)
            settled(c)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.open_async("aio/c"), 0.05)
            # The daemon dropped both waits: a seal now wakes nobody, the
            # producer's view is the only reference.
            p = produce(c, "aio/c", b"y" * 8)
            settled(c)
            assert buffer_refs(c, "aio/c") == 1
            # A cancel that races the open's answer: the view it got goes back.
            f = asyncio.ensure_future(c.open_async("aio/c"))
            await asyncio.sleep(0)
            settled(c)  # answered meanwhile, read by this call, not delivered
            f.cancel()
            await asyncio.sleep(0)
            c._dispatch()
            p.release()
            c.flush()
            assert buffer_refs(c, "aio/c") == 0

    asyncio.run(main())


def test_taskgroup(daemon):
    async def main():
        with gpubuf.Client(daemon.socket) as c, gpubuf.Client(daemon.socket) as p:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(c.open_async(f"aio/tg.{i}", timeout=30)) for i in range(50)]
                await asyncio.sleep(0)
                for i in range(50):
                    produce(p, f"aio/tg.{i}", bytes([i]) * 4).release()
            for i, t in enumerate(tasks):
                assert t.result().to_pybytes() == bytes([i]) * 4
                t.result().release()
            # One failure cancels the rest, and their waits go.
            with pytest.raises(ExceptionGroup):
                async with asyncio.TaskGroup() as tg:
                    for i in range(20):
                        tg.create_task(c.open_async(f"aio/never.{i}"))
                    tg.create_task(c.open_async("aio/none", timeout=0))
            settled(c)
            for i in range(20):  # their waits went: a seal wakes nobody
                produce(p, f"aio/never.{i}", b"z").release()
                settled(c)
                assert buffer_refs(c, f"aio/never.{i}") == 0

    asyncio.run(main())


def test_open_many_async(daemon):
    async def main():
        with gpubuf.Client(daemon.socket) as c, gpubuf.Client(daemon.socket) as p:
            names = [f"aio/many.{i}" for i in range(40)]
            for i in range(20):  # half sealed before, half after the start
                produce(p, names[i], bytes([i]) * 8).release()
            t = asyncio.ensure_future(c.open_many_async(names + ["/nopool/x"], timeout=30))
            await asyncio.sleep(0)
            for i in range(20, 40):
                produce(p, names[i], bytes([i]) * 8).release()
            got = await t
            assert len(got) == 41 and isinstance(got[40], gpubuf.Error)
            for i, b in enumerate(got[:40]):
                assert b.name == names[i] and b.to_pybytes() == bytes([i]) * 8
                b.release()
            # By id, no waiting: an unknown id fails alone.
            q = produce(p, "aio/many.id", b"q" * 4)
            got = await c.open_many_async([q.id, 999999], timeout=0, readonly=True)
            assert got[0].to_pybytes() == b"q" * 4 and isinstance(got[1], gpubuf.NotFoundError)
            got[0].release()
            q.release()
            # Cancelled while items wait: the waits and the views go.
            t = asyncio.ensure_future(c.open_many_async([names[0], "aio/many.never"]))
            await asyncio.sleep(0)
            settled(c)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(t, 0.2)
            settled(c)  # the daemon ended the wait; its answer was read by this call
            c._dispatch()  # the batch completes: its view goes back
            c.flush()
            assert buffer_refs(c, names[0]) == 0

    asyncio.run(main())


def test_ten_thousand_awaits_on_one_loop(daemon):
    n = 10000

    async def main():
        with gpubuf.Client(daemon.socket) as c, gpubuf.Client(daemon.socket) as p:
            before = threads()
            futs = [c.open_async(f"aio/n.{i}") for i in range(n)]
            assert threads() == before
            order = list(range(n))
            random.Random(23).shuffle(order)

            def seal_all():  # the producer, elsewhere
                for i in order:
                    produce(p, f"aio/n.{i}", i.to_bytes(4, "little")).release()

            t = threading.Thread(target=seal_all)
            t.start()
            got = await asyncio.gather(*futs)
            t.join()
            for i, b in enumerate(got):
                assert b.name == f"aio/n.{i}"
                assert int.from_bytes(b.to_pybytes(), "little") == i
                b.release()
            assert threads() == before
            c.flush()
            assert all(b["refs"] == 0 for b in c.status()["buffers"])

    asyncio.run(main())


def test_daemon_killed_fails_every_await(tmp_path):
    from conftest import Daemon, HOST_POOLS

    d = Daemon(tmp_path, HOST_POOLS)

    async def main():
        c = gpubuf.Client(d.socket)
        futs = [c.open_async(f"aio/k.{i}") for i in range(500)]
        settled(c)
        d.proc.kill()
        d.proc.wait()
        res = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, gpubuf.Error) for r in res)
        c.close()

    try:
        asyncio.run(main())
    finally:
        d.stop()
