"""Just enough ELF to read a shared library's dependencies and one section.

mxfp16 reads two things from ``libmxnet.so`` without loading it: its ``DT_NEEDED`` entries (which CUDA libraries it
links) and the file range of a named section (``.nv_fatbin``, the GPU kernels). The preload runs on every ``import
mxfp16``, before MXNet, so this is standard library only and reads a few hundred bytes with seeks, never the whole
file (891 MB in the GPU wheel); pyelftools is not worth a dependency of every install. Only 64-bit little-endian ELF
is read (MXNet's wheels are x86_64 and aarch64 Linux builds).
"""
import itertools
import struct
from dataclasses import dataclass

__all__ = ["ElfError", "DynamicInfo", "dynamic_info", "section_ranges"]

_MAGIC = b"\x7fELF"
_ELFCLASS64, _ELFDATA2LSB = 2, 1
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
_SHT_NOBITS = 8


class ElfError(ValueError):
    """The file is not a 64-bit little-endian ELF object, or is truncated."""


@dataclass(frozen=True)
class DynamicInfo:
    """The dependency entries of one shared object's dynamic section.

    Attributes
    ----------
    needed : tuple of str
        ``DT_NEEDED`` sonames in file order, e.g. ``('libcudnn.so.8', ...)``.
    soname : str or None
    runpath : tuple of str
        ``DT_RUNPATH`` (or, if absent, ``DT_RPATH``) folders, unexpanded (``$ORIGIN`` stays).
    """

    needed: tuple
    soname: object
    runpath: tuple


def _read(handle, offset, size):
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise ElfError(f"{getattr(handle, 'name', 'file')}: truncated at byte {offset}")
    return data


def _header(handle):
    ident = _read(handle, 0, 64)
    if ident[:4] != _MAGIC:
        raise ElfError(f"{getattr(handle, 'name', 'file')} is not an ELF file")
    if ident[4] != _ELFCLASS64 or ident[5] != _ELFDATA2LSB:
        raise ElfError(f"{getattr(handle, 'name', 'file')} is not a 64-bit little-endian ELF file")
    phoff, shoff = struct.unpack_from("<QQ", ident, 32)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", ident, 54)
    return phoff, phentsize, phnum, shoff, shentsize, shnum, shstrndx


def _program_headers(handle, phoff, phentsize, phnum):
    table = _read(handle, phoff, phentsize * phnum)
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        yield p_type, offset, vaddr, filesz


def _cstring(handle, offset, limit=4096):
    handle.seek(offset)
    data = handle.read(limit)
    end = data.find(b"\0")
    if end < 0:
        raise ElfError(f"{getattr(handle, 'name', 'file')}: unterminated string at byte {offset}")
    return data[:end].decode("utf-8", "replace")


def dynamic_info(path):
    """Read the ``DT_NEEDED``, ``DT_SONAME`` and run-path entries of a shared object.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    DynamicInfo
        Empty for a statically linked file (no ``PT_DYNAMIC``).

    Raises
    ------
    ElfError
        Not a 64-bit little-endian ELF file, or truncated.
    OSError
        The file cannot be read.
    """
    with open(path, "rb") as handle:
        phoff, phentsize, phnum, *_ = _header(handle)
        headers = list(_program_headers(handle, phoff, phentsize, phnum))
        dynamic = next(((off, size) for kind, off, _v, size in headers if kind == _PT_DYNAMIC), None)
        if dynamic is None:
            return DynamicInfo((), None, ())
        table = _read(handle, dynamic[0], dynamic[1])
        whole = struct.iter_unpack("<qQ", table[:len(table) - len(table) % 16])
        entries = list(itertools.takewhile(lambda entry: entry[0] != _DT_NULL, whole))
        strtab_addr = next((v for t, v in entries if t == _DT_STRTAB), None)
        if strtab_addr is None:
            raise ElfError(f"{path}: dynamic section without a string table")
        # DT_STRTAB is an address; the PT_LOAD segment holding it says where it is in the file.
        strtab = next((off + strtab_addr - vaddr for kind, off, vaddr, size in headers
                       if kind == _PT_LOAD and vaddr <= strtab_addr < vaddr + size), None)
        if strtab is None:
            raise ElfError(f"{path}: the dynamic string table is outside every loadable segment")
        text = {tag: [] for tag in (_DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH)}
        for tag, value in entries:
            if tag in text:
                text[tag].append(_cstring(handle, strtab + value))
    runpath = text[_DT_RUNPATH] or text[_DT_RPATH]
    folders = [folder for entry in runpath for folder in entry.split(":") if folder]
    return DynamicInfo(tuple(text[_DT_NEEDED]), (text[_DT_SONAME] or [None])[0], tuple(folders))


def section_ranges(path, name):
    """File ranges of every section called ``name``.

    Parameters
    ----------
    path : str or os.PathLike
    name : str
        e.g. ``'.nv_fatbin'``.

    Returns
    -------
    list of (int, int)
        ``(file offset, size)`` per matching section, in section-table order (none where the table was stripped).
    """
    with open(path, "rb") as handle:
        *_, shoff, shentsize, shnum, shstrndx = _header(handle)
        if not shoff or not shnum:
            return []
        table = _read(handle, shoff, shentsize * shnum)

        def entry(index):
            sh_name, sh_type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", table, index * shentsize)
            return sh_name, sh_type, offset, size

        names_offset = entry(shstrndx)[2]
        ranges = []
        for index in range(shnum):
            sh_name, sh_type, offset, size = entry(index)
            if sh_type != _SHT_NOBITS and _cstring(handle, names_offset + sh_name) == name:
                ranges.append((offset, size))
    return ranges
