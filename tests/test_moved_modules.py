"""One name per thing: the paths modules moved from are gone, and no module in the package is only an alias."""
import importlib
import importlib.util
import os
import re

import mxfp16

import pytest
from conftest import REPO

#: Old path -> where it lives now (docs/api.md lists the same moves).
MOVED = {
    "mxfp16.parts": "mxfp16.train.parts",
    "mxfp16.formats": "mxfp16.float_formats",
    "mxfp16.hardware": "mxfp16.machine.hardware",
    "mxfp16.environment": "mxfp16.machine.environment",
    "mxfp16._compat": "mxfp16.machine.stack",
    "mxfp16.gpu": "mxfp16.machine.gpu",
    "mxfp16.data.bench": "mxfp16.data.timing",
    "mxfp16.amp_lists": "mxfp16.amp.lists",
    "mxfp16.amp_numpy": "mxfp16.amp.numpy_mode",
    "mxfp16.amp_operators": "mxfp16.amp.operators",
    "mxfp16.amp_table": "mxfp16.amp.table",
    "mxfp16.amp_wrappers": "mxfp16.amp.wrappers",
    "mxfp16.amp_zoo": "mxfp16.amp.zoo",
    "mxfp16._amp_op_probe": "mxfp16.amp.lists",
    "mxfp16.amp._op_probe": "mxfp16.amp.lists",
    "mxfp16.machine._mxnet_numpy_names": "mxfp16.machine.stack",
    "mxfp16.machine._mxnet_variables": "mxfp16.machine.environment",
    "mxfp16.fileio": "mxfp16.plumbing.fileio",
    "mxfp16.locking": "mxfp16.plumbing.output",
    "mxfp16.plumbing.locking": "mxfp16.plumbing.output",
    "mxfp16.ndarray_file": "mxfp16.plumbing.ndarray_file",
    "mxfp16.symbol_file": "mxfp16.plumbing.symbol_file",
    "mxfp16.console": "mxfp16.plumbing.console",
    "mxfp16.child": "mxfp16.plumbing.child",
    "mxfp16.plotting": "mxfp16.plumbing.plotting",
    "mxfp16.limits": "mxfp16.plumbing.limits",
    "mxfp16.training_parts": "mxfp16.train.parts",
    "mxfp16.selftest": "mxfp16.train.selftest",
    "mxfp16._gluoncv": "mxfp16.models.gluoncv",
    "mxfp16.bench.auto": "mxfp16.measure.auto",
    "mxfp16.auto": "mxfp16.measure.auto",
    "mxfp16.per_layer": "mxfp16.measure.per_layer",
    "mxfp16.timing": "mxfp16.measure.timing",
    "mxfp16.plumbing.cache": "mxfp16.measure.cache",
    "mxfp16.models.gan": "mxfp16.bench.networks",
    "mxfp16.models.language": "mxfp16.bench.networks",
    "mxfp16.models.encoder": "mxfp16.bench.networks",
}

#: Old name -> the one definition it became (docs/api.md lists the same renames).
RENAMED = {
    "mxfp16.machine.hardware.cpu_flags": "mxfp16.machine.cpuinfo.cpu_flags",
    "mxfp16.amp.wrappers.BFLOAT16": "mxfp16.float_formats.BFLOAT16",
    "mxfp16.data.fetch.sha256_of": "mxfp16.plumbing.fileio.sha256_file",
    "mxfp16.train.checkpoint.save_checkpoint": "mxfp16.train.checkpoint.write_checkpoint",
    "mxfp16.measure.cache.cache_folder": "mxfp16.plumbing.fileio.cache_folder",
}
#: What a command writes moved from fileio to output with the locks (issue 50); fileio keeps JSON and digests.
RENAMED.update({f"mxfp16.plumbing.fileio.{name}": f"mxfp16.plumbing.output.{name}" for name in (
    "shown", "default_mode", "NAME_MAX", "PATH_MAX", "temporary_prefix", "temporary_file", "temporary_folder",
    "atomic_write", "atomic_path", "naming", "failed_write", "describe_os_error", "OutputFolderError",
    "check_output_folder", "check_output_path", "rename_noreplace", "exchange")})


def _split(dotted):
    module, name = dotted.rsplit(".", 1)
    return importlib.import_module(module), name


@pytest.mark.parametrize("old", list(RENAMED))
def test_a_renamed_name_is_defined_once(old):
    module, name = _split(old)
    new_module, new_name = _split(RENAMED[old])
    new = getattr(new_module, new_name)
    # Gone, or the same object imported for the module's own use; never offered from the old place.
    assert getattr(module, name, new) is new, f"{old} is defined again; it is {RENAMED[old]}"
    assert name not in getattr(module, "__all__", ()), old


def test_has_cpu_bfloat16_is_gone():
    from mxfp16.machine import hardware

    assert not hasattr(hardware, "has_cpu_bfloat16")  # bfloat16_support().native says it


@pytest.mark.parametrize("old", list(MOVED))
def test_an_old_path_is_gone_and_its_new_one_exists(old):
    assert importlib.util.find_spec(old) is None, f"{old} still imports; it moved to {MOVED[old]}"
    assert importlib.util.find_spec(MOVED[old]) is not None


def test_no_module_of_the_package_is_only_an_alias():
    """A module that replaces itself in ``sys.modules``, or warns that it moved, is an alias."""
    aliases = []
    for folder, _, files in os.walk(os.path.join(REPO, "mxfp16")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                if re.search(r"sys\.modules\[__name__\]\s*=|moved to mxfp16|^\"\"\"Deprecated", text, re.M):
                    aliases.append(os.path.relpath(path, REPO))
    assert not aliases, aliases


def test_the_moves_are_listed_once_in_the_api_page():
    with open(os.path.join(REPO, "docs", "api.md"), encoding="utf-8") as handle:
        page = handle.read()
    for old, new in {**MOVED, **RENAMED}.items():
        assert f"| `{old}` | `{new}`" in page, old


def test_stack_report_is_served_by_its_own_module():
    from mxfp16.machine import stack

    assert mxfp16.stack_report is stack.stack_report
    assert mxfp16.stack_report()["numpy"]
