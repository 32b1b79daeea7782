"""The release tools in ``tools/gpu/`` (not part of the installed package), imported for their tests.

They run as scripts (``python tools/gpu/check.py``), which puts their folder
on ``sys.path`` so they import each other by name; this does the same.
"""
import importlib
import os
import sys

FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "gpu")
if FOLDER not in sys.path:
    sys.path.insert(0, FOLDER)

fatbin = importlib.import_module("fatbin")
driver_standin = importlib.import_module("driver_standin")
check = importlib.import_module("check")
