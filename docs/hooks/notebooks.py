"""MkDocs hook: publish the tutorial notebooks from ``notebooks/`` without copying them.

The notebooks live at the top of the repository (where readers and the tests
find them), outside ``docs_dir``. This hook adds each one to the site as
``notebooks/<name>.ipynb``; mkdocs-jupyter then renders it with the outputs
it was saved with. It runs before mkdocs-jupyter's own ``on_files``.
"""
import os
import re

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

NOTEBOOK_DIR = "notebooks"


@event_priority(100)
def on_files(files, config):
    root = os.path.dirname(config["config_file_path"])
    folder = os.path.join(root, NOTEBOOK_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if name.endswith(".ipynb"):
            files.append(File(f"{NOTEBOOK_DIR}/{name}", src_dir=root, dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    """Point the pages' links to ``../notebooks/<name>.ipynb`` at the site's copy.

    The pages link the notebooks where they are in the repository
    (``docs/../notebooks/``), so the links also work when the Markdown is read on a
    repository browser; on the site the notebooks sit at ``notebooks/`` inside the
    site, one level less up.
    """
    depth = page.file.src_uri.count("/")
    return markdown.replace("](" + "../" * (depth + 1) + f"{NOTEBOOK_DIR}/", "](" + "../" * depth + f"{NOTEBOOK_DIR}/")


_DOCS_LINK = re.compile(r'href="\.\./docs/([\w\-]+\.md)(#[^"]*)?"')


def on_page_content(html, page, config, files):
    """Point a notebook's links to ``../docs/<page>.md`` at that page on the site.

    A notebook links the docs where they are in the repository
    (``notebooks/../docs/``), so the links work in Jupyter and on a
    repository browser; mkdocs-jupyter renders the notebook's Markdown itself
    and leaves the links as written, which on the site point under
    ``notebooks/``. A link to a page the site does not have is left alone
    (the strict build and the link test report it).
    """
    if not page.file.src_uri.startswith(NOTEBOOK_DIR + "/"):
        return html

    def site_link(match):
        target = files.get_file_from_path(match.group(1))
        if target is None:
            return match.group(0)
        return f'href="{target.url_relative_to(page.file)}{match.group(2) or ""}"'

    return _DOCS_LINK.sub(site_link, html)
