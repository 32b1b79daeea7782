"""The benchmark's own model registry: the families whose input is not a classifier's image.

``mxfp16 bench --model NAME`` takes a model-zoo name or one of :data:`FAMILIES`, whose input is token ids or noise.
The MXNet step (:mod:`mxfp16.bench.family_steps`) and the PyTorch peer (:mod:`mxfp16.bench.peer_families`) both read
them here; importing this module imports neither framework.

The word language models read Penn Treebank's 10,000 words, the corpus the 650-unit configuration comes from
(Zaremba et al., 2014), not the 1.9.1 example's WikiText-2 (33,278 words), whose decoder would be three quarters of
the step's arithmetic and bury the recurrent layers; with 10,000 words the two are about equal. ``dcgan`` is timed as
one GAN iteration (the discriminator's update on a real and a generated batch, then the generator's): the unit a GAN
user waits for; either network alone leaves out the other's half of the work.
"""
from dataclasses import dataclass

__all__ = ["Family", "FAMILIES", "family", "resolve_options", "record_fields", "throughput_fields", "FamilyError",
           "TOKENS", "IMAGES"]

#: What a family's throughput counts.
TOKENS, IMAGES = "tokens", "images"


class FamilyError(ValueError):
    """A model option a family does not have, or a value it cannot take; the message names the fix."""


@dataclass(frozen=True)
class Family:
    """One benchmark family.

    Attributes
    ----------
    name, title : str
        The ``--model`` name; what is trained, as the report says it.
    unit : str
        :data:`TOKENS` (batch x ``seq_len`` per step) or :data:`IMAGES` (the batch's images per step).
    batch_size : int
        The batch its example trains with (``--batch-sizes`` by default).
    options : dict
        Every size the layers take, with its documented value (``unfused_bf16`` and ``bf16_deconv``: see
        :func:`mxfp16.bench.family_steps.family_step`).
    optimizer, optimizer_params
        An MXNet optimizer name (the peer uses the same algorithm) and its settings in MXNet's names.
    clip_grad_norm : float or None
        The global gradient norm the step clips to.
    image_size : int or None
        The side of its images, fixed by the layers; ``None`` for token input.
    """

    name: str
    title: str
    unit: str
    batch_size: int
    options: dict
    optimizer: str
    optimizer_params: dict
    clip_grad_norm: float = None
    image_size: int = None


def _language_model(mode):
    return Family(
        name=f"word-lm-{mode}",
        title=f"word language model (MXNet's example/gluon/word_language_model): embedding, 2-layer {mode.upper()} "
              "650, tied decoder, dropout 0.5, 35-step segments, 10,000 words",
        unit=TOKENS, batch_size=32,
        options={"vocab": 10000, "embed": 650, "hidden": 650, "layers": 2, "seq_len": 35, "dropout": 0.5, "tied": 1,
                 "unfused_bf16": 0},
        optimizer="sgd", optimizer_params={"learning_rate": 20.0, "momentum": 0.0, "wd": 0.0}, clip_grad_norm=0.25)


FAMILIES = {f.name: f for f in (
    _language_model("lstm"),
    _language_model("gru"),
    Family(name="bert-encoder",
           title="BERT-base-sized encoder: word and position embeddings, 2 post-LayerNorm blocks (768 units, 12 "
                 "heads, GELU feed-forward 3072), pooler, 2 classes; 128 tokens",
           unit=TOKENS, batch_size=8,
           options={"vocab": 30522, "units": 768, "heads": 12, "ffn": 3072, "layers": 2, "seq_len": 128,
                    "max_length": 512, "classes": 2, "dropout": 0.1},
           optimizer="adam", optimizer_params={"learning_rate": 1e-4, "wd": 0.0}),
    Family(name="dcgan",
           title="DCGAN (MXNet's example/gluon/dc_gan), 64 px: one iteration, the discriminator's update on a real "
                 "and a generated batch, then the generator's",
           unit=IMAGES, batch_size=64, image_size=64,
           options={"nz": 100, "ngf": 64, "ndf": 64, "bf16_deconv": 0},
           optimizer="adam", optimizer_params={"learning_rate": 2e-4, "beta1": 0.5, "wd": 0.0}),
)}


def family(name):
    """The :class:`Family` called ``name``, or ``None`` for a model-zoo name."""
    return FAMILIES.get(name)


def resolve_options(name, given=None):
    """A family's sizes: its documented ones with ``given`` put over them.

    Parameters
    ----------
    name : str
        A family name.
    given : dict or sequence of str, optional
        ``{"hidden": 16}``, or ``["hidden=16", ...]`` as ``--model-option`` gives them.

    Returns
    -------
    dict
        Every option, each of its default's type.

    Raises
    ------
    FamilyError
        An unknown family or option, or a value out of its range.
    """
    if (fam := FAMILIES.get(name)) is None:
        raise FamilyError(f"--model-option applies to {', '.join(FAMILIES)}, not {name!r}")
    options = dict(fam.options)
    for key, text in _pairs(given):
        if key not in options:
            raise FamilyError(f"{name} has no option {key!r}; its options are "
                              f"{', '.join(f'{k}={v}' for k, v in fam.options.items())}")
        kind = type(fam.options[key])
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise FamilyError(f"--model-option {key}={text}: {key} takes {'an integer' if kind is int else 'a number'}"
                              f", e.g. {key}={fam.options[key]}") from None
        allowed = {"dropout": ("a probability in [0, 1)", 0 <= value < 1), "tied": ("0 or 1", value in (0, 1)),
                   "unfused_bf16": ("0 or 1", value in (0, 1)), "bf16_deconv": ("0 or 1", value in (0, 1))}
        words, ok = allowed.get(key, ("at least 1", value >= 1))
        if not ok:
            raise FamilyError(f"--model-option {key}={text}: {words}, e.g. {key}={fam.options[key]}")
        options[key] = value
    return options


def _pairs(given):
    if not given:
        return []
    if isinstance(given, dict):
        return list(given.items())
    pairs = []
    for item in given:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip() or not value.strip():
            raise FamilyError(f"--model-option {item!r} is not KEY=VALUE; e.g. --model-option hidden=16")
        pairs.append((key.strip(), value.strip()))
    return pairs


def record_fields(model, options):
    """What a result record of ``model`` says about its family: ``{}`` for an image model, else ``unit``,
    ``options``, ``network`` (the family's title) and, for token input, ``seq_len``."""
    if (fam := FAMILIES.get(model)) is None:
        return {}
    fields = {"unit": fam.unit, "options": dict(options), "network": fam.title}
    return dict(fields, seq_len=options["seq_len"]) if fam.unit == TOKENS else fields


def throughput_fields(model, batch_size, options, seconds_per_step):
    """A result record's throughput: ``images_per_second``, or for a token family ``tokens_per_second``
    (batch x ``seq_len`` per step) with ``images_per_second`` ``None``."""
    fam = FAMILIES.get(model)
    if fam is None or fam.unit == IMAGES:
        return {"images_per_second": batch_size / seconds_per_step}
    return {"images_per_second": None, "tokens_per_second": batch_size * options["seq_len"] / seconds_per_step}
