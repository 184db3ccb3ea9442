// Loaded on pages with widgets, after RequireJS and before the html-manager bundle (order: WIDGET_JS in
// attnkit/classroom/site.py). Its data-html-manager attribute names the bundle's folder under _static.
(function () {
  var script = document.currentScript;
  var base = script.src.slice(0, script.src.lastIndexOf("/") + 1);
  // The bundle looks for its font files beside the AMD module "@jupyter-widgets/html-manager/dist/...";
  // without this mapping RequireJS places that module in the page's own folder.
  require.config({paths: {"@jupyter-widgets/html-manager/dist": base + script.dataset.htmlManager}});
  // ipywidgets 8 typesets widget labels through MathJax 2's MathJax.Hub.Queue, which MathJax 3 (the
  // site's) does not have: the same job is passed to MathJax 3's typesetPromise. Widgets render on the
  // window's load event, after this listener and after MathJax (a deferred script) has started.
  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (mj && !mj.Hub && mj.typesetPromise) {
      mj.Hub = {Queue: function (job) { return mj.typesetPromise([job[2]]); }};
    }
  });
})();
