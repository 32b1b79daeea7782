"""MkDocs hook: publish the tutorial notebooks from ``notebooks/`` without copying them.

The notebooks live at the top of the repository (where readers and the tests
find them), outside ``docs_dir``. This hook adds each one to the site as
``notebooks/<name>.ipynb``; mkdocs-jupyter then renders it with the outputs
it was saved with. It runs before mkdocs-jupyter's own ``on_files``.
"""
import os

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
