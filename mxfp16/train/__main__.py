"""``python -m mxfp16.train [flags]``: the same as ``mxfp16 train [flags]``."""
import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["train"] + sys.argv[1:]))
