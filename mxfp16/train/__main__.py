"""``python -m mxfp16.train [flags]``: the same as ``python -m mxfp16 train [flags]``.

An entry point, not library code: it hands the command line to the
package's own entry point rather than importing the CLI layer from inside
the trainer.
"""
import runpy
import sys

if __name__ == "__main__":
    sys.argv[1:1] = ["train"]
    runpy.run_module("mxfp16", run_name="__main__", alter_sys=True)
