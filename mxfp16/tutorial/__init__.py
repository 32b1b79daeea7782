"""What the tutorial notebooks share: running an ``mxfp16`` command in its own process, and the recorded results.

:mod:`~mxfp16.tutorial.commands` runs a command as a user would type it
(:func:`mxfp16_command`); :mod:`~mxfp16.tutorial.records` reads the results
recorded under ``docs/results`` to print beside a live figure. The spirals data
the float16 notebooks train on is :func:`mxfp16.data.spirals.spirals`.
"""
from .commands import CommandResult, mxfp16_command
from .records import RecordedRatio, recorded_headline_ratios, recorded_result, recorded_results_folder

__all__ = ["CommandResult", "mxfp16_command", "RecordedRatio", "recorded_headline_ratios", "recorded_result",
           "recorded_results_folder"]
