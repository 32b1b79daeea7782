"""The PyTorch twins of the benchmark families and of MobileNet v2, and the families' training steps (torch only).

Each network has its MXNet twin's layers and sizes (the tests check the parameter counts against each other), with
PyTorch's own layers where they exist (``nn.LSTM``, ``nn.GRU``, ``nn.MultiheadAttention``), as a PyTorch user would
write them; :func:`mobilenet_v2` is built here because torchvision does not import beside every torch wheel, and its
network differs in the head. The sizes, the optimizer and the clipping come from :mod:`mxfp16.bench.families`.
:func:`family_step` builds a family's step; the GAN's is one iteration of both updates, as the MXNet side times it.
"""
import torch
import torch.nn.functional as F
from torch import nn

from .families import FAMILIES, TOKENS

__all__ = ["word_language_model", "bert_encoder_classifier", "mobilenet_v2", "dcgan_generator",
           "dcgan_discriminator", "family_step", "optimizer"]


def word_language_model(mode, options):
    """Embedding -> dropout -> ``nn.LSTM``/``nn.GRU`` -> dropout -> decoder tied to the embedding. Both PyTorch
    recurrent layers keep two biases per gate (input and recurrent), as MXNet's ``i2h`` and ``h2h``; PyTorch's GRU
    resets before the recurrent product's bias as MXNet's (and cuDNN's) does."""
    o = options

    class WordLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(o["dropout"])
            self.encoder = nn.Embedding(o["vocab"], o["embed"])
            layer = {"lstm": nn.LSTM, "gru": nn.GRU}[mode]
            self.rnn = layer(o["embed"], o["hidden"], o["layers"], dropout=o["dropout"], batch_first=True)
            self.decoder = nn.Linear(o["hidden"], o["vocab"])
            if o["tied"]:
                self.decoder.weight = self.encoder.weight

        def forward(self, tokens):
            seq, _ = self.rnn(self.drop(self.encoder(tokens)))
            return self.decoder(self.drop(seq))

    return WordLanguageModel()


class _EncoderBlock(nn.Module):
    """:class:`mxfp16.models.sequence.EncoderBlock`: post-LayerNorm attention and GELU feed-forward, dropout on the
    attention weights and on both residual branches (``nn.TransformerEncoderLayer`` adds a dropout inside the
    feed-forward, which the MXNet block does not have)."""

    def __init__(self, units, heads, ffn_units, dropout):
        super().__init__()
        self.attention = nn.MultiheadAttention(units, heads, dropout=dropout, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(units), nn.LayerNorm(units)
        self.ffn1, self.ffn2 = nn.Linear(units, ffn_units), nn.Linear(ffn_units, units)
        self.gelu, self.drop = nn.GELU(), nn.Dropout(dropout)

    def forward(self, x):
        attended, _ = self.attention(x, x, x, need_weights=False)
        x = self.norm1(x + self.drop(attended))
        return self.norm2(x + self.drop(self.ffn2(self.gelu(self.ffn1(x)))))


def bert_encoder_classifier(options):
    """Word and position embeddings, LayerNorm, dropout, encoder blocks, ``tanh`` pooler on the first token,
    classifier."""
    o = options

    class BertEncoderClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embed = nn.Embedding(o["vocab"], o["units"])
            self.position_embed = nn.Embedding(o["max_length"], o["units"])
            self.embed_norm, self.embed_drop = nn.LayerNorm(o["units"]), nn.Dropout(o["dropout"])
            self.blocks = nn.Sequential(*[_EncoderBlock(o["units"], o["heads"], o["ffn"], o["dropout"])
                                          for _ in range(o["layers"])])
            self.pooler, self.output = nn.Linear(o["units"], o["units"]), nn.Linear(o["units"], o["classes"])

        def forward(self, tokens):
            positions = self.position_embed(torch.arange(tokens.shape[1], device=tokens.device))
            x = self.blocks(self.embed_drop(self.embed_norm(self.word_embed(tokens) + positions)))
            return self.output(torch.tanh(self.pooler(x[:, 0])))

    return BertEncoderClassifier()


def _conv_bn(cin, cout, kernel=1, stride=1, groups=1, relu6=True):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6(inplace=True)] if relu6 else layers


class _LinearBottleneck(nn.Module):
    """GluonCV's ``LinearBottleneck``: 1x1 expansion (none when ``t == 1``), 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, cin, cout, t, stride):
        super().__init__()
        wide = cin * t
        expand = _conv_bn(cin, wide) if t != 1 else []
        self.out = nn.Sequential(*expand, *_conv_bn(wide, wide, 3, stride, groups=wide),
                                 *_conv_bn(wide, cout, relu6=False))
        self.shortcut = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.out(x) if self.shortcut else self.out(x)


def mobilenet_v2(classes):
    """GluonCV's ``mobilenetv2_1.0``: a 3x3 stem of 32, 17 bottlenecks, 1x1 to 1280, global pooling, then a
    1x1 convolution without bias to the classes (GluonCV's head, where torchvision has dropout and a Linear)."""
    cins = [32, 16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160]
    couts = cins[1:] + [320]
    strides = [1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1]
    blocks = [_LinearBottleneck(i, o, 1 if n == 0 else 6, s) for n, (i, o, s) in enumerate(zip(cins, couts, strides))]
    return nn.Sequential(*_conv_bn(3, 32, 3, 2), *blocks, *_conv_bn(320, 1280), nn.AdaptiveAvgPool2d(1),
                         nn.Conv2d(1280, classes, 1, bias=False), nn.Flatten())


def dcgan_generator(nz, ngf):
    """``ConvTranspose2d`` 4x4 + BatchNorm + ReLU from ``(nz, 1, 1)`` to ``8*ngf`` at 4x4, doubling to 32x32, then
    to 3 channels at 64x64 with ``tanh``."""
    layers, cin = [], nz
    for i, width in enumerate((ngf * 8, ngf * 4, ngf * 2, ngf)):
        stride, pad = (1, 0) if i == 0 else (2, 1)
        layers += [nn.ConvTranspose2d(cin, width, 4, stride, pad, bias=False), nn.BatchNorm2d(width), nn.ReLU(True)]
        cin = width
    return nn.Sequential(*layers, nn.ConvTranspose2d(cin, 3, 4, 2, 1, bias=False), nn.Tanh())


def dcgan_discriminator(ndf):
    """``Conv2d`` 4x4 stride 2 + LeakyReLU 0.2 (BatchNorm from the second) down to 4x4, then to two scores."""
    layers, cin = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)], ndf
    for width in (ndf * 2, ndf * 4, ndf * 8):
        layers += [nn.Conv2d(cin, width, 4, 2, 1, bias=False), nn.BatchNorm2d(width), nn.LeakyReLU(0.2, True)]
        cin = width
    return nn.Sequential(*layers, nn.Conv2d(cin, 2, 4, 1, 0, bias=False), nn.Flatten())


def build_networks(name, options):
    """A family's PyTorch networks: ``{"net": module}``, or the GAN's ``{"generator", "discriminator"}``."""
    if name.startswith("word-lm-"):
        return {"net": word_language_model(name.rsplit("-", 1)[1], options)}
    if name == "bert-encoder":
        return {"net": bert_encoder_classifier(options)}
    if name == "dcgan":
        return {"generator": dcgan_generator(options["nz"], options["ngf"]),
                "discriminator": dcgan_discriminator(options["ndf"])}
    raise ValueError(f"{name!r} is not a benchmark family: {', '.join(FAMILIES)}")


def optimizer(name, params, settings):
    """The PyTorch optimizer of an MXNet optimizer name and its settings (``learning_rate``, ``momentum``, ``wd``,
    ``beta1``)."""
    lr, wd = settings["learning_rate"], settings.get("wd", 0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=settings.get("momentum", 0.0), weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(settings.get("beta1", 0.9), 0.999), weight_decay=wd)
    raise ValueError(f"no PyTorch optimizer for {name!r}")


def family_step(name, options, batch_size, bfloat16, compiled, channels_last=False, seed=0):
    """The family's PyTorch training step: ``step()`` trains once and returns the (last) loss, detached.

    Parameters
    ----------
    name, options : str, dict
        A family name and its resolved sizes.
    batch_size, seed : int
    bfloat16 : bool
        Forward passes under ``torch.autocast('cpu', dtype=torch.bfloat16)``.
    compiled : bool
        Each network through ``torch.compile`` (inductor): its first calls compile.
    channels_last : bool
        The GAN's networks and images in ``channels_last`` memory layout.
    """
    fam = FAMILIES[name]
    nets = build_networks(name, options)
    generator = torch.Generator().manual_seed(seed)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    for net in nets.values():
        net.to(memory_format=layout).train()
    runs = {key: torch.compile(net) if compiled else net for key, net in nets.items()}

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16)

    if fam.unit == TOKENS:
        return _token_step(fam, options, batch_size, nets, runs, autocast, generator)
    return _gan_step(fam, options, batch_size, nets, runs, autocast, generator, layout)


def _token_step(fam, options, batch_size, nets, runs, autocast, generator):
    """A token family's step: next-word prediction, or (bert-encoder) one label per sequence."""
    (net,), (run,) = nets.values(), runs.values()
    stream = torch.randint(0, options["vocab"], (batch_size, options["seq_len"] + 1), generator=generator)
    tokens = stream[:, :-1].contiguous()
    labels = (torch.randint(0, options["classes"], (batch_size,), generator=generator) if fam.name == "bert-encoder"
              else stream[:, 1:].reshape(-1))
    opt = optimizer(fam.optimizer, net.parameters(), fam.optimizer_params)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            scores = run(tokens)
        loss = F.cross_entropy(scores.float().reshape(-1, scores.shape[-1]), labels)
        loss.backward()
        if fam.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), fam.clip_grad_norm)
        opt.step()
        return loss.detach()
    return step


def _gan_step(fam, options, batch_size, nets, runs, autocast, generator, layout):
    """One GAN iteration: the discriminator on a real and a generated batch, then the generator."""
    g, d = runs["generator"], runs["discriminator"]
    opt_g = optimizer(fam.optimizer, nets["generator"].parameters(), fam.optimizer_params)
    opt_d = optimizer(fam.optimizer, nets["discriminator"].parameters(), fam.optimizer_params)
    real = (torch.rand((batch_size, 3, 64, 64), generator=generator) * 2 - 1).contiguous(memory_format=layout)
    ones, zeros = torch.ones(batch_size, dtype=torch.long), torch.zeros(batch_size, dtype=torch.long)

    def step():
        noise = torch.randn((batch_size, options["nz"], 1, 1), generator=generator)
        opt_d.zero_grad(set_to_none=True)
        with autocast():
            fake = g(noise)
            scores_real, scores_fake = d(real), d(fake.detach())
        loss_d = F.cross_entropy(scores_real.float(), ones) + F.cross_entropy(scores_fake.float(), zeros)
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad(set_to_none=True)
        with autocast():
            scores = d(fake)
        loss_g = F.cross_entropy(scores.float(), ones)
        loss_g.backward()
        opt_g.step()
        return loss_g.detach()
    return step
