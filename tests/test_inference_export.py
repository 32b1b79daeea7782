"""`mxfp16 export`: the files, the agreement check, plain-MXNet loading, and every refusal of the issue.

One tiny float32 run is trained in a child process; the exports run in this
process (conversion needs no ``amp.init``, so nothing leaks into later tests).
"""
import json
import os
import shutil

from mxfp16.cli import main
from mxfp16.inference import bundle
from mxfp16.inference.agreement import AgreementError
from mxfp16.inference.bundle import ExportError
from mxfp16.inference.export import export_run
from mxfp16.machine import hardware
from mxfp16.plumbing.fileio import sha256_file

import numpy as np
import pytest
from conftest import CPU_MIXED, requires_bfloat16
from train_support import QUICK, ok, run_train, tiny_dataset

pytestmark = pytest.mark.slow


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("export-data"))


def _train(data, out, *flags):
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 2, *QUICK, *flags))
    return out


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    return _train(data, tmp_path_factory.mktemp("export-run") / "run")


@pytest.fixture(scope="module")
def mixed_export(run, tmp_path_factory):
    """The run exported in amp-bfloat16, or in float32 on a CPU that cannot run bfloat16 (the files are the same)."""
    out = tmp_path_factory.mktemp("exports") / "mixed"
    info = export_run(run, out, precision=CPU_MIXED, ctx="cpu", log=_quiet)
    return out, info


def test_export_writes_the_model_files_with_their_sha256_and_what_a_user_needs(run, mixed_export):
    out, info = mixed_export
    assert sorted(p.name for p in out.iterdir()) == sorted([bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE,
                                                            bundle.CHECKSUM_FILE])
    on_disk = json.loads((out / bundle.INFO_FILE).read_text())
    assert on_disk == info
    sums = dict(reversed(line.split()) for line in (out / bundle.CHECKSUM_FILE).read_text().splitlines())
    for name in (bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE):
        assert sums[name] == sha256_file(out / name)
    for name in (bundle.SYMBOL_FILE, bundle.PARAMS_FILE):
        assert info["files"][name] == {"sha256": sums[name], "bytes": (out / name).stat().st_size}
    config = json.loads((run / "config.json").read_text())
    assert info["classes"] == config["classes"] and info["image_size"] == config["image_size"] == 16
    assert info["precision"] == CPU_MIXED and info["compute_dtype"] == CPU_MIXED.replace("amp-", "")
    assert info["preprocess"]["center_crop"] == 16 and info["preprocess"]["resize_short"] == 18
    assert info["source"]["tag"] == "epoch-0002"
    assert info["source"]["params_sha256"] == sha256_file(run / "checkpoints" / "epoch-0002.params")
    agreement = info["agreement"]
    assert agreement["images"] == 24 and agreement["emulated"] is False
    assert 0 <= agreement["max_probability_difference"] < 0.5
    assert agreement["changed_images"] == round(agreement["changed_share"] * 24)
    # No staging folder is left beside the export.
    assert [p.name for p in out.parent.iterdir()] == ["mixed"]


@requires_bfloat16
def test_bfloat16_weights_are_stored_converted_and_the_graph_keeps_its_casts(mixed_export):
    import mxnet as mx

    out, _ = mixed_export
    params = mx.nd.load(str(out / bundle.PARAMS_FILE))
    conv_weights = [k for k in params if k.startswith("arg:") and "conv" in k and k.endswith("_weight")]
    assert conv_weights and all(params[k].dtype != np.float32 for k in conv_weights)  # bfloat16
    assert all(params[k].dtype == np.float32 for k in params if "batchnorm" in k)
    ops = [n["op"] for n in json.loads((out / bundle.SYMBOL_FILE).read_text())["nodes"]]
    assert "amp_cast" in ops  # MXNet's save would have dropped them by default


PLAIN_LOAD = """
import json, sys
import numpy as np
import mxnet as mx
from mxnet import gluon

folder, images, labels, compat = sys.argv[1:5]
net = gluon.SymbolBlock.imports(folder + "/model-symbol.json", ["data"], folder + "/model-0000.params", ctx=mx.cpu())
logits = net(mx.nd.array(np.load(images))).asnumpy()
assert logits.dtype == np.float32, logits.dtype
# The point of the test: none of mxfp16's own code runs the export (at most its numpy compat step).
assert ("mxfp16" in sys.modules) == (compat == "compat")
assert not any(m.startswith(("mxfp16.models", "mxfp16.inference", "mxfp16.train", "mxfp16.casting"))
               for m in sys.modules)
print(json.dumps({"top1": float((logits.argmax(axis=1) == np.load(labels)).mean()), "logits": logits.tolist()}))
"""


def _bare_environment():
    """This process's environment as a user's plain MXNet would have it: without the DNNL_MAX_CPU_ISA that
    ``import mxfp16`` set here (marked by MXFP16_AMX_ISA_SET) to let oneDNN use AMX. A process that does not
    import mxfp16 never asks Linux for AMX's tile state, so oneDNN allowed AMX there dies of SIGILL at its first
    tile instruction; a plain user's MXNet runs oneDNN's default kernels, which exclude AMX."""
    from mxfp16.machine import amx

    env = dict(os.environ)
    if env.get(amx.MARKER) == "1":
        env.pop(amx.ISA_VARIABLE, None)
        env.pop(amx.MARKER, None)
    return env


@pytest.mark.parametrize("precision", [pytest.param("amp-bfloat16", marks=requires_bfloat16), "float32"])
def test_plain_mxnet_loads_the_export_and_gets_the_checked_top1(run, data, mixed_export, precision, tmp_path):
    import subprocess
    import sys

    from mxfp16.data import make_loaders

    if precision == "amp-bfloat16":
        out, info = mixed_export
    else:
        out = tmp_path / "f32"
        info = export_run(run, out, precision="float32", ctx="cpu", log=_quiet)
        assert info["agreement"]["changed_images"] == 0 and info["agreement"]["max_probability_difference"] == 0
    batches = list(make_loaders(data, image_size=16, batch_size=8).test_batches())
    np.save(tmp_path / "x.npy", np.concatenate([x.asnumpy() for x, _ in batches]))
    np.save(tmp_path / "y.npy", np.concatenate([y.asnumpy() for _, y in batches]))
    # A bare interpreter: no PYTHONPATH to the repository, and no `import mxfp16` where MXNet loads by itself
    # (numpy below 1.24); on a newer numpy, the one line docs/inference.md gives (mxfp16 supplies numpy's names).
    from mxfp16.machine import stack

    code = ("import mxfp16\n" if stack.SUPPLIED else "") + PLAIN_LOAD
    proc = subprocess.run([sys.executable, "-c", code, str(out), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"),
                           "compat" if stack.SUPPLIED else "bare"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_bare_environment())
    assert proc.returncode == 0, proc.stderr
    plain = json.loads(proc.stdout)
    if precision == "float32" or hardware.bfloat16_support().kind != "amx":
        # Both processes ran the same kernels: the same top-1, exactly.
        assert plain["top1"] == pytest.approx(info["agreement"]["top1_export"])
        return
    # Here the export was checked on AMX tiles, and plain MXNet runs oneDNN's avx512_core_bf16 kernels: two
    # bfloat16 evaluations that round differently. Measure how far apart their logits are; an image may change
    # its prediction only where its two best logits (as checked) are closer than that, and the top-1 only by those.
    import mxnet as mx

    net = mx.gluon.SymbolBlock.imports(str(out / bundle.SYMBOL_FILE), ["data"], str(out / bundle.PARAMS_FILE),
                                       ctx=mx.cpu())
    checked = net(mx.nd.array(np.load(tmp_path / "x.npy"))).asnumpy().astype(np.float64)
    theirs = np.asarray(plain["logits"], dtype=np.float64)
    labels = np.load(tmp_path / "y.npy").astype(np.int64)
    assert float((checked.argmax(axis=1) == labels).mean()) == pytest.approx(info["agreement"]["top1_export"])
    apart = float(np.abs(checked - theirs).max())
    # bfloat16 keeps 8 significant bits: each side's logits are within a few units of 2**-8 of the float32 ones
    # (the export check measured this side's distance); both sides together, twice that.
    scale = max(float(np.abs(checked).max()), 1e-30)
    assert apart <= 2 * info["agreement"]["max_score_difference"] + 2 ** -7 * scale, (
        f"plain MXNet's logits are {apart:.3g} from the checked export's ({hardware.bfloat16_support().describe()})")
    top2 = np.sort(checked, axis=1)[:, -2:]
    changed = checked.argmax(axis=1) != theirs.argmax(axis=1)
    assert (top2[changed, 1] - top2[changed, 0] <= 2 * apart).all(), (
        f"an image changed its prediction beyond the rounding between AMX and AVX-512 bfloat16 "
        f"({hardware.bfloat16_support().describe()})")
    assert abs(plain["top1"] - info["agreement"]["top1_export"]) <= changed.sum() / len(labels) + 1e-12


def test_float16_export_on_a_cpu_is_written_and_its_check_says_it_was_emulated(run, tmp_path):
    import mxnet as mx

    messages = []
    info = export_run(run, tmp_path / "f16", precision="float16", ctx="cpu", log=messages.append)
    agreement = info["agreement"]
    assert agreement["emulated"] is True and "float16-rounded weights" in agreement["computed"]
    assert any("emulated" in m for m in messages)
    params = mx.nd.load(str(tmp_path / "f16" / bundle.PARAMS_FILE))
    assert {params[k].dtype for k in params if "conv" in k and k.endswith("_weight")} == {np.float16}
    assert {params[k].dtype for k in params if "batchnorm" in k} == {np.float32}
    # Rounding the weights to float16 moves probabilities, but only a little.
    assert 0 < agreement["max_probability_difference"] < 0.05


def test_an_existing_export_folder_is_refused_without_overwrite_and_overwrite_replaces_it_whole(
        run, tmp_path, capsys):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (out / "notes").mkdir()
    (out / "notes" / "n.md").write_text("my notes")
    for overwrite in ([], ["--overwrite"]):  # a folder holding what an export does not write: never replaced
        assert main(["export", "--run", str(run), "--out", str(out), "--precision", "float32", "--ctx", "cpu",
                     *overwrite]) == 2
        err = capsys.readouterr().err
        assert ("already exists; replace it with --overwrite" in err if not overwrite else
                "holds keep.txt, notes, which are not part of an export" in err), err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "notes"]
    assert (out / "keep.txt").read_text() == "mine" and (out / "notes" / "n.md").read_text() == "my notes"
    out = tmp_path / "exp2"
    for _ in range(2):  # a new folder, then over its own earlier export
        assert main(["export", "--run", str(run), "--out", str(out), "--precision", "float32", "--ctx", "cpu",
                     "--overwrite"]) == 0
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [bundle.SYMBOL_FILE, bundle.PARAMS_FILE, bundle.INFO_FILE, bundle.CHECKSUM_FILE])
        bundle.read_model(out, bundle.read_info(out))  # the three files agree with each other
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "exp2"]  # no staging folder or lock left


@pytest.mark.parametrize("where", ["the run itself", "the folder holding the run", "inside the run",
                                   "the data set"])
def test_export_refuses_an_out_that_is_contains_or_sits_inside_an_input(run, data, tmp_path_factory, capsys, where):
    copy = tmp_path_factory.mktemp("holder") / "run"
    shutil.copytree(run, copy)
    before = sorted(str(p.relative_to(copy.parent)) for p in copy.parent.rglob("*"))
    out = {"the run itself": copy, "the folder holding the run": copy.parent,
           "inside the run": copy / "export", "the data set": data}[where]
    assert main(["export", "--run", str(copy), "--out", str(out), "--precision", "float32", "--ctx", "cpu",
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "would be written over (or --overwrite would delete) an input" in err
    assert sorted(str(p.relative_to(copy.parent)) for p in copy.parent.rglob("*")) == before  # nothing deleted


def test_a_checkpoint_file_that_is_not_one_is_refused_with_the_fix(run, tmp_path, capsys):
    junk = tmp_path / "notes.params"
    junk.write_text("not an array file")
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--checkpoint", str(junk),
                 "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "is not an MXNet parameters file" in err and "give --checkpoint a .params file" in err


def test_a_params_file_declaring_a_huge_array_is_refused_before_allocation(run, tmp_path, capsys):
    import struct

    from mxfp16.plumbing.ndarray_file import read_header

    params = sorted((run / "checkpoints").glob("*.params"))[-1]
    data = bytearray(params.read_bytes())
    # The first array's shape: after the list header (3 uint64), the array magic, storage type and ndim.
    ndim = struct.unpack_from("<i", data, 32)[0]
    struct.pack_into(f"<{ndim}q", data, 36, *([2 ** 30] * ndim))
    huge = tmp_path / "huge.params"
    huge.write_bytes(bytes(data))
    assert read_header(params)  # the real one parses
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--checkpoint", str(huge),
                 "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "bytes but only" in err and "damaged" in err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("damage", ["deep", "mistyped", "list"])
def test_a_damaged_config_json_is_a_message_not_a_traceback(run, tmp_path, capsys, damage):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = json.loads((copy / "config.json").read_text())
    text = {"deep": "[" * 100000 + "]" * 100000,
            "mistyped": json.dumps(dict(config, classes=7, image_size="big")),
            "list": json.dumps([config])}[damage]
    (copy / "config.json").write_text(text)
    assert main(["export", "--run", str(copy), "--out", str(tmp_path / "x"), "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "config.json" in err
    assert {"deep": "nested", "mistyped": "of the wrong type", "list": "where an object belongs"}[damage] in err


def test_a_damaged_export_json_is_a_message(mixed_export, tmp_path, capsys):
    out, _ = mixed_export
    copy = tmp_path / "exp"
    shutil.copytree(out, copy)
    info = json.loads((out / bundle.INFO_FILE).read_text())
    for text, words, reseal in (('{"a": ' * 50 + "1" + "}" * 50, "more than 32 deep", True),
                                (json.dumps(dict(info, files=3)), "field 'files' is 3", True),
                                (json.dumps({k: v for k, v in info.items() if k != "compute_dtype"}),
                                 "lacks the field", True),
                                (json.dumps(dict(info, files=dict(info["files"], **{bundle.PARAMS_FILE: 5}))),
                                 "export.json has changed since it was exported", False)):
        (copy / bundle.INFO_FILE).write_text(text)
        if reseal:  # as a deliberate edit would: the parse, not the checksum, must refuse it
            bundle.seal(copy)
        assert main(["predict", "--model", str(copy), str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


def test_exporting_an_unfinished_run_says_so(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "summary.json").unlink()  # as when the run stopped after epoch 2 of more
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(config, epochs=5)))
    messages = []
    export_run(copy, tmp_path / "x", precision="float32", ctx="cpu", log=messages.append)
    assert any("has not finished: it completed 2 of 5 epochs" in m for m in messages)
    quiet = []
    export_run(run, tmp_path / "y", precision="float32", ctx="cpu", log=quiet.append)
    assert not any("has not finished" in m for m in quiet)


def test_a_run_folder_without_a_checkpoint_is_refused(run, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "config.json", bare / "config.json")
    assert main(["export", "--run", str(bare), "--out", str(tmp_path / "x"), "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoint" in err and "Traceback" not in err
    assert main(["export", "--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "x"), "--ctx", "cpu"]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def other_model_run(data, tmp_path_factory):
    """A run of another network (resnet18_v1) on the same data."""
    flags = ["--model", "resnet18_v1", "--image-size", "16", "--batch-size", "8", "--no-progress"]
    out = tmp_path_factory.mktemp("other") / "run"
    ok(run_train("--data-dir", data, "--precision", "float32", "--out", out, "--epochs", 1, "--max-batches", 1, *flags))
    return out


def test_a_checkpoint_of_another_model_is_refused(run, other_model_run, tmp_path, capsys):
    # Its checkpoints copied into a run whose config.json names cifar_resnet20_v1.
    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed)
    shutil.rmtree(mixed / "checkpoints")
    shutil.copytree(other_model_run / "checkpoints", mixed / "checkpoints")
    assert main(["export", "--run", str(mixed), "--out", str(tmp_path / "x"), "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "written for another model" in err and "'resnet18_v1'" in err and "'cifar_resnet20_v1'" in err
    # Its .params file given directly: no record to read, so the network itself refuses it.
    params = next((other_model_run / "checkpoints").glob("*.params"))
    assert main(["export", "--run", str(run), "--checkpoint", str(params), "--out", str(tmp_path / "x"),
                 "--ctx", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "does not fit cifar_resnet20_v1" in err and "not a checkpoint of this run's model" in err
    assert not (tmp_path / "x").exists()


def test_best_checkpoint_is_the_best_epoch_and_refused_when_it_was_not_kept(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    # Make epoch 1 the best, and its checkpoint gone (as with --keep-checkpoints 1).
    records[0]["val_top1"], records[1]["val_top1"] = 0.9, 0.5
    for path in (copy / "checkpoints").glob("epoch-0001*"):
        path.unlink()
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ExportError, match=r"checkpoint of epoch 1 .* not on disk; checkpoints kept .*: epoch-0002"):
        export_run(copy, tmp_path / "x", precision="float32", checkpoint="best", ctx="cpu", log=_quiet)
    records[0]["val_top1"], records[1]["val_top1"] = 0.5, 0.9
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    info = export_run(copy, tmp_path / "x", precision="float32", checkpoint="best", ctx="cpu", log=_quiet)
    assert info["source"]["epoch"] == 2 and info["source"]["val_top1"] == 0.9


# compare is replaced: what runs is the refusal, so any precision this CPU runs will do.
def test_an_export_beyond_the_margin_is_refused_naming_the_numbers_and_leaves_nothing(run, tmp_path, monkeypatch):
    from mxfp16.inference.formats import mxnet as mxnet_format

    def one_point_worse(*args):
        return {"images": 100, "top1_float32": 0.80, "top1_export": 0.79, "top1_drop_points": 1.0,
                "changed_images": 3, "changed_share": 0.03, "max_probability_difference": 0.2}

    monkeypatch.setattr(mxnet_format, "compare", one_point_worse)  # the MXNet format's check compares
    with pytest.raises(AgreementError,
                       match=r"79\.00% against 80\.00% .* 1\.00 points lower, beyond the margin of 0\.5"):
        export_run(run, tmp_path / "x", precision=CPU_MIXED, ctx="cpu", log=_quiet)
    assert list(tmp_path.iterdir()) == []
    info = export_run(run, tmp_path / "x", precision=CPU_MIXED, ctx="cpu", margin=1.5, log=_quiet)
    assert info["agreement"]["margin_points"] == 1.5


def test_bad_export_flags_are_user_errors(run, tmp_path, capsys):
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--precision", "float64"]) == 2
    assert "unknown precision 'float64'" in capsys.readouterr().err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--margin", "-1"]) == 2
    assert "argument --margin: -1: must be between 0 and 100" in capsys.readouterr().err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--margin", "nan"]) == 2
    assert "argument --margin: nan: must be a finite number" in capsys.readouterr().err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "x"), "--checkpoint", "newest"]) == 2
    assert "no such file; give last, best or a .params file" in capsys.readouterr().err
