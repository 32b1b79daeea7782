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


def test_the_amx_setting_is_taken_back_only_after_onednn_read_it():
    """A child that runs MXNet without mxfp16 has no tile permission (cleared on exec): it must not inherit AMX."""
    order = []
    environ = {amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: "1"}

    def read():
        order.append(dict(environ))  # what oneDNN sees when it reads

    assert amx.release_isa(environ, read) and environ == {}
    assert order == [{amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: "1"}]

    def fails():
        raise RuntimeError("no CPU operator")

    environ = {amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: "1"}  # not read: kept, as without mxfp16's release
    assert not amx.release_isa(environ, fails) and environ[amx.ISA_VARIABLE] == amx.AMX_ISA
    for kept in ({amx.ISA_VARIABLE: amx.AMX_ISA}, {amx.ISA_VARIABLE: "AVX512_CORE_BF16", amx.MARKER: "1"}, {},
                 {amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: "1", "DNNL_VERBOSE": "1"}):
        environ = dict(kept)  # yours, lowered (safe for any child), nothing set, or a trace the read would show in
        assert not amx.release_isa(environ, read) and environ == kept and len(order) == 1


def test_onednn_reads_its_isa_at_the_primitive_release_isa_runs():
    """After release_isa's read, removing DNNL_MAX_CPU_ISA no longer changes what oneDNN runs in this process."""
    if not set(hardware.AVX512_CORE_FLAGS) <= (cpuinfo.cpu_flags() or set()):
        pytest.skip("a cap of AVX2 is only visible on a CPU with AVX-512")
    code = ("import os, mxfp16; from mxfp16.machine import amx; import mxnet as mx\n"
            "amx.release_isa({amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: '1'})\n"
            "del os.environ['DNNL_MAX_CPU_ISA']\n"
            "x = mx.nd.ones((2, 16, 8, 8)); w = mx.nd.ones((16, 16, 3, 3))\n"
            "mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=16, no_bias=True, pad=(1, 1)).wait_to_read()\n")
    env = dict(os.environ, PYTHONPATH=REPO, DNNL_MAX_CPU_ISA="AVX2", DNNL_VERBOSE="1")
    env.pop(amx.MARKER, None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    convolutions = [line for line in out.splitlines() if ",exec," in line and "convolution" in line]
    assert convolutions, out[-2000:]
    assert all("avx512" not in line for line in convolutions), convolutions  # read while the cap was set


def test_a_child_of_a_process_that_loaded_mxnet_does_not_inherit_amx():
    code = ("import os, subprocess, mxfp16; from mxfp16.machine import amx; "
            "from mxfp16.machine.stack import import_mxnet; import_mxnet(); "
            "print(amx.status().state, repr(subprocess.run(['sh', '-c', 'echo $DNNL_MAX_CPU_ISA'], "
            "capture_output=True, text=True).stdout.strip()))")
    # As a parent mxfp16 leaves it before MXNet loads: this process's own choice, taken back after oneDNN's read.
    env = dict(os.environ, PYTHONPATH=REPO, **{amx.ISA_VARIABLE: amx.AMX_ISA, amx.MARKER: "1"})
    env.pop(amx.SWITCH, None)
    state, inherited = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      check=True).stdout.split()
    # Refused tiles lower the value to AVX512_CORE_BF16, which any child may keep; otherwise nothing is left.
    assert inherited == ("'AVX512_CORE_BF16'" if state == "refused" else "''"), (state, inherited)
