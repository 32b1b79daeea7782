"""Measuring on this machine: what is timed, how a measurement decides, and where its result is kept.

One engine behind ``auto`` and the ``measured`` AMP lists: :mod:`~mxfp16.measure.timing` times a step;
:mod:`~mxfp16.measure.probe` times a network's training step in a forked copy of this process
and :mod:`~mxfp16.measure.layer_timing` times single layers in a fresh one; :mod:`~mxfp16.measure.margin` is the one
rule both decide by (bfloat16 only when :data:`~mxfp16.measure.margin.MARGIN` times as fast as float32);
:mod:`~mxfp16.measure.cache` keeps their results per machine in one format (``auto-precision.json`` and
``amp-layers.json`` in ``$MXFP16_CACHE_DIR`` or ``$XDG_CACHE_HOME/mxfp16``). :mod:`~mxfp16.measure.auto` decides
``auto`` for a network; :mod:`~mxfp16.measure.per_layer` decides each layer's dtype.
"""
