"""Checking an MXNet graph file (``*-symbol.json``) before MXNet parses it.

``mx.sym.load`` trusts its file: a graph whose node reads a later node (a
cycle), one of 200,000 nodes, or a 300 MB file each end in an MXNet
traceback or a long stall, and a file that is not JSON at all has its first
line printed in MXNet's error. :func:`check_graph` reads the file with
:func:`mxfp16.plumbing.fileio.read_json`'s limits and checks the structure MXNet
writes (``nnvm::Graph`` saved by ``Symbol.save``): a ``nodes`` list whose
entries name an ``op`` and list their ``inputs`` as ``[node, output,
version]`` of *earlier* nodes (MXNet saves them in topological order, so an
input at or after its node is a cycle), ``arg_nodes`` that are variables,
and ``heads`` that are nodes. Its messages never quote the file's content.
"""
import os

from .fileio import JSONFileError, parse_json
from .output import shown

__all__ = ["GraphFileError", "check_graph", "MAX_GRAPH_BYTES", "MAX_NODES", "MAX_DEPTH"]

#: The largest graph file read (an AMP ResNet-152 is well under 1 MB).
MAX_GRAPH_BYTES = 32 << 20
#: The most nodes a graph may have (ResNet-152 with AMP casts has a few thousand).
MAX_NODES = 100_000
#: The longest chain of nodes from an input to an output.
MAX_DEPTH = 20_000


class GraphFileError(ValueError):
    """A graph file MXNet should not be asked to parse; the message names the file and the problem."""


def _entry(value, count, limit):
    """The node index of an ``[node, output, version]`` entry, if it is one and points below ``limit``."""
    if not isinstance(value, list) or len(value) not in (2, 3) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return value[0] if 0 <= value[0] < min(limit, count) and value[1] >= 0 else None


def check_graph(path, fix="export the run again"):
    """Refuse (:class:`GraphFileError`) a graph file that is too large, not MXNet's structure, cyclic, or too deep.

    Parameters
    ----------
    path : str or Path
    fix : str
        What the user should do; ends every message.

    Returns
    -------
    dict
        ``nodes`` and ``depth`` of the graph.
    """
    where = shown(path)
    graph = _read_graph(path, where, fix)
    nodes = graph["nodes"]
    if not nodes or len(nodes) > MAX_NODES:
        raise GraphFileError(f"{where} has {len(nodes):,} nodes; a graph mxfp16 exports has between 1 and "
                             f"{MAX_NODES:,}; {fix}")
    depth = _depths(nodes, where, fix)
    for value in graph["arg_nodes"]:
        if not (isinstance(value, int) and 0 <= value < len(nodes) and nodes[value]["op"] == "null"):
            raise GraphFileError(f"{where}: an input of the graph (arg_nodes) is not one of its variables; {fix}")
    if not graph["heads"] or any(_entry(v, len(nodes), len(nodes)) is None for v in graph["heads"]):
        raise GraphFileError(f"{where}: the graph's outputs (heads) are not nodes of the graph; {fix}")
    return {"nodes": len(nodes), "depth": max(depth)}


def _read_graph(path, where, fix):
    """The parsed graph file, refused before parsing when it is too large or has too many nodes to walk."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_GRAPH_BYTES:
            raise GraphFileError(f"{where} is {size / 2 ** 20:.0f} MB, more than the {MAX_GRAPH_BYTES >> 20} MB a "
                                 f"graph mxfp16 exports can be; {fix}")
        raw = handle.read(MAX_GRAPH_BYTES + 1)
    # Every node names its op: counting them first spares parsing (and walking) a graph far too large.
    if raw.count(b'"op"') > MAX_NODES:
        raise GraphFileError(f"{where} has more than {MAX_NODES:,} nodes; a graph mxfp16 exports has fewer; {fix}")
    try:
        return parse_json(raw.decode("utf-8"), where, fix, fields={"nodes": list, "arg_nodes": list, "heads": list})
    except UnicodeDecodeError:
        raise GraphFileError(f"{where} is not UTF-8 text; {fix}") from None
    except JSONFileError as err:
        raise GraphFileError(f"{err} (a graph mxfp16 exports is an MXNet symbol file)") from None


def _depths(nodes, where, fix):
    """Each node's longest path from an input, refusing a node that is not one or reads a later node (a cycle)."""
    depth = [0] * len(nodes)
    for index, node in enumerate(nodes):
        if not (isinstance(node, dict) and isinstance(node.get("op"), str) and isinstance(node.get("inputs"), list)):
            raise GraphFileError(f"{where}: node {index} is not an MXNet graph node (an op and its inputs); {fix}")
        for value in node["inputs"]:
            source = _entry(value, len(nodes), index)
            if source is None:
                raise GraphFileError(f"{where}: node {index} reads an input that is not an earlier node of the graph "
                                     f"(a cycle, or a damaged file); {fix}")
            depth[index] = max(depth[index], depth[source] + 1)
        if depth[index] > MAX_DEPTH:
            raise GraphFileError(f"{where} is more than {MAX_DEPTH:,} nodes deep; a graph mxfp16 exports is far "
                                 f"shallower; {fix}")
    return depth
