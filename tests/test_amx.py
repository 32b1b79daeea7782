"""AMX for MXNet's oneDNN: the tile-state request against a stand-in for Linux's arch_prctl.

No machine here has AMX, so the request is exercised against a stand-in that
answers as a kernel does (granted, unsupported, refused, a small signal
stack); the real syscall layer is checked on this CPU, which has no AMX.
"""
import errno
import os
import subprocess
import sys

from mxfp16.machine import amx, cpuinfo, hardware

import pytest
from conftest import REPO

AMX_CPU = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_bf16", "amx_tile"}
TILE = 1 << amx.XFEATURE_XTILEDATA
LINUX = "Linux x86_64"


class Kernel:
    """A stand-in for the three arch_prctl calls, as Linux 5.16+ answers them."""

    def __init__(self, supported=0xe7 | TILE, granted=0xe7, refuse=0, small_stack=False, confirm=True):
        self.supported, self.granted, self.refuse = supported, granted, refuse
        self.small_stack, self.confirm = small_stack, confirm
        self.calls = []

    def get_mask(self, code):
        self.calls.append(hex(code))
        if self.supported is None:
            return None, errno.EINVAL  # before Linux 5.16: no such arch_prctl code
        return (self.supported if code == amx.ARCH_GET_XCOMP_SUPP else self.granted), 0

    def request(self, feature):
        self.calls.append(("request", feature))
        if self.small_stack:
            return errno.ENOSPC
        if self.refuse:
            return self.refuse
        if self.confirm:
            self.granted |= 1 << feature
        return 0

    def enlarge_signal_stack(self):
        self.calls.append("sigaltstack")
        self.small_stack = False
        return True


def enable(kernel, environ=None, flags=AMX_CPU, machine=LINUX, loaded=False):
    environ = {} if environ is None else environ
    return amx.request_amx(environ, flags, kernel, machine, loaded), environ


def test_granted_turns_on_onednn_amx_after_the_request():
    kernel = Kernel()
    status, environ = enable(kernel)
    assert status.state == "in-use" and status.in_use
    assert environ[amx.ISA_VARIABLE] == "AVX512_CORE_AMX"
    assert kernel.calls == [hex(amx.ARCH_GET_XCOMP_SUPP), hex(amx.ARCH_GET_XCOMP_PERM),
                            ("request", amx.XFEATURE_XTILEDATA), hex(amx.ARCH_GET_XCOMP_PERM)]


def test_already_granted_is_not_asked_again():
    kernel = Kernel(granted=0xe7 | TILE)
    status, environ = enable(kernel)
    assert status.in_use and not any(isinstance(c, tuple) for c in kernel.calls)


@pytest.mark.parametrize("kernel, words", [
    (Kernel(supported=None), "5.16"),                       # an old kernel
    (Kernel(supported=0xe7), "does not offer the tile state"),  # a hypervisor hides it
    (Kernel(refuse=errno.EPERM), "refused"),
    (Kernel(confirm=False), "does not list the tile state"),
])
def test_no_grant_leaves_onednn_below_amx(kernel, words):
    status, environ = enable(kernel)
    assert status.state == "refused" and words in status.detail
    assert amx.ISA_VARIABLE not in environ  # oneDNN's default excludes AMX: nothing to lower
    assert not status.in_use


def test_refused_reports_the_errno():
    status, _ = enable(Kernel(refuse=errno.EPERM))
    assert status.errno == errno.EPERM and "EPERM" in status.describe()


def test_a_small_signal_stack_is_replaced_and_the_request_repeated():
    kernel = Kernel(small_stack=True)
    status, environ = enable(kernel)
    assert status.in_use and "sigaltstack" in kernel.calls
    assert kernel.calls.count(("request", amx.XFEATURE_XTILEDATA)) == 2


@pytest.mark.parametrize("isa", ["AVX512_CORE_AMX", "ALL"])
def test_an_isa_allowing_amx_is_lowered_when_the_tiles_are_refused(isa):
    # Otherwise oneDNN's first tile instruction is SIGILL.
    status, environ = enable(Kernel(refuse=errno.EPERM), {amx.ISA_VARIABLE: isa})
    assert environ[amx.ISA_VARIABLE] == "AVX512_CORE_BF16" and "SIGILL" in status.detail


def test_the_switch_turns_it_off_without_asking():
    kernel = Kernel()
    status, environ = enable(kernel, {amx.SWITCH: "0"})
    assert status.state == "off" and kernel.calls == [] and amx.ISA_VARIABLE not in environ
    # A parent's AMX choice inherited by a child told to stay off comes down.
    status, environ = enable(Kernel(), {amx.SWITCH: "0", amx.ISA_VARIABLE: "AVX512_CORE_AMX", amx.MARKER: "1"})
    assert environ[amx.ISA_VARIABLE] == "AVX512_CORE_BF16"


def test_the_users_isa_is_kept():
    status, environ = enable(Kernel(), {amx.ISA_VARIABLE: "AVX512_CORE_BF16"})
    assert status.state == "granted" and environ[amx.ISA_VARIABLE] == "AVX512_CORE_BF16"
    status, environ = enable(Kernel(), {amx.ISA_VARIABLE: "AVX512_CORE_AMX"})
    assert status.state == "in-use" and "yours" in status.detail


def test_a_child_asks_again_and_keeps_its_parents_choice():
    parent = {}
    enable(Kernel(), parent)
    child = dict(parent)  # inherited over exec, where the permission is not
    kernel = Kernel()
    status, child = enable(kernel, child)
    assert status.in_use and ("request", amx.XFEATURE_XTILEDATA) in kernel.calls


@pytest.mark.parametrize("flags, machine", [
    (AMX_CPU - {"amx_tile"}, LINUX),
    ({"avx2"}, LINUX),
    (AMX_CPU, "Windows AMD64"),
])
def test_not_asked_where_there_is_no_amx_to_ask_for(flags, machine):
    kernel = Kernel()
    status, environ = enable(kernel, flags=flags, machine=machine)
    assert status.state == "not-on-this-cpu" and kernel.calls == [] and environ == {}


def test_mxnet_loaded_first_is_reported():
    status, environ = enable(Kernel(), loaded=True)
    assert status.state == "too-late" and environ[amx.ISA_VARIABLE] == "AVX512_CORE_AMX"


def test_bfloat16_support_follows_the_amx_state():
    assert hardware.bfloat16_support(AMX_CPU, {}, "in-use").kind == "amx"
    refused = hardware.bfloat16_support(AMX_CPU, {}, "refused")
    assert refused.kind == "native" and refused.amx == "refused"


def test_the_real_syscall_layer_on_this_cpu():
    """This process asked at import; the answer matches the CPU's flags and this kernel."""
    status = amx.status()
    flags = cpuinfo.cpu_flags() or set()
    if not {"amx_bf16", "amx_tile"} <= flags:
        assert status.state == "not-on-this-cpu"
        # The calls themselves work here: the kernel answers and refuses a feature it does not offer.
        calls = amx.ArchPrctl()
        supported, err = calls.get_mask(amx.ARCH_GET_XCOMP_SUPP)
        if supported is not None:
            assert not supported >> amx.XFEATURE_XTILEDATA & 1
            assert calls.request(amx.XFEATURE_XTILEDATA) in (errno.EOPNOTSUPP, errno.EINVAL)
    else:
        assert status.state in amx.STATES


def test_import_mxfp16_asks_before_mxnet_loads():
    code = ("import sys, mxfp16; from mxfp16.machine import amx; "
            "print(amx.status().state, 'mxnet' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    state, loaded = out.split()
    assert state in amx.STATES and state != "too-late" and loaded == "False"
