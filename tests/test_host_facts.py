"""Train manifests and eval results record the processor they computed on (ratune.manifest.host_facts):
fp32 results on a CPU depend on the kernels torch and its BLAS pick for it, so a rerun that differs
from a committed result can be told apart from one on the same hardware
(docs/reproduction/README.md, "make reproduce from a fresh clone")."""

from __future__ import annotations

import platform

import torch

from ratune.manifest import host_facts

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx2

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
"""


def test_host_facts_read_the_first_processor_and_torch(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    torch.set_num_threads(1)
    facts = host_facts(info)
    assert facts == {"cpu": "AMD EPYC", "cpu_id": "cpu family 25, model 1, stepping 1",
                     "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_count": facts["cpu_count"],
                     "torch_threads": 1}
    assert isinstance(facts["cpu_count"], int) and facts["cpu_count"] >= 1


def test_host_facts_without_cpuinfo_fall_back_to_platform(tmp_path):
    facts = host_facts(tmp_path / "missing")
    assert facts["cpu"] == (platform.processor() or None) and facts["cpu_id"] is None
