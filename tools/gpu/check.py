"""``make gpu-check``: prove a ``mxfp16[gpu]`` install loads, on any Linux machine, GPU or not.

A release tool, not part of the installed package. Run it from a source
checkout inside the venv that holds the gpu extra (the Makefile's
``.venv-gpu``)::

    python tools/gpu/check.py [--install-log FILE] [--json FILE]

Steps, each reported as ok or FAILED:

1. ``libmxnet.so`` is a CUDA build; the libraries it needs (its ``DT_NEEDED``)
   are all found in the NVIDIA wheels, except the driver's ``libcuda.so.1``.
2. The driver: a real ``libcuda.so.1`` when the machine has one; otherwise a
   stand-in that answers "no device" (``tools/gpu/driver_standin.py``),
   preloaded into the child processes below and nowhere else.
3. ``ldd`` on ``libmxnet.so`` and on every library in the wheels' folders,
   with ``LD_LIBRARY_PATH`` set to those folders: no "not found". ``ldd``
   cannot see libraries loaded with ``ctypes``, hence the next step.
4. A fresh process with no ``LD_LIBRARY_PATH``: plain ``import mxnet`` first
   (expected to fail: that is why the preload exists), then ``import mxfp16``
   (preload, then MXNet), after which every ``DT_NEEDED`` soname is mapped in
   the process (``/proc/self/maps``), the CUDA ones from the wheels.
5. ``mxfp16 info --json`` exits 0 and reports as many GPUs as MXNet sees
   (0 on a machine without one), every library found, and the build's kernels.
6. The kernels in the installed ``libmxnet.so`` are the ones in
   :mod:`mxfp16.machine.gpu.wheel_kernels` (the table the docs and ``info`` use).

Download sizes and the install time are read from ``--install-log`` (pip's
output, which the Makefile writes).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

from mxfp16.machine.gpu import libraries, wheel_kernels
from mxfp16.machine.gpu.elf import dynamic_info

# Run as a script (`python tools/gpu/check.py`, what make gpu-check does): this
# folder is on sys.path, so its sibling tools import by name. `import mxfp16`
# does not import MXNet (mxfp16/__init__.py), so the check runs, and builds
# the driver stand-in, on a machine where loading MXNet would fail.
import driver_standin
from fatbin import read_library


class Check:
    """Collects step results and prints them as it goes."""

    def __init__(self):
        self.steps = []

    def record(self, name, ok, detail):
        """Record a step; ``ok=None`` is a note that cannot fail."""
        self.steps.append({"step": name, "ok": None if ok is None else bool(ok), "detail": detail})
        print(f"[{'note' if ok is None else 'ok' if ok else 'FAILED'}] {name}")
        for line in str(detail).splitlines():
            print(f"    {line}")
        sys.stdout.flush()
        return ok

    @property
    def passed(self):
        return all(step["ok"] is not False for step in self.steps)


def _child_env(preload):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    if preload:
        env["LD_PRELOAD"] = preload
    return env


def _mb(n):
    return f"{n / 1e6:,.1f} MB"


def _folder_size(folder):
    total = 0
    for root, _dirs, files in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if not os.path.islink(os.path.join(root, f)))
    return total


def install_figures(log_path):
    """Wheel sizes pip printed and the install time the Makefile appended."""
    if not log_path or not os.path.exists(log_path):
        return None
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    units = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
    wheels = {}
    # pip prints "Downloading" also when its HTTP cache serves the file.
    for name, size, unit in re.findall(r"(?:Downloading|Using cached) (\S+\.whl) \(([\d.]+) (kB|MB|GB)\)", text):
        wheels[os.path.basename(name)] = float(size) * units[unit]
    seconds = re.search(r"install_seconds=(\d+)", text)
    return {"wheels": wheels, "download_bytes": sum(wheels.values()),
            "install_seconds": int(seconds.group(1)) if seconds else None}


def _ldd(path, folders):
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(folders))
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, check=False).stdout
    return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]


_IMPORT_PROBE = textwrap.dedent("""
    import json
    import mxfp16                      # preload, then import mxnet
    import mxnet as mx
    from mxfp16.machine import hardware
    from mxfp16.machine.gpu import libraries
    needed = libraries.needed_by_mxnet()
    maps = {name: libraries.loaded_path(name) for name in needed}
    print(json.dumps({
        "maps": maps,
        "preloaded": [s.library.soname for s in libraries.preload() if s.loaded],
        "features": sorted(n for n, f in mx.runtime.Features().items() if f.enabled),
        "gpus": hardware.gpu_count(),      # 0 when the driver answers "no device"
        "mxnet": mx.__version__,
    }))
""")


def check_libraries(check, library):
    """Step 1: a CUDA build, every CUDA library in a wheel. Returns the statuses and their folders."""
    needed = dynamic_info(library).needed
    statuses = libraries.status(needed)
    missing = [s for s in statuses if not s.path]
    rows = "\n".join(f"{s.library.soname:<20} {s.library.package:<24} {s.path or 'MISSING: ' + s.library.fix}"
                     for s in statuses)
    check.record("libmxnet.so is a CUDA build and the wheels hold every CUDA library it needs",
                 libraries.is_cuda_build(needed) and not missing,
                 f"{library} ({_mb(os.path.getsize(library))})\n{rows}")
    return statuses, sorted({os.path.dirname(s.path) for s in statuses if s.path})


def check_driver(check, library, folder):
    """Step 2: the real driver, or a stand-in built in ``folder``. Returns the stand-in's path or None."""
    if driver_standin.driver_available():
        check.record("NVIDIA driver", True, "libcuda.so.1 found by the dynamic loader")
        return None
    try:
        standin = driver_standin.build(library, folder)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
        check.record("NVIDIA driver", False, f"no libcuda.so.1 and no stand-in could be built: {err}")
        return None
    check.record("NVIDIA driver", True,
                 "none on this machine (no libcuda.so.1): a stand-in answering 'no device' is preloaded into the "
                 f"child processes below ({', '.join(driver_standin.driver_functions(library))})")
    return standin


def check_ldd(check, library, folders, standin):
    """Step 3: ``ldd`` on libmxnet.so and every library in the wheels' folders finds everything."""
    search = folders + ([os.path.dirname(standin)] if standin else [])
    targets = [library] + sorted(os.path.join(f, n) for f in folders for n in os.listdir(f) if ".so" in n)
    unresolved = {t: missing for t in targets for missing in [_ldd(t, search)] if missing}
    check.record(f"ldd: every dependency of libmxnet.so and of the {len(targets) - 1} wheel libraries resolves",
                 not unresolved,
                 "LD_LIBRARY_PATH=<the wheels' lib folders" + (" and the driver stand-in's" if standin else "")
                 + ">\n" + ("\n".join(f"{t}: {', '.join(n)} not found" for t, n in unresolved.items())
                            or "no 'not found'"))


def check_import(check, statuses, folders, env):
    """Step 4: plain ``import mxnet`` (a note), then ``import mxfp16`` maps every needed library."""
    # Plain processes, not mxfp16.plumbing.child's: the imports themselves are under test (that child imports
    # mxfp16 before anything), in the gpu venv before mxfp16 is known to import there.
    plain = subprocess.run([sys.executable, "-c", "import mxnet"], capture_output=True, text=True, env=env,
                           check=False)
    plain_error = (plain.stderr.strip().splitlines() or ["(no error)"])[-1]
    check.record("plain `import mxnet`, without mxfp16's preload", None,
                 "it imported (the system provides the libraries)" if plain.returncode == 0 else
                 f"{plain_error}\n(expected: the wheels' folders are on no library path; that is why mxfp16 "
                 "preloads them)")
    name = "`import mxfp16` (preload, then MXNet) with no LD_LIBRARY_PATH"
    probe = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, env=env,
                           check=False)
    if probe.returncode != 0:
        check.record(name, False, "\n".join(probe.stderr.strip().splitlines()[-15:]))
        return None
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    unmapped = [soname for soname, where in result["maps"].items() if not where]
    outside = [s.library.soname for s in statuses
               if result["maps"].get(s.library.soname)
               and not result["maps"][s.library.soname].startswith(tuple(folders))]
    check.record(name, not unmapped and not outside and "CUDA" in result["features"],
                 f"MXNet {result['mxnet']}, features: {', '.join(result['features'])}\n"
                 f"preloaded: {', '.join(result['preloaded'])}\n"
                 f"all {len(result['maps'])} DT_NEEDED sonames mapped"
                 + (f"; NOT mapped: {', '.join(unmapped)}" if unmapped else "")
                 + (f"; not from the wheels: {', '.join(outside)}" if outside else "")
                 + f"\nMXNet sees {result['gpus']} GPU(s)")
    return result


def check_info(check, env, gpus_seen):
    """Step 5: ``mxfp16 info --json`` runs and agrees with MXNet on the GPU count."""
    name = "`mxfp16 info --json` runs and reports the GPUs"
    info = subprocess.run([sys.executable, "-m", "mxfp16", "info", "--json"], capture_output=True, text=True,
                          env=env, check=False)
    if info.returncode != 0:
        check.record(name, False, "\n".join(info.stderr.strip().splitlines()[-15:]))
        return
    report = json.loads(info.stdout)
    cuda, gpus = report["cuda"], report["machine"]["gpus"]
    found = sum(1 for row in cuda["libraries"] if row["path"])
    lines = [f"GPUs: {len(gpus)} (MXNet: {gpus_seen}); build {cuda['build']}; "
             f"{found}/{len(cuda['libraries'])} libraries found in wheels"]
    lines += [f"gpu:{g['index']} ({g['capability']}): {g['status']}, {g['detail']}" for g in cuda["gpu_support"]]
    check.record(name, found == len(cuda["libraries"]) and len(gpus) == gpus_seen, "\n".join(lines))


def check_kernels(check, library):
    """Step 6: the installed library's kernels are the shipped table's."""
    kernels = read_library(library)
    same = (kernels.sass, kernels.ptx) == (wheel_kernels.SASS, wheel_kernels.PTX)
    check.record("the installed libmxnet.so carries the kernels of mxfp16.machine.gpu.wheel_kernels", same,
                 f"SASS: {', '.join(f'sm_{a}' for a in kernels.sass) or 'none'}; "
                 f"PTX: {', '.join(f'compute_{a}' for a in kernels.ptx) or 'none'}")


def _sizes(library, folders):
    sizes = {os.path.basename(os.path.dirname(f)): _folder_size(os.path.dirname(f)) for f in folders}
    sizes["mxnet"] = _folder_size(os.path.dirname(library))
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def run(install_log=None, json_path=None):
    """Run every step; return the process exit status (0 when all pass)."""
    check = Check()
    library = libraries.mxnet_library()
    if not library:
        check.record("MXNet installed", False, "no mxnet package in this environment; run `make gpu-check`")
        return 1
    statuses, folders = check_libraries(check, library)
    with tempfile.TemporaryDirectory(prefix="mxfp16-gpu-check-") as scratch:
        standin = check_driver(check, library, scratch)
        check_ldd(check, library, folders, standin)
        env = _child_env(standin)
        result = check_import(check, statuses, folders, env)
        check_info(check, env, result["gpus"] if result else None)
    check_kernels(check, library)

    sizes = _sizes(library, folders)
    print("\nInstalled sizes: " + ", ".join(f"{k} {_mb(v)}" for k, v in sizes.items())
          + f"; total {_mb(sum(sizes.values()))}")
    figures = install_figures(install_log)
    if figures:
        biggest = sorted(figures["wheels"].items(), key=lambda kv: -kv[1])[:4]
        print(f"Wheels: {len(figures['wheels'])}, {_mb(figures['download_bytes'])} (largest: "
              + ", ".join(f"{name.split('-')[0]} {_mb(size)}" for name, size in biggest)
              + f"); install took {figures['install_seconds']} s")
    print(f"\ngpu-check: {'PASSED' if check.passed else 'FAILED'}")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"passed": check.passed, "steps": check.steps, "installed_bytes": sizes,
                       "install": figures}, handle, indent=2)
    return 0 if check.passed else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tools/gpu/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--install-log", help="pip's output of the install, for download sizes and time")
    parser.add_argument("--json", dest="json_path", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    return run(args.install_log, args.json_path)


if __name__ == "__main__":
    sys.exit(main())
