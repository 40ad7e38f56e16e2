"""gpubuf.torch on CPU tensors through host pools (CI, no GPU): each scenario of
torch_worker.py runs in a fresh process against this test's gpubufd. Skipped,
with the reason, where PyTorch cannot be imported."""
import os
import signal
import subprocess
import sys

import pytest

from conftest import SRC, env_for

import importlib.util

if importlib.util.find_spec("torch") is None:  # pragma: no cover
    pytest.skip("PyTorch cannot be imported: install python3-torch (scripts/deps.sh does)",
                allow_module_level=True)

HERE = SRC / "python" / "tests"
SCENARIOS = ["queue", "zero_copy", "pool", "fork", "killed", "sender_exits", "lease", "sd_lease",
             "versions", "readonly", "assign", "errors", "two_pools", "as_tensor"]


def run_scenario(daemon, scenario, device, pool, timeout=600):
    """torch_worker.py SCENARIO in a session of its own: past the timeout the
    whole session (the scenario and the processes it spawned) is killed, so
    that nothing it left holds references for the next scenarios."""
    with subprocess.Popen([sys.executable, str(HERE / "torch_worker.py"), scenario, device, pool],
                          env=env_for(daemon), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            partial = e.output or ""
            if isinstance(partial, bytes):
                partial = partial.decode(errors="replace")
            pytest.fail("scenario %s did not end in %d s; its output:\n%s" %
                        (scenario, timeout, partial))
    print(out)
    if p.returncode == 3:
        pytest.skip(out.strip().splitlines()[-1])
    assert p.returncode == 0 and ("ok " + scenario) in out, out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_torch_cpu(daemon, scenario):
    run_scenario(daemon, scenario, "cpu", "host")


@pytest.mark.parametrize("scenario", ["zero_copy", "killed", "versions", "readonly", "assign", "two_pools"])
def test_torch_cpu_other_pool(daemon, scenario):
    """The scenarios that name a buffer, in a pool that is not the daemon's
    default ("tiny"; "host" is): names are per pool, so every look-up of
    such a name says its pool, as on the GPU, where "vmm" is not the default."""
    run_scenario(daemon, scenario, "cpu", "tiny")


def run_example(daemon, argv, expect, timeout=300):
    """An examples/python program against this test's gpubufd: exit status 0
    and `expect` in what it printed."""
    r = subprocess.run([sys.executable, str(SRC / "examples" / "python" / argv[0])] + argv[1:],
                       env=env_for(daemon), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    print(r.stdout)
    assert r.returncode == 0 and expect in r.stdout, r.stdout


def test_queue_example(daemon):
    """torch's own example with install() added (docs/torch.md), on CPU tensors:
    the consumer sums the producer's 1024 x 1024 ones."""
    run_example(daemon, ["torch_queue.py"], "sum 1048576")


def test_weight_sync_example_cpu(daemon):
    """The weight-sync example on CPU tensors through the host pool, its
    trainer SIGKILLed and restarted while two consumers run."""
    run_example(daemon, ["torch_weight_sync.py", "--device", "cpu", "--consumers", "2",
                         "--steps", "12", "--restart-at", "5", "--pool", "host"],
                "weight sync ok")


def test_state_dict_layout_from_index(daemon):
    """Buffers sealed without a layout, as a seal on a CUDA stream leaves
    them: open_state_dict gives each tensor the index's dtype and shape
    (0-d, empty and multi-dimensional tensors, every dtype)."""
    import json

    import torch

    import gpubuf
    import gpubuf.torch as gt

    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
          "scalar": torch.tensor(7, dtype=torch.int64),
          "empty": torch.zeros(0, 5, dtype=torch.float16),
          "mask": torch.tensor([True, False, True]),
          "bf": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
          "c": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64),
          "u8": torch.arange(5, dtype=torch.uint8)}
    with gpubuf.Client(daemon.socket) as c:
        names = ["noll/v0/%d" % i for i in range(len(sd))]
        bufs = c.alloc_many([max(t.numel() * t.element_size(), 1) for t in sd.values()], names,
                            "host")
        for b, t in zip(bufs, sd.values()):
            if t.numel():
                b.copy_from_host(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
            b.seal()
        c.release_many(bufs)
        index = json.dumps({"format": "gpubuf.torch.state_dict/1", "prefix": "noll", "version": 0,
                            "keys": list(sd), "names": names,
                            "dtypes": [gt._dtype_name(t.dtype) for t in sd.values()],
                            "shapes": [list(t.shape) for t in sd.values()]}).encode()
        ib = c.alloc(len(index), "noll/v0/index", "host")
        ib.copy_from_host(index)
        ib.seal()
        ib.release()
        got = gt.open_state_dict(c, "noll", version=0, pool="host")
        assert list(got) == list(sd)
        for k, t in sd.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
            assert torch.equal(got[k], t), k
        del got
        gt.delete_state_dict(c, "noll", 0, pool="host")
        c.flush()
        assert not [b for b in c.status()["buffers"] if b["name"].startswith("noll/")]
