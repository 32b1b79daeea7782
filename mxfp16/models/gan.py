"""The DCGAN of MXNet's ``example/gluon/dc_gan``: a 64 px generator and discriminator, and the discriminator's pass.

:func:`dcgan_generator` and :func:`dcgan_discriminator` have the example's
layers (MXNet 1.9.1: ``Conv2DTranspose`` 4x4 with BatchNorm and ReLU up from
a ``(nz, 1, 1)`` noise vector to 64x64 RGB with ``tanh``; ``Conv2D`` 4x4
with BatchNorm and LeakyReLU 0.2 down to two scores, real and fake, read by
softmax cross-entropy). The discriminator ends in a ``Flatten``, which the
example does with a ``reshape`` after the call.

:class:`DiscriminatorPass` is the forward pass of the example's
discriminator update: the discriminator on the real batch and on a
generated one whose gradient stops at the generator (``detach``). It also
returns the generated batch, which the generator's update then feeds to the
discriminator again, as the example does: the generator runs once per
iteration and its update back-propagates through that same forward pass.

Under AMP on a CPU, ``Deconvolution`` stays float32 (it is in MXNet's
float32 list), so the generator runs in float32 apart from its BatchNorm
and activations; the discriminator's convolutions run in bfloat16.
"""
from mxnet import gluon

__all__ = ["dcgan_generator", "dcgan_discriminator", "DiscriminatorPass", "IMAGE_SIZE"]

#: The side of the images: the layer sizes fix it (4 -> 8 -> 16 -> 32 -> 64 and back).
IMAGE_SIZE = 64


def dcgan_generator(nz=100, ngf=64, channels=3, prefix="generator_"):
    """Noise ``(batch, nz, 1, 1)`` -> images ``(batch, channels, 64, 64)`` in [-1, 1].

    Parameters
    ----------
    nz : int
        Length of the noise vector.
    ngf : int
        Channels of the last hidden layer; the earlier ones have 2, 4 and 8 times as many.
    channels : int
        Of the generated images.

    Returns
    -------
    gluon.nn.HybridSequential
        Not initialised (the example draws every weight from N(0, 0.02)).
    """
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        for i, width in enumerate((ngf * 8, ngf * 4, ngf * 2, ngf)):
            stride, pad = (1, 0) if i == 0 else (2, 1)  # 1x1 -> 4x4, then doubling
            net.add(gluon.nn.Conv2DTranspose(width, 4, stride, pad, use_bias=False), gluon.nn.BatchNorm(),
                    gluon.nn.Activation("relu"))
        net.add(gluon.nn.Conv2DTranspose(channels, 4, 2, 1, use_bias=False), gluon.nn.Activation("tanh"))
    return net


def dcgan_discriminator(ndf=64, prefix="discriminator_"):
    """Images ``(batch, channels, 64, 64)`` -> ``(batch, 2)`` scores (fake, real) for softmax cross-entropy.

    Parameters
    ----------
    ndf : int
        Channels of the first layer; the later ones have 2, 4 and 8 times as many.

    Returns
    -------
    gluon.nn.HybridSequential
        Not initialised.
    """
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(gluon.nn.Conv2D(ndf, 4, 2, 1, use_bias=False), gluon.nn.LeakyReLU(0.2))
        for width in (ndf * 2, ndf * 4, ndf * 8):
            net.add(gluon.nn.Conv2D(width, 4, 2, 1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.LeakyReLU(0.2))
        net.add(gluon.nn.Conv2D(2, 4, 1, 0, use_bias=False), gluon.nn.Flatten())
    return net


class DiscriminatorPass(gluon.Block):
    """The discriminator update's forward pass: ``(real, noise) -> (D(real), D(fake), fake)``.

    ``fake = generator(noise)``; the discriminator sees it detached, so the
    update's backward pass stops at the generator, and ``fake`` itself is
    returned with its history, for the generator's update. Not hybridized
    itself (the detach is between two graphs); the generator and
    discriminator inside it are.

    Parameters
    ----------
    generator, discriminator : gluon.Block
    """

    def __init__(self, generator, discriminator, **kwargs):
        super().__init__(**kwargs)
        self.generator, self.discriminator = generator, discriminator

    def forward(self, real, noise):
        fake = self.generator(noise)
        return self.discriminator(real), self.discriminator(fake.detach()), fake
