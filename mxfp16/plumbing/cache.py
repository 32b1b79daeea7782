"""Measurements kept between runs: one JSON file per kind, a dictionary of records by key, in the user's cache.

``auto``'s verdicts (:mod:`mxfp16.auto`) and the per-layer timings
(:mod:`mxfp16.per_layer`) are measured once per machine and kept here. A
file that is damaged, of another version or missing reads as empty: what it
held is measured again and the file rewritten whole, never patched.
"""
import os

from .fileio import JSONFileError, read_json, write_json

__all__ = ["cache_folder", "KeyedCache"]


def cache_folder(environ=None):
    """``$MXFP16_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxfp16`` (``~/.cache/mxfp16`` by default)."""
    environ = os.environ if environ is None else environ
    return environ.get("MXFP16_CACHE_DIR") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "mxfp16")


class KeyedCache:
    """A JSON file ``{"version": N, section: {key: record}}``.

    Parameters
    ----------
    path : str
    version : int
        A file of another version reads as empty (its records' meaning changed).
    section : str
        The name of the dictionary of records (``'verdicts'``).
    """

    def __init__(self, path, version, section):
        self.path, self.version, self.section = path, version, section

    def read(self):
        """``{key: record}``; empty for a missing, damaged or other-version file."""
        try:
            doc = read_json(self.path, default={})
        except JSONFileError:
            return {}
        if not isinstance(doc, dict) or doc.get("version") != self.version or not isinstance(
                doc.get(self.section), dict):
            return {}
        return doc[self.section]

    def keep(self, records, log=print):
        """Add ``records`` (``{key: record}``) to what the file holds now (another process may have added some).

        An unwritable cache costs a measurement next time, nothing more: it
        is told to ``log`` and otherwise ignored.
        """
        held = self.read()
        held.update(records)
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            write_json(self.path, {"version": self.version, self.section: held})
        except OSError as err:
            log(f"could not keep the measurement in {self.path} ({err.strerror or err}); it is measured again "
                "next time")
