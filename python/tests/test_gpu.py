"""On a GPU (label gpu; skipped without one): a producer process writes with
CuPy and seals; consumer processes get the buffer zero-copy in CuPy (DLPack and
CUDA Array Interface), PyTorch (from_dlpack, as_tensor) and Numba; Arrow's
increment_by_one example runs on a buffer opened from another process. This
process never initialises CUDA: every GPU step runs in a process of its own."""
import subprocess
import sys

import pytest

import gpubuf
from conftest import SRC, Daemon, env_for

pytestmark = pytest.mark.gpu
HERE = SRC / "python" / "tests"
N = 1 << 18  # float32 elements: 1 MiB


def _gpu_count():
    r = subprocess.run([sys.executable, "-c",
                        "import cupy; print(cupy.cuda.runtime.getDeviceCount())"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return 0, r.stderr.strip().splitlines()[-1:] or ["cupy failed"]
    return int(r.stdout), None


@pytest.fixture(scope="module")
def gpu_daemon(tmp_path_factory):
    n, why = _gpu_count()
    if not n:
        pytest.skip(f"no GPU usable through CuPy ({why})")
    d = Daemon(tmp_path_factory.mktemp("gpu"), ["gpu0=cuda-ipc,device=0,capacity=4G,slab=64M",
                                                 "vmm=cuda-vmm,device=0,capacity=4G,slab=64M"])
    yield d
    d.stop()


def run(daemon, *args, timeout=180):
    r = subprocess.run([sys.executable, *map(str, args)], env=env_for(daemon),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    print(r.stdout)
    return r


@pytest.fixture(scope="module")
def produced(gpu_daemon):
    r = run(gpu_daemon, HERE / "gpu_worker.py", "produce", "gpu/frame", N)
    assert r.returncode == 0, r.stdout
    return "gpu/frame"


MODES = ["cupy_dlpack", "cupy_cai", "cupy_bytes", "cupy_buffer_cai", "torch_dlpack",
         "torch_as_tensor", "torch_outlives", "numba", "copies"]


@pytest.mark.parametrize("mode", MODES)
def test_consumer_in_another_process(gpu_daemon, produced, mode):
    r = run(gpu_daemon, HERE / "gpu_worker.py", "consume", produced, mode, N)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and f"ok {mode}" in r.stdout, r.stdout
    with gpubuf.Client(gpu_daemon.socket) as c:  # the consumer's references went
        assert c.stat(produced)["refs"] == 0


def test_increment_by_one_across_processes(gpu_daemon):
    r = run(gpu_daemon, SRC / "examples" / "python" / "increment_by_one.py")
    assert r.returncode == 0 and "[1 2 3 4]" in r.stdout, r.stdout
    if "Numba unavailable" in r.stdout:
        print("NOTE: Numba could not be imported; the kernel ran through CuPy")


def test_increment_by_one_through_cupy(gpu_daemon):
    r = run(gpu_daemon, SRC / "examples" / "python" / "increment_by_one.py", "--engine", "cupy",
            "--name", "arrow/inc-cupy")
    assert r.returncode == 0 and "(cupy)" in r.stdout and "[1 2 3 4]" in r.stdout, r.stdout


def test_examples_on_the_gpu(gpu_daemon):
    ex = SRC / "examples" / "python"
    r = run(gpu_daemon, ex / "producer.py", "--name", "gpu/example", "--size", "64M")
    assert r.returncode == 0 and "GPU 0" in r.stdout, r.stdout
    r = run(gpu_daemon, ex / "consumer.py", "--name", "gpu/example", "--delete")
    assert r.returncode == 0 and "0 mismatches (checked on GPU 0)" in r.stdout, r.stdout


def test_stream_ordered_hand_over_read_only(gpu_daemon):
    """A CuPy producer seals a cuda-vmm buffer on its stream while its kernel
    still runs; a torch consumer, already waiting, opens it read-only and reads
    it on its own stream, ordered by the seal event alone."""
    n = 1 << 20
    cons = subprocess.Popen([sys.executable, str(HERE / "gpu_worker.py"), "consume_stream",
                             "gpu/stream", str(n)], env=env_for(gpu_daemon),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = []
    for line in cons.stdout:  # torch is loaded and the open waits
        first.append(line)
        if line.startswith("waiting"):
            break
    r = run(gpu_daemon, HERE / "gpu_worker.py", "produce_stream", "gpu/stream", n)
    out, _ = cons.communicate(timeout=120)
    out = "".join(first) + out
    print(out)
    assert r.returncode == 0 and "kernel running" in r.stdout, r.stdout
    assert cons.returncode == 0 and "ok stream" in out, out
    with gpubuf.Client(gpu_daemon.socket) as c:
        assert c.stat("gpu/stream", pool="vmm")["refs"] == 0
        c.delete("/vmm/gpu/stream")


@pytest.mark.parametrize("producer,dtype", [("torch", "float16"), ("cupy", "float32")])
@pytest.mark.parametrize("consumer", ["torch", "cupy"])
def test_from_dlpack_gets_the_producers_dtype_and_shape(gpu_daemon, producer, dtype, consumer):
    """A producer publishes a typed (64, 32) array; torch.from_dlpack and
    cupy.from_dlpack of client.open(name) in another process get its dtype and
    shape, not bytes."""
    name = f"gpu/typed/{producer}/{consumer}"
    r = run(gpu_daemon, HERE / "gpu_worker.py", "produce_typed", name, producer)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, r.stdout
    r = run(gpu_daemon, HERE / "gpu_worker.py", "consume_typed", name, consumer, dtype)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and f"ok typed {consumer} {dtype}" in r.stdout, r.stdout
    with gpubuf.Client(gpu_daemon.socket) as c:
        st = c.stat(name)
        assert st["layout"]["shape"] == (64, 32) and st["refs"] == 0
        assert st["user_data"] == producer.encode()
        c.delete(name)



ASYNC_MANY = r"""
import asyncio, sys
import gpubuf

async def main(pool):
    with gpubuf.Client() as c, gpubuf.Client() as p:
        names = [f"gpu/many.{pool}.{i}" for i in range(64)]
        made = []
        def produce(i):
            b = p.alloc(4096, names[i], pool=pool)
            b.copy_from_host(bytes([i]) * 4096)
            b.seal()
            made.append(b)
        for i in range(32):  # half sealed before the start, half after
            produce(i)
        p.flush()
        t = asyncio.ensure_future(c.open_many_async([f"/{pool}/{n}" for n in names], timeout=60))
        await asyncio.sleep(0)
        c.status()  # the batch is answered and its waits started once dispatched
        for i in range(32, 64):
            produce(i)
        p.flush()
        got = await t
        for i, b in enumerate(got):
            assert not isinstance(b, Exception), (i, b)
            assert b.to_pybytes() == bytes([i]) * 4096, i
            b.release()
        for b in made:
            b.release()
    print("ok", pool)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("pool", ["gpu0", "vmm"])
def test_open_many_async_on_cuda_pools(gpu_daemon, pool):
    """open_many_async on cuda-ipc and cuda-vmm pools (IPC handles and fds in
    batch replies, waits for the items sealed after the start), in a process
    of its own."""
    r = subprocess.run([sys.executable, "-c", ASYNC_MANY, pool], env=env_for(gpu_daemon),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    print(r.stdout)
    assert r.returncode == 0 and f"ok {pool}" in r.stdout, r.stdout
