"""One diagnosis: the measured statistics, the loss scale asked about, the recommendation."""
from dataclasses import dataclass

from .collect import gradient_ranges
from .recommend import DEFAULT_MARGIN, recommend_loss_scale
from .stats import log2_of_scale, total

__all__ = ["Diagnosis", "diagnose"]


@dataclass
class Diagnosis:
    """Everything the reports show.

    Attributes
    ----------
    stats : list of RangeStats
        One per parameter gradient and per layer's activation gradient.
    loss_scale : float
        The scale the user asked about (a power of two).
    recommendation : Recommendation
    forward : ForwardCheck or None
        The float16 forward check, when it ran.
    forward_skipped : str or None
        Why the forward check did not run.
    """

    stats: list
    loss_scale: float
    recommendation: object
    forward: object = None
    forward_skipped: str = None

    def of_kind(self, kind):
        return [s for s in self.stats if s.kind == kind]

    @property
    def totals(self):
        """``{'all': RangeStats, 'parameter': ..., 'activation': ...}`` (a kind is left out when absent)."""
        result = {"all": total(self.stats, "all gradients")}
        for kind, label in (("parameter", "parameter gradients"), ("activation", "activation gradients")):
            if self.of_kind(kind):
                result[kind] = total(self.of_kind(kind), label)
        return result

    @property
    def largest(self):
        """The :class:`RangeStats` holding the largest gradient: the one that limits the loss scale."""
        return max(self.stats, key=lambda s: s.max_abs)

    def worst_first(self):
        """The statistics sorted by underflow at :attr:`loss_scale`, worst first; ties by underflow at scale 1."""
        def key(stats):
            return (-stats.fractions_at(self.loss_scale)["underflow"], -stats.fractions_at(1.0)["underflow"],
                    -stats.nonzero)
        return sorted(self.stats, key=key)


def diagnose(net, loss_fn, batches, ctx=None, loss_scale=1.0, margin=DEFAULT_MARGIN, activations=True,
             max_scale=2.0 ** 24):
    """Measure gradient ranges on ``batches`` and recommend a loss scale.

    Parameters
    ----------
    net, loss_fn, batches, ctx, activations
        As for :func:`mxfp16.diagnostics.gradient_ranges`.
    loss_scale : float
        A power of two to report underflow and overflow at (besides 1 and the recommendation).
    margin, max_scale
        As for :func:`mxfp16.diagnostics.recommend_loss_scale`.

    Returns
    -------
    Diagnosis
        Without a forward check (see :func:`mxfp16.diagnostics.forward_check`).
    """
    log2_of_scale(loss_scale)  # fail before the work, not after
    stats = gradient_ranges(net, loss_fn, batches, ctx=ctx, activations=activations).stats
    if not stats:
        raise ValueError("no batches were given, so there are no gradients to diagnose")
    recommendation = recommend_loss_scale(total(stats), margin=margin, max_scale=max_scale)
    return Diagnosis(stats=stats, loss_scale=float(loss_scale), recommendation=recommendation)
