"""Which CPU a benchmark ran on: ``cpu_identity`` from fake /proc/cpuinfo text (no processes, no MXNet runs)."""
from mxfp16.machine import cpuinfo, hardware

import pytest


def _cpuinfo(tmp_path, vendor, family, model, stepping, name, flags, processors=2):
    """A /proc/cpuinfo of ``processors`` identical blocks, as Linux writes it."""
    block = (f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: {name}\nstepping\t: {stepping}\nflags\t\t: {' '.join(flags)}\n\n")
    path = tmp_path / "cpuinfo"
    path.write_text("".join(block.format(n=n) for n in range(processors)))
    return str(path)


ZEN5_FLAGS = ["fpu", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"]
SPR_FLAGS = ["fpu", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_bf16", "amx_tile",
             "amx_int8", "avx512_fp16"]


def test_an_amd_zen5_epyc(tmp_path):
    cpu = hardware.cpu_identity(_cpuinfo(tmp_path, "AuthenticAMD", 26, 2, 0, "AMD EPYC 9575F 64-Core Processor",
                                         ZEN5_FLAGS))
    assert cpu == {"vendor": "AuthenticAMD", "model_name": "AMD EPYC 9575F 64-Core Processor", "family": 26,
                   "model": 2, "stepping": 0, "bfloat16_instructions": ["avx512_bf16"],
                   "microarchitecture": "Zen 5"}


def test_an_intel_sapphire_rapids(tmp_path):
    cpu = hardware.cpu_identity(_cpuinfo(tmp_path, "GenuineIntel", 6, 143, 8, "Intel(R) Xeon(R) Platinum 8480+",
                                         SPR_FLAGS))
    assert (cpu["family"], cpu["model"], cpu["stepping"]) == (6, 143, 8)
    assert cpu["microarchitecture"] == "Sapphire Rapids"
    assert cpu["bfloat16_instructions"] == ["avx512_bf16", "amx_bf16", "amx_tile"]  # not amx_int8 nor fp16


def test_a_vm_whose_model_the_table_does_not_know(tmp_path):
    """A VM's reported model may not be its host's: family 6 model 167 with AMX is no CPU the table names."""
    cpu = hardware.cpu_identity(_cpuinfo(tmp_path, "GenuineIntel", 6, 167, 1, "Intel(R) Xeon(R) Processor",
                                         SPR_FLAGS))
    assert cpu["microarchitecture"] is None
    assert cpu["bfloat16_instructions"] == ["avx512_bf16", "amx_bf16", "amx_tile"]
    assert "microarchitecture unknown" in hardware.describe_cpu(cpu)


@pytest.mark.parametrize("vendor, family, model, stepping, name", [
    ("GenuineIntel", 6, 0x55, 4, "Skylake SP"), ("GenuineIntel", 6, 0x55, 7, "Cascade Lake"),
    ("GenuineIntel", 6, 0x55, 11, "Cooper Lake"), ("GenuineIntel", 6, 0x55, 9, None),
    ("GenuineIntel", 6, 0xCF, 2, "Emerald Rapids"), ("GenuineIntel", 6, 0xAD, 1, "Granite Rapids"),
    ("AuthenticAMD", 0x19, 0x01, 1, "Zen 3"), ("AuthenticAMD", 0x19, 0x11, 1, "Zen 4"),
    ("AuthenticAMD", 0x19, 0x61, 2, "Zen 4"), ("AuthenticAMD", 0x1A, 0x44, 0, "Zen 5"),
    ("AuthenticAMD", 0x1A, 0x50, 0, None), ("AuthenticAMD", 6, 0x8F, 0, None),
])
def test_the_table_by_vendor_family_model_and_stepping(vendor, family, model, stepping, name):
    assert hardware.microarchitecture(vendor, family, model, stepping) == name


def test_without_cpuinfo_the_platform_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.platform, "processor", lambda: "arm")
    cpu = hardware.cpu_identity(str(tmp_path / "missing"))
    assert cpu == {"vendor": None, "model_name": "arm", "family": None, "model": None, "stepping": None,
                   "bfloat16_instructions": None, "microarchitecture": None}  # no flags to read: unknown
    assert hardware.describe_cpu(cpu) == "arm (microarchitecture unknown; bfloat16 instructions: unknown)"
    # Windows names family, model and stepping in its processor string.
    monkeypatch.setattr(hardware.platform, "processor", lambda: "Intel64 Family 6 Model 143 Stepping 8, GenuineIntel")
    cpu = hardware.cpu_identity(str(tmp_path / "missing"))
    assert (cpu["vendor"], cpu["family"], cpu["model"], cpu["stepping"]) == ("GenuineIntel", 6, 143, 8)
    assert cpu["microarchitecture"] == "Sapphire Rapids" and cpu["bfloat16_instructions"] is None
    assert cpuinfo.cpu_flags(str(tmp_path / "missing")) is None  # unknown, not an empty set


def test_the_older_readers_and_the_machine_record_use_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cpuinfo, "CPUINFO", _cpuinfo(tmp_path, "AuthenticAMD", 26, 2, 0, "AMD EPYC", ZEN5_FLAGS))
    assert hardware.cpu_model() == "AMD EPYC"
    assert cpuinfo.cpu_flags() == set(ZEN5_FLAGS)
    assert hardware.cpu_bfloat16_support() == {"avx512_bf16": True, "amx_bf16": False}
    machine = hardware.machine_summary()
    assert machine["cpu_model"] == "AMD EPYC"
    assert machine["cpu"]["family"] == 26 and machine["cpu"]["model"] == 2
    assert machine["cpu"]["microarchitecture"] == "Zen 5"
    assert hardware.describe_cpu(machine["cpu"]) == ("AMD EPYC (AuthenticAMD family 26 model 2, microarchitecture "
                                                     "Zen 5; bfloat16 instructions: avx512_bf16)")


def test_info_prints_and_records_the_cpu(tmp_path, monkeypatch):
    from mxfp16.commands import info

    monkeypatch.setattr(cpuinfo, "CPUINFO", _cpuinfo(tmp_path, "GenuineIntel", 6, 143, 8, "Xeon 8480+", SPR_FLAGS))
    report = info.collect()
    assert report["machine"]["cpu"]["microarchitecture"] == "Sapphire Rapids"
    line = next(l for l in info._text(report).splitlines() if l.startswith("CPU: "))
    assert line.startswith("CPU: Xeon 8480+ (GenuineIntel family 6 model 143, microarchitecture Sapphire Rapids; "
                           "bfloat16 instructions: avx512_bf16, amx_bf16, amx_tile), ")
    text = info._text(report)
    assert "  class: AMX (AMX bfloat16 tiles (amx_bf16, amx_tile) beside avx512_bf16)" in text.splitlines()
    assert report["machine"]["cpu_class"] == "AMX"


AVX512_CORE = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.mark.parametrize("flags, expected", [
    ({"sse4_2", "avx", "avx2", "fma"}, "AVX2"),                                 # Zen 1-3, laptops, VMs hiding AVX-512
    (AVX512_CORE | {"avx512_vnni"}, "AVX-512"),                                 # Skylake SP to Ice Lake
    (AVX512_CORE | {"avx512_bf16"}, "avx512_bf16"),                             # Cooper Lake, Zen 4, Zen 5
    (AVX512_CORE | {"avx512_bf16", "amx_bf16", "amx_tile"}, "AMX"),             # Sapphire / Emerald / Granite Rapids
    (AVX512_CORE | {"amx_tile"}, "AVX-512"),                                    # tiles without their bfloat16 multiply
    ({"avx512f", "avx2"}, "AVX2"),                                              # avx512f alone is not oneDNN's level
    ({"sse4_2"}, "other"),
    (set(), "other"),
])
def test_the_cpu_classes_by_flags(flags, expected):
    assert hardware.cpu_class(flags) == expected
    assert expected in hardware.CPU_CLASSES


def test_the_class_and_the_bfloat16_kind_agree_where_no_setting_intervenes():
    """One classification: the class decides the kind unless DNNL_MAX_CPU_ISA or MXNET_MKLDNN_ENABLED says otherwise."""
    kinds = {"AVX2": "none", "AVX-512": "emulated", "avx512_bf16": "native"}
    for flags in ({"avx2"}, AVX512_CORE, AVX512_CORE | {"avx512_bf16"}):
        assert hardware.bfloat16_support(flags, environ={}).kind == kinds[hardware.cpu_class(flags)]
    amx = AVX512_CORE | {"avx512_bf16", "amx_bf16", "amx_tile"}
    assert hardware.bfloat16_support(amx, environ={}, amx_state="in-use").kind == "amx"
    assert hardware.bfloat16_support(amx, environ={}, amx_state="refused").kind == "native"
    assert hardware.cpu_class(amx) == "AMX"
