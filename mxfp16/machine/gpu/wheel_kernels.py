"""GPU kernels in mxnet_cu112-1.9.1-py3-none-manylinux2014_x86_64.whl (generated; do not edit).

Written by ``python tools/gpu/fatbin.py <wheel> --cuobjdump --write <this file>``
from the ``.nv_fatbin`` sections of ``mxnet/libmxnet.so``; see
``tools/gpu/fatbin.py`` for the format and :mod:`mxfp16.machine.gpu.coverage` for
what the numbers mean for each GPU generation.
"""

#: Where the table was read from (the wheel's sha256 identifies it exactly).
SOURCE = {'wheel': 'mxnet_cu112-1.9.1-py3-none-manylinux2014_x86_64.whl',
 'distribution': 'mxnet-cu112',
 'version': '1.9.1',
 'sha256': '70137a60eef49241b1137231bbd6bdeedbb0eca83e136f864ead36998814bfe5',
 'library': 'mxnet/libmxnet.so'}

#: ``{architecture: cubins}``: native machine code (SASS), e.g. 86 = sm_86.
SASS = {50: 198, 60: 198, 70: 198, 80: 198, 86: 198}

#: ``{architecture: PTX entries}``: code the driver can JIT-compile for newer GPUs.
PTX = {}

#: Fat binaries in the library.
CONTAINERS = 198

#: How the parse was checked against NVIDIA's tool.
CROSS_CHECK = 'cuobjdump 13.5.37 --list-elf/--list-ptx: same entries per architecture'
