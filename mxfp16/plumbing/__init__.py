"""Files, locks, child processes and the console: what every command needs and no user imports.

:mod:`~mxfp16.plumbing.output` (atomic writes, one writer per output, the output rule, OS errors as one line),
:mod:`~mxfp16.plumbing.fileio` (JSON files read with every check, digests), :mod:`~mxfp16.plumbing.ndarray_file` and
:mod:`~mxfp16.plumbing.symbol_file` (MXNet's files checked before MXNet reads them), :mod:`~mxfp16.plumbing.child` (a
function run in a fresh process, what it returned read back), :mod:`~mxfp16.plumbing.console` (a standard output that
may close), :mod:`~mxfp16.plumbing.plotting` (figures without pyplot) and :mod:`~mxfp16.plumbing.limits` (the range of
every numeric setting). Nothing here imports the library above it.
"""
