"""Sphinx settings for the course website (`make site`; see attnkit/classroom/site.py).

The notebooks are rendered from their stored outputs: nothing is executed while the site is built.
"""
from attnkit.classroom.course import BRANCH, REPO_URL
from attnkit.classroom.site import WIDGET_JS, search_text, vendor

project = "Attention kernels, from a 4×4 example to paged decoding"
author = "the course's authors"
# MathJax is served from the site itself (sphinx-mathjax-offline), so formulas render offline.
extensions = ["myst_nb", "sphinx-mathjax-offline"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# Everything a page loads is served by the site itself (see attnkit/classroom/site.py): _static/ here
# (offline.js) and the vendored widget renderer and RequireJS (site/_vendor, fetched when missing).
html_static_path = ["_static", str(vendor())]
html_js_files = ["offline.js"]
nb_ipywidgets_js = WIDGET_JS

# Stored outputs only: the site never runs a notebook.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
# Notebooks start at "# Title" and may skip heading levels inside cells; neither is a broken page.
suppress_warnings = ["myst.header"]

html_theme = "sphinx_book_theme"
html_title = "Attention kernels"
html_theme_options = {
    "repository_url": REPO_URL,
    "repository_branch": BRANCH,
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "path_to_docs": "",
    "show_toc_level": 2,
    # One search box: the primary sidebar has sphinx-book-theme's search field; the header's copy
    # (pydata-sphinx-theme's navbar_persistent default) is left out. Narrow screens keep the header's
    # search icon, shown only when the sidebar is hidden.
    "navbar_persistent": [],
}
html_last_updated_fmt = None


def setup(app):
    # Every page's text for search snippets read from disk (site/_static/offline.js).
    app.connect("build-finished", lambda app, exc: exc is None and app.builder.format == "html"
                and search_text(app.outdir))
