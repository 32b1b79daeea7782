"""Package exports and modules that load on first use, so importing mxfp16's modules does not load MXNet.

MXNet fixes its thread count and loads its CUDA libraries when it is first
imported; ``mxfp16``, ``mxfp16.train`` and ``mxfp16.bench`` must be importable
before that (``python -m mxfp16.train --threads N``), and ``--help`` answers
whatever MXNet's environment holds.
"""
import importlib

__all__ = ["exports", "module"]


def exports(package, table, mxnet_free=()):
    """``(__getattr__, __dir__)`` for ``package`` that import ``table[name]`` on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    table : dict
        ``{public name: module name relative to the package}``.
    mxnet_free : collection of str
        Modules of ``table`` that import no MXNet: their names load without it
        (an environment with onnxruntime and no MXNet uses them).
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if table[name] not in mxnet_free:
            from .machine.stack import import_mxnet

            import_mxnet()  # a missing wheel, or a CUDA library that cannot load, is named here with the fix
        value = getattr(importlib.import_module(f".{table[name]}", package), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


class _Deferred:
    """A stand-in for module ``name`` (``'mxnet'``, ``'mxnet.gluon'``) that imports it when first used.

    For modules that use MXNet only inside their functions: ``mx =
    module("mxnet")`` in place of ``import mxnet as mx`` keeps importing them
    free of MXNet, and the first ``mx.nd`` loads it, after
    :func:`mxfp16.machine.stack.import_mxnet`.
    """

    def __init__(self, name):
        self.__dict__["_name"] = name

    def __getattr__(self, attr):
        from .machine.stack import import_mxnet

        import_mxnet()  # the environment checked, the stack prepared, a missing CUDA library named
        value = getattr(importlib.import_module(self._name), attr)
        self.__dict__[attr] = value  # later look-ups skip this function
        return value

    def __repr__(self):
        return f"<{self._name}, imported on first use>"


module = _Deferred
