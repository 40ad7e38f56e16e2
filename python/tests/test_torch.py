"""gpubuf.torch on CPU tensors through host pools (CI, no GPU): each scenario of
torch_worker.py runs in a fresh process against this test's gpubufd. Skipped,
with the reason, where PyTorch cannot be imported."""
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
             "versions", "readonly", "assign", "errors", "two_pools"]


def run_scenario(daemon, scenario, device, pool, timeout=600):
    r = subprocess.run([sys.executable, str(HERE / "torch_worker.py"), scenario, device, pool],
                       env=env_for(daemon), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    print(r.stdout)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and ("ok " + scenario) in r.stdout, r.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_torch_cpu(daemon, scenario):
    run_scenario(daemon, scenario, "cpu", "host")


@pytest.mark.parametrize("scenario", ["zero_copy", "killed", "versions", "readonly", "assign", "two_pools"])
def test_torch_cpu_other_pool(daemon, scenario):
    """The scenarios that name a buffer, in a pool that is not the daemon's
    default ("tiny"; "host" is): names are per pool, so every look-up of
    such a name says its pool, as on the GPU, where "vmm" is not the default."""
    run_scenario(daemon, scenario, "cpu", "tiny")
