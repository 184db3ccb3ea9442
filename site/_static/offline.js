// Sphinx's search lists its results from searchindex.js (loaded as a script, so it works from disk),
// then fetch()es each result's page for the text snippet under it. Browsers refuse fetch() on file://
// pages, so there the snippets are left out instead of failing one request per result; served over
// http (`python -m attnkit.classroom.site --serve`) the results have their snippets.
// (documentation_options.js declares DOCUMENTATION_OPTIONS with const: a global, not a window property.)
if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
}
