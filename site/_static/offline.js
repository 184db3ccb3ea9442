// Sphinx's search lists its results from searchindex.js (loaded as a script, so it works from disk),
// then fetch()es each result's page for the text snippet under it. Browsers refuse fetch() on file://
// pages: there, a request for a page of this site is answered from _static/search_text.js (every page's
// text, written after the build by attnkit.classroom.site.search_text), loaded once, when first needed.
// Any other request goes to the browser's fetch. Served over http, nothing here changes anything.
// (documentation_options.js declares DOCUMENTATION_OPTIONS with const: a global, not a window property.)
(function () {
  if (window.location.protocol !== "file:" || typeof DOCUMENTATION_OPTIONS === "undefined") return;
  var root = new URL(document.documentElement.dataset.content_root || "./", window.location.href).href;
  var texts = null;
  function load() {
    if (!texts) {
      texts = new Promise(function (resolve) {
        var script = document.createElement("script");
        script.src = root + "_static/search_text.js";
        script.onload = function () { resolve(window.ATTNKIT_SEARCH_TEXT || {}); };
        script.onerror = function () { resolve({}); };       // no snippets, as without this file
        document.head.appendChild(script);
      });
    }
    return texts;
  }
  var browserFetch = window.fetch.bind(window);
  window.fetch = function (resource, options) {
    var url = new URL(typeof resource === "string" ? resource : resource.url, window.location.href);
    url.hash = "";
    url.search = "";
    if (url.href.startsWith(root) && url.href.endsWith(".html")) {
      var page = decodeURIComponent(url.href.slice(root.length, -".html".length));
      return load().then(function (all) { return new Response(all[page] || ""); });
    }
    return browserFetch(resource, options);
  };
})();
