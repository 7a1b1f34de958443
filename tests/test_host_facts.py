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
microcode\t: 0x1000065
flags\t\t: fpu avx2
bogomips\t: 4890.81

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
"""


def _sysfs(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        index = root / "cache" / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(value + "\n")
    return root


def test_host_facts_read_the_first_processor_its_caches_and_torch(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    sysfs = _sysfs(tmp_path / "cpu0", [("1", "Data", "32K"), ("1", "Instruction", "32K"), ("2", "Unified", "512K"),
                                       ("3", "Unified", "32768K")])
    torch.set_num_threads(1)
    facts = host_facts(info, sysfs)
    # the flags "fpu avx2" sorted: "avx2 fpu"; `printf 'avx2 fpu' | sha256sum` starts ca90b3def4ced0a2
    assert facts == {"cpu": "AMD EPYC", "cpu_id": "cpu family 25, model 1, stepping 1", "microcode": "0x1000065",
                     "bogomips": "4890.81", "flags_sha256": "ca90b3def4ced0a2",
                     "caches": {"L1d": "32K", "L1i": "32K", "L2": "512K", "L3": "32768K"},
                     "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_count": facts["cpu_count"],
                     "torch_threads": 1}
    assert isinstance(facts["cpu_count"], int) and facts["cpu_count"] >= 1


def test_host_facts_flag_digest_ignores_order_and_tells_sets_apart(tmp_path):
    digests = []
    for flags in ("fpu avx2", "avx2  fpu", "fpu avx2 avx512f"):
        info = tmp_path / "cpuinfo"
        info.write_text(f"model name\t: X\nflags\t\t: {flags}\n")
        digests.append(host_facts(info, tmp_path / "none")["flags_sha256"])
    assert digests[0] == digests[1] != digests[2]


def test_host_facts_without_cpuinfo_fall_back_to_platform(tmp_path):
    facts = host_facts(tmp_path / "missing", tmp_path / "missing_sysfs")
    assert facts["cpu"] == (platform.processor() or None) and facts["cpu_id"] is None
    assert (facts["microcode"], facts["bogomips"], facts["flags_sha256"], facts["caches"]) == (None,) * 4


def test_host_facts_skip_a_cache_entry_they_cannot_read(tmp_path):
    sysfs = _sysfs(tmp_path / "cpu0", [("2", "Unified", "512K")])
    (sysfs / "cache" / "index1").mkdir()  # no level/type/size files
    assert host_facts(tmp_path / "missing", sysfs)["caches"] == {"L2": "512K"}
