"""The MXNet side of each benchmark family: its networks, its synthetic batch and its timed step.

The step is what a user of the family's example runs, built from the library's own pieces: networks hybridized with
static memory and prepared by the run's :class:`~mxfp16.MixedPrecision`, batches through
:meth:`~mxfp16.MixedPrecision.cast_batch`, every update :meth:`~mxfp16.MixedPrecision.train_step`. The GAN's two
``train_step`` calls share the run's loss scaler (as one ``GradScaler`` serves several optimizers). Token ids are
int32: :func:`mxfp16.cast_batch` leaves integer arrays alone, where float16 would round ids above 2048.
"""
import random

import mxnet as mx
import numpy as np
from mxnet import gluon, init

from ..amp.bfloat16_weights import bfloat16_deconvolution
from ..amp.recurrent import unfuse_rnn
from .families import FAMILIES, TOKENS
from .networks import BertEncoderClassifier, DiscriminatorPass, WordLanguageModel, dcgan_discriminator, dcgan_generator

__all__ = ["build_networks", "synthetic_batch", "family_step"]


def build_networks(name, options, ctx=None):
    """A family's networks, initialised in float32 and materialised, not hybridized.

    Parameters
    ----------
    name, options : str, dict
        A family name and its resolved sizes.
    ctx : mx.Context or list of mx.Context, optional

    Returns
    -------
    dict
        ``{"net": block}``, or ``{"generator": ..., "discriminator": ...}`` for the GAN.

    Raises
    ------
    ValueError
        Sizes the layers cannot take (:mod:`mxfp16.bench.networks` says which).
    """
    o = options
    first = (ctx[0] if isinstance(ctx, (list, tuple)) else ctx) or mx.current_context()
    if name.startswith("word-lm-"):
        net = WordLanguageModel(name.rsplit("-", 1)[1], o["vocab"], o["embed"], o["hidden"], o["layers"],
                                o["dropout"], bool(o["tied"]), prefix="wordlm_")
        net.initialize(init.Xavier(), ctx=ctx)  # the example's; the embedding keeps its own Uniform(0.1)
        return {"net": net}
    if name == "bert-encoder":
        if o["seq_len"] > o["max_length"]:
            raise ValueError(f"seq_len={o['seq_len']} is longer than the position table (max_length="
                             f"{o['max_length']}); raise max_length or shorten seq_len")
        net = BertEncoderClassifier(o["classes"], o["vocab"], o["units"], o["heads"], o["ffn"], o["layers"],
                                    o["max_length"], o["dropout"], prefix="bertencoder_")
        net.initialize(init.Normal(0.02), ctx=ctx)
        net(mx.nd.zeros((1, o["seq_len"]), ctx=first, dtype="int32"))  # deferred shapes, in inference mode
        return {"net": net}
    if name == "dcgan":
        generator, discriminator = dcgan_generator(o["nz"], o["ngf"]), dcgan_discriminator(o["ndf"])
        for net, shape in ((generator, (1, o["nz"], 1, 1)), (discriminator, (1, 3, 64, 64))):
            net.initialize(init.Normal(0.02), ctx=ctx)  # the example's
            net(mx.nd.zeros(shape, ctx=first))
        return {"generator": generator, "discriminator": discriminator}
    raise ValueError(f"{name!r} is not a benchmark family: {', '.join(FAMILIES)}")


def synthetic_batch(name, options, batch_size, seed=0):
    """One fixed batch ``(data, label)`` of the family's shape (a step's speed does not depend on the values).

    Returns
    -------
    tuple
        Language models: int32 ids ``(batch, seq_len)`` and the next ids; the encoder: ids and a class per sequence;
        the GAN: real images in [-1, 1] and the labels ``(ones, zeros)`` of the real and the generated batch.
    """
    rng = np.random.RandomState(seed)
    if FAMILIES[name].unit == TOKENS:
        stream = rng.randint(0, options["vocab"], (batch_size, options["seq_len"] + 1))
        label = rng.randint(0, options["classes"], batch_size) if name == "bert-encoder" else stream[:, 1:]
        return mx.nd.array(stream[:, :-1], dtype="int32"), mx.nd.array(label, dtype="int32")
    real = rng.uniform(-1, 1, (batch_size, 3, 64, 64)).astype(np.float32)
    return mx.nd.array(real), (mx.nd.ones((batch_size,)), mx.nd.zeros((batch_size,)))


def family_step(spec, mixed, batches, nets=None):
    """The family's training step for ``spec``, built through ``mixed``; returns ``step()`` -> a loss array.

    Parameters
    ----------
    spec : mxfp16.bench.runner.BenchSpec
        ``model`` a family name, ``options`` its resolved sizes.
    mixed : MixedPrecision
        Created before the networks (AMP, when on, must see them built).
    batches : object
        ``next()`` gives :func:`synthetic_batch`'s batch.
    nets : dict, optional
        The networks :func:`build_networks` returns, on ``mixed.ctx``; by default built here, seeded with ``spec.seed``.

    Notes
    -----
    With the option ``unfused_bf16=1`` a language model's recurrent layers
    run unfused (:func:`mxfp16.amp.unfuse_rnn`) when ``mixed`` is
    amp-bfloat16, so that their matrix products run in bfloat16: MXNet's
    fused ``RNN`` has no bfloat16 kernel, and on the AMX VM its float32
    reference kernel was 56% of oneDNN's time (docs/benchmarks.md, "With
    AMX"). Float32 rows keep the fused layer, the faster one in float32, so
    a run's ratio compares the two routes a user would pick.

    With ``bf16_deconv=1`` the GAN's generator gets bfloat16 weights in its
    transposed convolutions (:func:`mxfp16.amp.bfloat16_deconvolution`)
    when ``mixed`` is amp-bfloat16, so that they run in bfloat16, not in
    float32 as AMP runs ``Deconvolution``; its trainer keeps their float32
    master copies.
    """
    fam = FAMILIES[spec.model]
    if nets is None:
        mx.random.seed(spec.seed)
        np.random.seed(spec.seed)
        random.seed(spec.seed)
        nets = build_networks(spec.model, spec.options, mixed.ctx)
    amp_bfloat16 = mixed.precision.amp and mixed.precision.compute_dtype == "bfloat16"
    if spec.options.get("unfused_bf16") and amp_bfloat16:
        unfuse_rnn(nets["net"], steps=spec.options["seq_len"])  # layout NTC: the graph is traced for seq_len steps
    if spec.options.get("bf16_deconv") and amp_bfloat16:
        bfloat16_deconvolution(nets["generator"])  # before prepare(): its trainer keeps their float32 masters
    for net in nets.values():
        net.hybridize(static_alloc=True, static_shape=True)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    if "net" in nets:
        net = nets["net"]
        trainer = mixed.prepare(net, fam.optimizer, dict(fam.optimizer_params))

        def step():
            data, label = mixed.cast_batch(*batches.next())
            return mixed.train_step(net, loss, trainer, data, label, clip_grad_norm=fam.clip_grad_norm).loss
        return step

    generator, discriminator = nets["generator"], nets["discriminator"]
    trainer_g = mixed.prepare(generator, fam.optimizer, dict(fam.optimizer_params))
    trainer_d = mixed.prepare(discriminator, fam.optimizer, dict(fam.optimizer_params))
    d_pass = DiscriminatorPass(generator, discriminator)
    nz = spec.options["nz"]

    def d_loss(outputs, real_label, fake_label):
        return loss(outputs[0], real_label), loss(outputs[1], fake_label)

    def step():
        real, labels = batches.next()
        noise = mx.nd.random.normal(0, 1, shape=(real.shape[0], nz, 1, 1), ctx=real.ctx)
        data, label = mixed.cast_batch((real, noise), labels)
        fakes = [outputs[2] for outputs in mixed.train_step(d_pass, d_loss, trainer_d, data, label).outputs]
        return mixed.train_step(discriminator, loss, trainer_g, fakes, [y[0] for y in label]).loss
    return step
