"""Thin command-line front ends; each module registers one ``mxfp16`` subcommand."""
