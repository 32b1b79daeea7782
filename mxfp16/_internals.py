"""Private MXNet, ONNX and GluonCV names: the module where mxfp16 reaches them, each behind a named helper.

Importing this module imports none of them.
"""
import contextlib
import ctypes
import importlib

from ._lazy import module

mx = module("mxnet")
_amp = module("mxnet.contrib.amp")


# MXNet and Gluon.


def amp_initialized():
    """True once ``mx.contrib.amp.init()`` has run in this process."""
    return bool(_amp.amp._amp_initialized)


def trainer_params(trainer):
    """The parameters a ``gluon.Trainer`` updates, in its index order."""
    return list(trainer._params)


def grad_is_fresh(param):
    """Whether a backward pass wrote ``param``'s gradient (every device's) since its last update (Gluon's flag)."""
    if param_is_deferred(param):
        return False
    return all(data._fresh_grad for data in param.list_data())


def param_is_deferred(param):
    """Whether ``param`` still waits for a forward pass to learn its shape (no data, no gradient yet)."""
    return param._data is None


def set_grads_fresh(params, fresh):
    """Mark the parameters' gradients as written by this step's backward (``True``) or as applied (``False``)."""
    for param in params:
        for data in param.list_data():
            data._fresh_grad = fresh


def trainer_updates_on_kvstore(trainer):
    """Whether ``trainer`` applies updates on the kvstore (resolved lazily by Gluon)."""
    _init_kvstore(trainer)
    return bool(trainer._kvstore) and bool(trainer._update_on_kvstore)


def _init_kvstore(trainer):
    """Gluon's lazy kvstore set-up, made now, also while some parameters await their deferred initialisation.

    ``Trainer._init_kvstore`` asks every parameter for its data, and a deferred one (an unused head) raises
    ``DeferredInitializationError``; they are lent a one-element stand-in (only the ``local`` kvstore reads it).
    """
    if trainer._kv_initialized:
        return
    deferred = [param for param in trainer._params if param_is_deferred(param)]
    for param in deferred:
        param.data = lambda ctx=None: mx.nd.zeros((1,))  # an attribute of this object, hiding the method
    try:
        trainer._init_kvstore()
    finally:
        for param in deferred:
            del param.data


def trainer_update_on_kvstore_setting(trainer):
    """What ``update_on_kvstore`` the trainer was built with (``None``: Gluon decides when the kvstore starts)."""
    return trainer._kvstore_params["update_on_kvstore"]


def trainer_init_kvstore_params(trainer):
    """Create the trainer's kvstore and put the parameters in it now.

    Gluon does this lazily inside the first ``allreduce_grads`` / ``step``,
    after the first backward pass; with a dist kvstore that first step then
    uses each worker's own initial parameters, and the broadcast's pull can
    race with the first gradient push (see :func:`mxfp16.distributed.sync_parameters`).
    """
    _init_kvstore(trainer)
    if trainer._params_to_init:
        trainer._init_params()


def block_children(block):
    """A Block's direct children, in registration order."""
    return list(block._children.values())


def built_graphs(block):
    """``[(block, output symbol)]`` for each graph the hybridized blocks in ``block`` have built and run on.

    A block that is not hybridized may hold a graph too (Gluon infers deferred
    shapes with one), but it runs imperatively, so that graph does not count.
    """
    graph = getattr(block, "_cached_graph", ())
    if graph and block_is_hybridized(block):
        return [(block, graph[1])]
    return [found for child in block_children(block) for found in built_graphs(child)]


def block_is_hybridized(block):
    """Whether ``hybridize()`` took effect on ``block``."""
    return bool(getattr(block, "_active", False))


@contextlib.contextmanager
def hybridization_paused(blocks):
    """Within the context, ``blocks`` run imperatively; afterwards each is hybridized as before.

    ``hybridize(False)`` would drop a block's flags (``static_alloc`` ...).
    """
    saved = [(block, block._active, list(block._flags)) for block in blocks if block_is_hybridized(block)]
    for block, _, _ in saved:
        block._active = False
        block._clear_cached_op()
    try:
        yield [block for block, _, _ in saved]
    finally:
        for block, active, flags in saved:
            block._active, block._flags = active, flags
            block._clear_cached_op()


def rebuild_graphs(block):
    """Drop the graphs the hybridized blocks in ``block`` built, so the next forward pass traces them again.

    A graph traced before AMP was switched on stays float32 otherwise; the blocks stay hybridized.
    """
    block.apply(lambda b: b._clear_cached_op() if hasattr(b, "_clear_cached_op") else None)
    renew_parameter_symbols(block)


def renew_parameter_arrays(block):
    """Give each initialised parameter of ``block`` new arrays with its values, in MXNet's own layout.

    On a CPU, an inference pass reorders a convolution's float32 weight in
    place into oneDNN's blocked layout, and AMP's cast of such a weight to
    bfloat16 fails for a grouped convolution ("could not create a primitive
    descriptor for a reorder primitive"). The gradients are new too (zeros):
    for a network about to train, not between the steps of one.
    """
    for param in block.collect_params().values():
        try:
            ctx = param.list_ctx()
            param.data(ctx[0])  # raises for a parameter not initialised yet and for a sparse one: left alone
        except RuntimeError:
            continue
        param.reset_ctx(ctx)


def block_op_kwargs(block):
    """The operator arguments a Gluon layer was built with (e.g. ``num_group``)."""
    return dict(getattr(block, "_kwargs", {}))


def block_operator(block):
    """The operator a Gluon convolution layer calls (``'Convolution'``, ``'Deconvolution'``), else ``None``."""
    return getattr(block, "_op_name", None)


class RNNSettings:
    """What a ``gluon.rnn`` layer (``LSTM``, ``GRU``, ``RNN``) was built with, read from its private fields.

    ``state_clip`` is the LSTM cell state clipping's ``(min, max, nan)`` (``None`` entries: off).
    """

    def __init__(self, layer):
        self.mode, self.hidden_size, self.num_layers = layer._mode, layer._hidden_size, layer._num_layers
        self.directions, self.layout, self.dropout = layer._dir, layer._layout, layer._dropout
        self.dtype, self.projection_size = layer._dtype, layer._projection_size
        self.state_clip = (layer._lstm_state_clip_min, layer._lstm_state_clip_max, layer._lstm_state_clip_nan)
        self.use_sequence_length = layer._use_sequence_length


def renew_parameter_symbols(block):
    """Drop the symbols ``Parameter.var()`` cached, so the next trace declares each parameter's current dtype.

    ``Parameter.var()`` keeps the symbol it first made, with the dtype the
    parameter had then; ``cast()`` does not renew it, so a network cast to
    float16 after its first trace would declare float32 weights.
    """
    for param in block.collect_params().values():
        param._var = None


def sparse_label_axis(loss):
    """The output axis a Gluon ``SoftmaxCrossEntropyLoss`` with ``sparse_label`` picks its classes from, or ``None``."""
    from mxnet import gluon

    if isinstance(loss, gluon.loss.SoftmaxCrossEntropyLoss) and loss._sparse_label:
        return loss._axis
    return None


def trainer_updater_states(trainer):
    """``{parameter index: optimizer state}`` of the trainer's (first) updater.

    With ``update_on_kvstore=False`` every device has an updater; they hold
    the same states after each step, as ``Trainer.save_states`` assumes.
    """
    if trainer_updates_on_kvstore(trainer):
        raise ValueError("the optimizer states live on the kvstore (update_on_kvstore=True); "
                         "build the trainer with update_on_kvstore=False to checkpoint them")
    return dict(trainer._updaters[0].states)


def set_trainer_updater_states(trainer, states):
    """Give every updater ``states`` (each moves them to its device at its next update)."""
    if trainer_updates_on_kvstore(trainer):
        raise ValueError("the optimizer states live on the kvstore (update_on_kvstore=True)")
    for updater in trainer._updaters:
        updater.states = dict(states)
        updater.states_synced = dict.fromkeys(states, False)


def optimizer_update_counts(trainer):
    """The optimizer's update counters (the LR schedule's position and Adam's bias correction read them)."""
    optimizer = trainer.optimizer
    return {"num_update": int(optimizer.num_update),
            "index_update_counts": {str(device): {str(i): int(n) for i, n in counts.items()}
                                    for device, counts in optimizer._all_index_update_counts.items()}}


def set_optimizer_update_counts(trainer, counts):
    """Restore :func:`optimizer_update_counts` into the trainer's optimizer."""
    optimizer = trainer.optimizer
    optimizer.num_update = int(counts["num_update"])
    optimizer._all_index_update_counts = {int(device): {int(i): int(n) for i, n in per.items()}
                                          for device, per in counts["index_update_counts"].items()}
    optimizer._all_index_update_counts.setdefault(0, {})
    optimizer._index_update_count = optimizer._all_index_update_counts[0]


def saved_parameter_shapes(block):
    """``{name: shape}`` as ``Block.save_parameters`` names the block's parameters (structural names)."""
    return {name: tuple(p.shape) for name, p in block._collect_params_with_prefix().items()}


def operator_aliases():
    """``{operator: every registered name of the same operator}``: ``_npx_fully_connected`` is ``FullyConnected``.

    The names MXNet registers for one operator (``add_alias``) share one handle.
    """
    from mxnet.base import _LIB, OpHandle, c_str, check_call

    by_handle = {}
    for name in mx.operator.get_all_registered_operators():
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        by_handle.setdefault(handle.value, []).append(name)
    return {name: sorted(names) for names in by_handle.values() for name in names}


#: How MXNet 1.9.1 names the functions of numpy-mode operators (``mxnet/base.py``,
#: ``_init_np_op_module``): prefix -> (namespaces, submodule prefixes).
_NUMPY_NAMESPACES = {
    "_np_": (("mxnet.numpy", "mxnet.ndarray.numpy", "mxnet.symbol.numpy"), ("_random_", "_linalg_")),
    "_npx_": (("mxnet.numpy_extension", "mxnet.ndarray.numpy_extension", "mxnet.symbol.numpy_extension"),
              ("_image_", "_random_")),
    "_npi_": (("mxnet.ndarray.numpy._internal", "mxnet.symbol.numpy._internal"), ()),
}


def numpy_operator_functions(name):
    """The functions MXNet generated for numpy-mode operator ``name``: ``[(module, attribute)]``, one per namespace."""
    from mxnet.base import _get_op_submodule_name

    for prefix, (namespaces, submodules) in _NUMPY_NAMESPACES.items():
        if not name.startswith(prefix):
            continue
        sub = _get_op_submodule_name(name, prefix, list(submodules))
        attribute = name[len(prefix) + len(sub):]
        homes = []
        for namespace in namespaces:  # _npi_ names are in ._internal itself, others in their submodule or ._op
            module = importlib.import_module(
                namespace if namespace.endswith("._internal") else f"{namespace}.{sub[1:-1] or '_op'}")
            if hasattr(module, attribute):
                homes.append((module, attribute))
        return homes
    return []


def legacy_operator_functions(name):
    """The functions MXNet generated for legacy operator ``name``: ``[(module, attribute)]``, as AMP finds them.

    Found by AMP's private ``_get_fun_to_wrap``, so mxfp16 wraps exactly the bindings AMP wraps.
    """
    from mxnet import base, ndarray, symbol
    from mxnet.contrib.amp.amp import _get_fun_to_wrap

    homes = []
    for namespace in (symbol, ndarray):
        try:
            submodules = {p: getattr(namespace, p[1:-1]) for p in base._OP_NAME_PREFIX_LIST}
            attribute, where = _get_fun_to_wrap(name, namespace, submodules)
            targets = [where] + ([namespace.op] if where is namespace else [])
            for target in targets:
                getattr(target, attribute)
        except AttributeError:
            continue  # not an operator of this MXNet build
        homes += [(target, attribute) for target in targets]
    return homes


def numpy_symbol_class():
    """The class of numpy-mode graph nodes (``mxnet.symbol.numpy._Symbol``), what ``F.np`` builds when hybridized.

    It subclasses the legacy ``Symbol``, so ``isinstance(x, mx.sym.Symbol)`` cannot tell the two modes apart.
    """
    from mxnet.symbol.numpy import _Symbol

    return _Symbol


def rebuild_symbol(node, inputs):
    """Legacy graph node ``node``'s operator, with its arguments and name, built again on ``inputs``.

    What AMP's symbol wrapper does to cast a node's inputs: ``Symbol`` has
    no public way to do it (``_gen_atomic_symbol``, ``_set_attr``).
    """
    rebuilt = node._gen_atomic_symbol()(*inputs)
    rebuilt._set_attr(name=node.name)
    return rebuilt


class _OpenMPSwitch(ctypes.Structure):
    """The first members of MXNet 1.9.1's ``engine::OpenMP`` singleton (``src/engine/openmp.h``), in their order.

    Read as bytes, not ``c_bool``, so that memory that is not this class shows as values a bool cannot take.
    """

    _fields_ = [("enabled", ctypes.c_uint8), ("thread_max", ctypes.c_int), ("reserve_cores", ctypes.c_int),
                ("threads_from_environment", ctypes.c_uint8)]


def _openmp_singleton():
    """MXNet's ``engine::OpenMP::Get()``, seen through :class:`_OpenMPSwitch`; ``None`` where it is not exported."""
    try:
        get = mx.base._LIB._ZN5mxnet6engine6OpenMP3GetEv
    except AttributeError:
        return None
    get.restype = ctypes.c_void_p
    return _OpenMPSwitch.from_address(get())


def mxnet_openmp_ceiling():
    """The thread ceiling of the OpenMP switch MXNet's own (non-oneDNN) kernels ask how many threads to use.

    ``None`` where it cannot be read, or where what is read is not what that class holds in a process that has not
    forked (a build with another layout).
    """
    switch = _openmp_singleton()
    if switch is None or switch.enabled != 1 or not 0 < switch.thread_max <= 65536 \
            or switch.threads_from_environment not in (0, 1) or switch.reserve_cores < 0:
        return None
    return switch.thread_max


def mxnet_kernel_threads():
    """How many OpenMP threads MXNet's own kernels take now (``OpenMP::GetRecommendedOMPThreadCount``), or None."""
    switch = _openmp_singleton()
    if switch is None:
        return None
    count = mx.base._LIB._ZNK5mxnet6engine6OpenMP28GetRecommendedOMPThreadCountEb
    count.argtypes, count.restype = [ctypes.c_void_p, ctypes.c_bool], ctypes.c_int
    return count(ctypes.addressof(switch), True)


def restore_mxnet_openmp(ceiling):
    """In a forked child, undo what MXNet's fork handler does to its own kernels' threads; True if it did.

    MXNet's ``atfork_child`` (``src/initialize.cc``) turns that switch off and its ceiling to 1, so its own kernels
    (``clip``, elementwise operators, casts) run on one thread in a child while oneDNN keeps its threads. A child
    that times a step wants the parent's: ``ceiling`` is :func:`mxnet_openmp_ceiling`, read in the parent before the
    fork. Nothing is written unless the switch holds exactly what the handler leaves.
    """
    switch = _openmp_singleton()
    if ceiling is None or switch is None or (switch.enabled, switch.thread_max) != (0, 1):
        return False
    switch.thread_max, switch.enabled = ceiling, 1
    return True


# GluonCV: its model zoo's registry.


def gluoncv_model_modules():
    """``{model name: the module that builds it}`` for every model GluonCV's model zoo registers, in its order.

    Only the zoo's private ``_models`` table lists them all (``get_model_list``
    is a hand-kept subset).
    """
    from .models.gluoncv import import_gluoncv

    registry = import_gluoncv().model_zoo.model_zoo._models
    return {name: getattr(constructor, "__module__", "") for name, constructor in registry.items()}


# ONNX: MXNet 1.9.1's exporter (mx2onnx), and the onnx checker it calls.


def mx2onnx_graph(symbol, weights, input_shape, opset, on_node):
    """The ONNX graph MXNet 1.9.1's exporter (mx2onnx) builds for a float32 ``symbol``, batch axis left free.

    ``mx.onnx.export_model`` writes a file for onnx's newest opset; the
    private ``MXNetGraph`` returns the ``GraphProto``, built for ``opset``.
    Two of its habits are changed while it converts, and restored after:

    - every node (a dict with ``op`` and ``name``) is handed to ``on_node``
      before its converter runs, so a converter's failure can be blamed on
      its layer;
    - its check of the bare graph (``onnx.checker.check_graph``) is skipped:
      it judges by the newest opset, where ``ReduceMean`` takes no ``axes``
      attribute. The caller checks the finished model for ``opset``.

    ``weights`` is ``{parameter name: NDArray}`` without ``arg:``/``aux:``
    prefixes; ``input_shape`` is the one input's, without its batch axis.
    """
    import onnx.checker
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph

    convert_layer, check_graph = MXNetGraph.convert_layer, onnx.checker.check_graph

    def announced(node, **kwargs):
        on_node(node)
        return convert_layer(node, **kwargs)

    shape = (1,) + tuple(int(n) for n in input_shape)  # the 1 only seeds the converters: the axis is dynamic
    MXNetGraph.convert_layer = staticmethod(announced)
    onnx.checker.check_graph = lambda *args, **kwargs: None
    try:
        return MXNetGraph().create_onnx_graph_proto(symbol, weights, [shape], [onnx.TensorProto.FLOAT],
                                                    opset_version=opset, dynamic=True,
                                                    dynamic_input_shapes=[(None,) + shape[1:]])
    finally:
        MXNetGraph.convert_layer, onnx.checker.check_graph = staticmethod(convert_layer), check_graph
