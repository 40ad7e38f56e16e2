"""gpubuf.torch on CUDA tensors (labels gpu; CTest python_torch_gpu_ipc and
python_torch_gpu_vmm, a pool kind each, the examples with the pool they use): the
scenarios of torch_worker.py on a cuda-ipc and a cuda-vmm pool, and the
weight-sync example with three consumers. This process never initialises
CUDA: every scenario runs in fresh processes (spawn). Skipped without a GPU
usable by PyTorch."""
import subprocess
import sys

import pytest

from conftest import SRC, Daemon, env_for
from test_torch import run_scenario

pytestmark = [pytest.mark.gpu, pytest.mark.torch_gpu]
SCENARIOS = ["queue", "zero_copy", "pool", "killed", "sender_exits", "lease", "sd_lease", "versions",
             "readonly", "assign", "errors", "stream", "cai", "two_pools", "as_tensor"]


def _cuda_devices():
    r = subprocess.run([sys.executable, "-c",
                        "import torch; print(torch.cuda.device_count())"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return 0, (r.stderr.strip().splitlines() or ["import torch failed"])[-1]
    return int(r.stdout), "torch sees no CUDA device"


@pytest.fixture(scope="module")
def cuda_daemon(tmp_path_factory):
    n, why = _cuda_devices()
    if not n:
        pytest.skip(f"no GPU usable through PyTorch ({why})")
    d = Daemon(tmp_path_factory.mktemp("torchgpu"),
               ["gpu0=cuda-ipc,device=0,capacity=8G,slab=256M",
                "vmm=cuda-vmm,device=0,capacity=8G,slab=256M",
                "tiny=cuda-ipc,device=0,capacity=2M,slab=2M",
                "host=host,capacity=256M,slab=4M"])
    yield d
    d.stop()


@pytest.mark.parametrize("pool", ["gpu0", "vmm"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_torch_cuda(cuda_daemon, scenario, pool):
    # 150 s: a scenario that hangs fails alone, and the others still run
    # within a device call's 10 minutes.
    run_scenario(cuda_daemon, scenario, "cuda", pool, timeout=150)


def test_queue_example(cuda_daemon):
    """torch's own example with install() added, on a CUDA tensor (the GPU's pool)."""
    r = subprocess.run([sys.executable, str(SRC / "examples" / "python" / "torch_queue.py")],
                       env=env_for(cuda_daemon), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=150)
    print(r.stdout)
    assert r.returncode == 0 and "cuda:0 sum 1048576" in r.stdout, r.stdout


def test_weight_sync_example(cuda_daemon):
    r = subprocess.run([sys.executable, str(SRC / "examples" / "python" / "torch_weight_sync.py"),
                        "--consumers", "3", "--steps", "30", "--restart-at", "10",
                        "--pool", "vmm"],
                       env=env_for(cuda_daemon), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    print(r.stdout)
    assert r.returncode == 0 and "weight sync ok" in r.stdout, r.stdout
