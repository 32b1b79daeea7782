"""MkDocs hook: write the command-line reference from the argparse parsers.

``docs/cli.md`` holds the prose and the marker ``<!-- mxfp16-cli -->``; this
hook replaces the marker with one section per subcommand, built from the same
parser ``mxfp16`` itself uses, so the page cannot drift from the code. A new
subcommand module appears on the page without anyone editing it.
"""
import argparse
import os

MARKER = "<!-- mxfp16-cli -->"
# argparse wraps help text to the terminal width; fix it so builds are reproducible.
HELP_WIDTH = 90


def _subcommands(parser):
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _help_text(parser):
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)
    try:
        return parser.format_help().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def reference_markdown():
    """The generated part of the page: ``mxfp16 --help`` and one section per subcommand."""
    from mxfp16.cli import build_parser

    parser = build_parser()
    parts = ["## mxfp16", "", "```text", _help_text(parser), "```", ""]
    _sections(parser, "mxfp16", 2, parts)
    return "\n".join(parts)


def _sections(parser, prefix, level, parts):
    """One section per subcommand, recursing into nested ones (``mxfp16 data fetch``)."""
    for name, summary, sub in _subcommands(parser):
        parts += [f"{'#' * level} {prefix} {name}", ""]
        if summary:
            parts += [summary[0].upper() + summary[1:] + ".", ""]
        parts += ["```text", _help_text(sub), "```", ""]
        _sections(sub, f"{prefix} {name}", min(level + 1, 4), parts)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, reference_markdown())
    return markdown
